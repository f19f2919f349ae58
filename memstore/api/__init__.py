"""The HTTP API (FastAPI). The only layer that turns memstore's errors into HTTP answers."""
