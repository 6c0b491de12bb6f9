"""The live service (``emonet-serve``): HTTP and WebSocket over the video runtime's live loop, and a browser page.

Needs the ``serve`` extra (``pip install "emonet[serve]"``: FastAPI, uvicorn, prometheus-client).
"""
