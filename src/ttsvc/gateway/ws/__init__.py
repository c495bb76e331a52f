"""The streaming WebSocket: text in as it is written, audio and word times out."""
