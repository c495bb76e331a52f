"""`ttsvc compile`: split a VITS voice graph, optimize it for a backend, publish an engine set."""
