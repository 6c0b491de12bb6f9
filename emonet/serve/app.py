"""The HTTP and WebSocket service: ``create_app(pipeline, config)`` gives a FastAPI app.

- ``GET /health``: 200 and what it runs (it answers once the model is loaded: the app is made after);
- ``POST /v1/analyze``: a multipart field ``image`` (JPEG or PNG) -> ``{"faces": [...]}``, each face as the
  photo tool's JSON has it;
- ``WS /v1/stream``: encoded frames in (one binary message each), one JSON message out per frame, in order:
  its faces, tracked and smoothed as ``emonet-video`` does, or ``"dropped": true`` when newer frames of the
  stream pushed it out before its turn; with the first frame's latency against the steady state;
- ``GET /metrics``: Prometheus text (requests, streams, frames by outcome, step sizes, latencies);
- ``GET /``: the browser page (webcam -> stream -> drawn results).

Every stream, and every analyze request, is a session of a :class:`~emonet.video.live.LiveLoop`: the video
runtime's scheduler, stepping every session that has frames on one GPU loop, which runs in a process of its own
(:class:`~emonet.serve.loop_process.LoopProcess`) so that this server's event loop never waits for its
interpreter; on a GPU two such loops share the sessions (:class:`~emonet.serve.pool.LoopPool`), each session
wholly in one. Nothing is kept between requests, and a stream's state lives with its connection, so replicas scale
behind any load balancer.
"""
from __future__ import annotations

import asyncio
import bisect
import io
import time
from collections import deque
from contextlib import asynccontextmanager
from urllib.parse import urlsplit
from dataclasses import dataclass
from importlib import resources
from typing import Optional

import cv2
import numpy as np
from fastapi import FastAPI, File, HTTPException, Request, UploadFile, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from PIL import Image
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..video.live import FrameError, LiveConfig
from . import STREAM_MAX_AGE
from .loop_process import Answer, to_json
from .pool import LoopPool

# Frames of one stream read but not yet answered, at most: past them its socket is not read (the client's
# sends then wait), so a client that never reads its answers cannot make the server hold more.
ANSWERS_HELD = 64


# Streams a service takes at most when not told (--max-streams), what was measured at 30 frames/s a stream: each
# GPU loop STREAMS_PER_GPU_LOOP (on H100s two loops answered 32 streams with up to a few percent dropped, 64 with a
# quarter to a half dropped; one loop 32 streams from 0 to 9 % dropped, loan to loan); a CPU CPU_STREAMS (on two
# cores one stream is read at a few frames/s, and a second shares them). Figures: docs/PERFORMANCE.md.
STREAMS_PER_GPU_LOOP = 16
CPU_STREAMS = 2


@dataclass(frozen=True)
class ServeConfig:
    """What the service allows and how it batches."""

    max_streams: int = 2 * STREAMS_PER_GPU_LOOP  # streams open at once; the next is refused with a message
    max_image_bytes: int = 20 << 20       # an encoded image or frame, at most
    max_pixels: int = 40_000_000          # a decoded image, at most (a 40-megapixel photo)
    max_frame_pixels: int = 3840 * 2160   # a stream's frame, at most (4K): a stream holds several at once
    max_batch: int = 64                   # frames per GPU step (every stream's together)
    detect_every: int = 5                 # streams: the detector's period, in frames (as emonet-video's)
    smooth: bool = True                   # streams: temporal smoothing per face (spec §6)
    max_age: Optional[float] = STREAM_MAX_AGE  # streams, on a GPU: a frame this old (s) before its turn is dropped
    gpu_decode: bool = True               # JPEG frames decoded on the GPU where it can (nvJPEG)
    max_pending: int = 128                # analyze requests in flight at once; beyond, 503 "busy"
    idle_seconds: float = 60.0            # a stream that sends nothing this long is closed


def default_max_streams(gpu: bool, loops: int) -> int:
    """``--max-streams`` left out: STREAMS_PER_GPU_LOOP for each of ``loops`` on a GPU, CPU_STREAMS on a CPU."""
    return STREAMS_PER_GPU_LOOP * loops if gpu else CPU_STREAMS


def live_config(config: ServeConfig) -> LiveConfig:
    """How the service's live loop tracks and steps its streams."""
    return LiveConfig(detect_every=config.detect_every, smooth=config.smooth, max_frames=config.max_batch,
                      max_age=config.max_age)


class BadImage(ValueError):
    """An image the service cannot read: said to the client, never a crash; ``status`` is its HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_image(data: bytes, config: ServeConfig, pixels: Optional[int] = None) -> bool:
    """Whether JPEG or PNG bytes can be taken, from their header alone (nothing is decoded): True for a JPEG;
    :class:`BadImage` saying what is wrong (a small file of huge dimensions is refused here). ``pixels``: the
    most taken (default: ``config.max_pixels``)."""
    pixels = pixels or config.max_pixels
    if len(data) > config.max_image_bytes:
        raise BadImage(f"the image is {len(data)} bytes; at most {config.max_image_bytes} are taken (the server's "
                       f"--max-image-mb)", 413)
    if not (data.startswith(b"\xff\xd8\xff") or data.startswith(b"\x89PNG\r\n\x1a\n")):
        raise BadImage("not a JPEG or PNG image")
    try:
        with Image.open(io.BytesIO(data)) as header:  # reads the header only
            width, height = header.size
    except Image.DecompressionBombError:  # Pillow's own limit, far over ours: refused as ours would be
        raise BadImage(f"the image has far more than {pixels} pixels; at most {pixels} are taken", 413) from None
    except (OSError, SyntaxError, ValueError):
        raise BadImage("the image could not be decoded (truncated or corrupt)") from None
    if width * height > pixels:
        raise BadImage(f"the image is {width}x{height}; at most {pixels} pixels are taken", 413)
    return data.startswith(b"\xff\xd8\xff")


def decode_image(data: bytes) -> np.ndarray:
    """RGB ``(H, W, 3)`` uint8 of JPEG or PNG bytes :func:`check_image` took, decoded on the CPU;
    :class:`BadImage` when the data past the header is corrupt."""
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise BadImage("the image could not be decoded (truncated or corrupt)")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


class Metrics:
    """The service's figures, in a registry of its own (never the process-wide one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("emonet_requests", "HTTP analyze requests by outcome", ["status"], registry=r)
        self.streams = Gauge("emonet_streams_open", "WebSocket streams open now", registry=r)
        self.streams_refused = Counter("emonet_streams_refused", "streams refused: at the limit", registry=r)
        self.frames = Counter("emonet_stream_frames", "stream frames answered by outcome (ok, dropped: pushed out "
                              "by newer frames before their turn, bad, failed)", ["status"], registry=r)
        self.batch_images = Histogram("emonet_batch_images", "frames and images per step of an analysis loop",
                                      registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.batch_faces = Histogram("emonet_batch_faces", "faces (crops) per step of an analysis loop",
                                     registry=r, buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128))
        self.batch_seconds = Histogram("emonet_batch_seconds", "seconds per step of an analysis loop, from its "
                                       "start to its answers", registry=r,
                                       buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        self.latency = Histogram("emonet_latency_seconds", "seconds from reading a request or frame to sending its "
                                 "answer", ["endpoint"], registry=r,
                                 buckets=(.0025, .005, .01, .02, .03, .05, .1, .25, .5, 1, 2.5, 5))

        # Each stream frame counts under one of these: looked up once, not per frame.
        self.frame_outcomes = {status: self.frames.labels(status) for status in ("ok", "dropped", "bad", "failed")}
        self.stream_latency = self.latency.labels("stream")

    def watch(self, loop: LoopPool) -> None:
        """The pool's loops as gauges read at each scrape: how many still run, and the sessions open in each."""
        Gauge("emonet_loops_running", "analysis loops still running (of --loops)",
              registry=self.registry).set_function(lambda: loop.running)
        sessions = Gauge("emonet_loop_sessions", "sessions (streams and requests) open in each analysis loop",
                         ["loop"], registry=self.registry)
        for k in range(len(loop.loops)):
            sessions.labels(str(k)).set_function(lambda k=k: loop.sessions[k])

    def step(self, images: int, faces: int, seconds: float) -> None:
        """Record one GPU step (called by the live loop's thread)."""
        self.batch_images.observe(images)
        self.batch_faces.observe(faces)
        self.batch_seconds.observe(seconds)


def create_app(loop: LoopPool, config: ServeConfig = ServeConfig()) -> FastAPI:
    """The service over a started pool of GPU loops (made with :func:`live_config`; the app owns it from now and
    closes it when it stops)."""
    untrained = loop.about["untrained"]
    metrics = Metrics()
    metrics.watch(loop)
    loop.on_step = metrics.step
    jpeg = loop.about["jpeg_decoder"] == "nvjpeg"  # JPEG frames go as they are, decoded there on the GPU
    about = loop.about
    state = {"streams": 0, "pending": 0}
    # Decoding on the CPU takes memory (up to max_pixels x 3 bytes an image): a few at a time, whoever sends them.
    decoding = asyncio.Semaphore(4)

    async def prepare(data: bytes, pixels: Optional[int] = None):
        """What the loop takes of an upload: JPEG bytes as they are where the GPU decodes them (their header
        checked), else the RGB pixels decoded here."""
        if check_image(data, config, pixels) and jpeg:
            return data
        async with decoding:
            return await asyncio.to_thread(decode_image, data)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.stopped_at_once = False
        try:
            yield
        except asyncio.CancelledError:
            # A second Ctrl-C (or SIGTERM): the server stops at once and cancels this wait for its shutdown, which
            # is no failure; the loops are closed all the same.
            app.state.stopped_at_once = True
        finally:
            await asyncio.to_thread(loop.close)

    app = FastAPI(title="emonet", summary="EmoNet: expression, valence, arousal and landmarks of faces",
                  lifespan=lifespan)

    @app.middleware("http")
    async def bounded(request: Request, call_next):
        # The upload is refused by its declared length before it is read (multipart parsing would spool it).
        length = request.headers.get("content-length")
        analyze = request.url.path == "/v1/analyze" and request.method == "POST"
        if length is not None and length.isdigit() and int(length) > config.max_image_bytes + (64 << 10):
            metrics.requests.labels("413").inc()
            return JSONResponse({"detail": f"the request is {length} bytes; at most {config.max_image_bytes} "
                                           f"are taken for an image (the server's --max-image-mb)"}, status_code=413)
        if analyze and length is None:
            metrics.requests.labels("411").inc()
            return JSONResponse({"detail": "send the image with its Content-Length"}, status_code=411)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def wrong_form(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.requests.labels("422").inc()
        return JSONResponse({"detail": "send the image as the multipart form field 'image' (JPEG or PNG), as "
                                       "curl -F image=@photo.jpg does"}, status_code=422)

    @app.get("/health")
    async def health() -> JSONResponse:
        now = {"streams": state["streams"], "max_streams": config.max_streams, "sessions_per_loop": loop.sessions}
        if not loop.alive:  # a load balancer sends no more work here (the loops still running answer meanwhile)
            running = loop.running
            return JSONResponse({"status": "degraded" if running else "stopped", **about,
                                 "why": loop.failure or "the live loop has stopped", "loops": len(loop.loops),
                                 "loops_running": running, **now}, 503)
        return JSONResponse({"status": "ready", **about, **now})

    @app.post("/v1/analyze")
    async def analyze(image: UploadFile = File(...)) -> JSONResponse:
        t0 = time.perf_counter()
        if state["pending"] >= config.max_pending:
            metrics.requests.labels("503").inc()
            raise HTTPException(503, f"the server is busy ({config.max_pending} requests in hand); try again shortly")
        state["pending"] += 1
        session = loop.open(one_shot=True)
        try:
            data = await image.read(config.max_image_bytes + 1)
            try:
                payload = await prepare(data)
                result: Answer = await asyncio.wrap_future(loop.submit(session, payload))
            except RuntimeError as exc:  # the live loop has stopped (its process ended): nothing is read here now
                metrics.requests.labels("503").inc()
                raise HTTPException(503, f"the service cannot analyse images now: {exc}") from None
            except BadImage as exc:
                metrics.requests.labels(str(exc.status)).inc()
                raise HTTPException(exc.status, f"{image.filename or 'image'}: {exc}") from None
            except FrameError as exc:  # a JPEG whose header passed and whose data did not
                metrics.requests.labels("400").inc()
                raise HTTPException(400, f"{image.filename or 'image'}: {exc}") from None
        finally:
            loop.close_session(session)
            state["pending"] -= 1
        metrics.requests.labels("200").inc()
        metrics.latency.labels("analyze").observe(time.perf_counter() - t0)
        height, width = result.shape[:2]
        return Response(_with_faces({}, result.faces, {"width": width, "height": height, "untrained": untrained}),
                        media_type="application/json")

    @app.websocket("/v1/stream")
    async def stream(socket: WebSocket) -> None:
        origin = socket.headers.get("origin")
        if origin and urlsplit(origin).netloc != socket.headers.get("host"):
            # Another site's page in a browser on this machine: not this service's own page.
            await socket.close(code=1008, reason="cross-origin streams are refused")
            return
        await socket.accept()
        if state["streams"] >= config.max_streams:
            metrics.streams_refused.inc()
            await socket.send_json({"error": f"the server is at its limit of {config.max_streams} streams; "
                                             f"try again later"})
            await socket.close(code=1013, reason=f"at the limit of {config.max_streams} streams")
            return
        state["streams"] += 1
        metrics.streams.inc()
        session = loop.open()
        answers: asyncio.Queue = asyncio.Queue(ANSWERS_HELD)
        start = time.perf_counter()
        sender = asyncio.create_task(_send_answers(socket, answers, start, metrics, config.idle_seconds))
        index = 0
        try:
            while not sender.done():
                try:
                    message = await asyncio.wait_for(socket.receive(), config.idle_seconds)
                except asyncio.TimeoutError:
                    await answers.put(None)
                    await sender
                    await socket.close(code=1001, reason=f"nothing sent for {config.idle_seconds:g} s")
                    break
                if message["type"] == "websocket.disconnect":
                    break
                received = time.perf_counter()
                data = message.get("bytes")
                try:
                    if data is None:
                        raise BadImage("send each frame as one binary message (JPEG or PNG bytes)")
                    outcome = loop.submit(session, await prepare(data, config.max_frame_pixels), index, received)
                except (BadImage, RuntimeError) as exc:  # a bad frame; or the live loop has stopped: said, in order
                    outcome = exc
                try:  # a client that does not read its answers is not waited for longer than a silent one
                    await asyncio.wait_for(answers.put((index, received, outcome)), config.idle_seconds)
                except asyncio.TimeoutError:
                    await socket.close(code=1008, reason=f"answers unread for {config.idle_seconds:g} s")
                    break
                index += 1
                if isinstance(outcome, RuntimeError):  # its loop has ended: the client reconnects into a live one
                    await answers.put(None)
                    await sender
                    await socket.close(code=1011, reason="its analysis loop ended; reconnect")
                    break
        except WebSocketDisconnect:  # the client left mid-stream: its state goes with this call
            pass
        finally:
            loop.close_session(session)
            sender.cancel()
            if sender.done() and not sender.cancelled():
                sender.exception()  # a send to a client that has gone: nothing more to say
            state["streams"] -= 1
            metrics.streams.dec()

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    page = resources.files("emonet.serve").joinpath("static", "index.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    return app


STEADY_FRAMES = 300  # a stream's steady-state latency: the median over this many of its last frames answered


def _median(ordered: list) -> float:
    """The median of a sorted, non-empty list."""
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def _with_faces(head: dict, faces: Optional[str], tail: dict) -> str:
    """One JSON object: ``head``'s members, then ``"faces"`` (already JSON text) where given, then ``tail``'s."""
    parts = [to_json(head)[1:-1] if head else "", f'"faces":{faces}' if faces is not None else "",
             to_json(tail)[1:-1] if tail else ""]
    return "{" + ",".join(p for p in parts if p) + "}"


async def _send_answers(socket: WebSocket, answers: asyncio.Queue, start: float, metrics: Metrics,
                        timeout: float) -> None:
    """A stream's answers, in its frames' order, each once its frame is read (or dropped, or refused); the
    latencies from reading a frame to sending its answer, the first against the steady state."""
    # The steady state: the median of the last 300 frames answered, kept sorted as they come and go (a reply
    # each frame; sorting 300 values for each would be most of this loop's work).
    first, recent, ordered = None, deque(), []
    outcomes = metrics.frame_outcomes
    while (item := await answers.get()) is not None:
        index, received, outcome = item
        reply: dict = {"frame": index, "timestamp": round(received - start, 6)}
        faces: Optional[str] = None  # the faces' JSON, made in the loop's process
        if isinstance(outcome, BadImage):
            reply["error"] = str(outcome)
            outcomes["bad"].inc()
        elif isinstance(outcome, Exception):
            reply["error"] = f"the analysis failed: {outcome}"
            outcomes["failed"].inc()
        else:
            try:
                result: Answer = await asyncio.wrap_future(outcome)
            except FrameError as exc:
                reply["error"] = str(exc)
                outcomes["bad"].inc()
            except Exception as exc:  # noqa: BLE001 - the analysis failed for this frame: said, and on
                reply["error"] = f"the analysis failed: {type(exc).__name__}: {exc}"
                outcomes["failed"].inc()
            else:
                if result.dropped:
                    reply["dropped"] = True
                    outcomes["dropped"].inc()
                else:
                    faces = result.faces
                    outcomes["ok"].inc()
        tail: dict = {}
        if faces is not None:
            tail.update(width=result.shape[1], height=result.shape[0])
        if "dropped" not in reply:
            latency = (time.perf_counter() - received) * 1e3
            if faces is not None:  # a frame analysed: an error's quick answer is no latency of the analysis
                if first is None:
                    first = latency
                else:
                    recent.append(latency)
                    bisect.insort(ordered, latency)
                    if len(recent) > STEADY_FRAMES:
                        del ordered[bisect.bisect_left(ordered, recent.popleft())]
                metrics.stream_latency.observe(latency / 1e3)
            tail.update(latency_ms=round(latency, 3), first_latency_ms=round(first, 3) if first is not None else None,
                        steady_latency_ms=round(_median(ordered), 3) if ordered else None)
        await asyncio.wait_for(socket.send_text(_with_faces(reply, faces, tail)), timeout)
