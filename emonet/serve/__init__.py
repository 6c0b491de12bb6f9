"""The live service (``emonet-serve``): HTTP and WebSocket over one dynamic batcher, and a browser page.

Needs the ``serve`` extra (``pip install "emonet[serve]"``: FastAPI, uvicorn, prometheus-client).
"""
from .batcher import Batcher, StreamState

__all__ = ["Batcher", "StreamState"]
