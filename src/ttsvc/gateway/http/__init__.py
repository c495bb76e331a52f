"""The HTTP edge: routes, request bodies, error answers, limits and connections, and the
dialects spoken over HTTP (OpenAI's speech and SSE, the timestamped route)."""
