"""The HTTP gateway: FastAPI app, admission, streaming responses, health, drain."""
