"""The live service (``emonet-serve``): HTTP and WebSocket over the video runtime's live loop, and a browser page.

Needs the ``serve`` extra (``pip install "emonet[serve]"``: FastAPI, uvicorn, prometheus-client).
"""

# The live loop's max_age for streams (--max-age-ms): a stream's frame this old (s) when its turn comes is answered
# dropped, so an overloaded loop answers fresh frames, and late ones at once. 30 ms held 64 streams of 30 frames/s
# to a p99 of 90 ms where 50 ms let them wait 140 ms (dropping 8 % against 2.5 %); 32 streams lost no frame either
# way (measured: see docs/PERFORMANCE.md, The service).
STREAM_MAX_AGE = 0.03
