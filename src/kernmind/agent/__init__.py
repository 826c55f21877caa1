"""The bundled agent loop (see agent/loop.py)."""
