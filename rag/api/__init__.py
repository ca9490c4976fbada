"""The HTTP API (FastAPI). Nothing below this package imports FastAPI."""
