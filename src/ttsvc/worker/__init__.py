"""Worker process: one engine set, one compute thread, many multiplexed streams."""
