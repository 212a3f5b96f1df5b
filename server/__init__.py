"""Tolk\x27s HTTP service: FastAPI app, continuous-batching scheduler, streaming, metrics."""
