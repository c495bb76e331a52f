"""Worker pool: spawn, READY handshake, heartbeats, respawn; per-request mailboxes."""
