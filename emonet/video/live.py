"""Live sessions on one GPU loop: every camera stream (and every one-off image) is a session of the scheduler.

A :class:`LiveLoop` owns the pipeline. Clients open a :class:`LiveSession` each and :meth:`LiveLoop.submit`
frames to it from any thread; each frame's answer comes back on its own future, in the session's order. One
thread steps the sessions, as :func:`~emonet.video.runner.run_videos` steps a video: each step takes the frames
waiting in every session (a chunk each), queues one detector call on those due for detection, settles and
answers the step before (while the GPU runs this step's detection), and queues every face of every session
through the engine in one batch. When no frame waits, the step in flight is settled and
answered at once. A stream thus gets the same detection cadence, landmark crops, holds and smoothing as a video.

Bounded whatever the clients send: a session holds at most ``max_waiting`` frames not yet stepped; a newer
frame pushes the oldest out, and that one is answered as dropped (:data:`DROPPED`), in order with the others;
with ``max_age``, a frame already that old when its turn comes is answered dropped too (an overloaded loop
reads fresh frames, not late ones).
JPEG frames can be handed in still encoded, to be decoded on the GPU (:mod:`emonet.io.jpeg`) by a thread of their
own, every frame that has come in since its last call in one call: the decoder waits for its own work on the GPU,
which queues behind the engine's, and the loop must not wait with it. A step takes only frames decoded already.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import numpy as np
import torch

from ..io.video import Frame
from ..pipeline import Pipeline
from ..results import FaceResult
from ..scheduler import PendingStep, Scheduler
from ..session import VideoPipeline

class FrameError(ValueError):
    """A frame handed in encoded that could not be decoded (truncated or corrupt): its client is told."""


DROPPED = "dropped"  # a frame's answer when newer frames of its session pushed it out before its turn

# Stream frame sizes the loop prepares for (see LiveLoop._prepare) at most: each keeps CUDA graphs of its own.
SIZES_PREPARED = 4

StepHook = Callable[[int, int, float], None]  # (frames, faces, seconds) of each step


@dataclass(frozen=True)
class LiveConfig:
    """How live sessions are tracked and stepped."""

    detect_every: int = 5           # the detector's period in each stream, in frames (as emonet-video's)
    smooth: bool = True             # spec §6 smoothing per face
    max_waiting: int = 2            # frames a stream holds before its turn; a newer one drops the oldest
    chunk: int = 2                  # frames of one stream in one step, at most
    max_frames: int = 64            # frames in one step, at most (every stream's together)
    max_age: Optional[float] = None  # seconds: a stream's frame older than this when its turn comes is answered
                                     # dropped (its timestamp from time.perf_counter); None: never for its age


@dataclass
class LiveResult:
    """A frame's answer: its faces, and its shape (``faces`` is :data:`DROPPED` for a dropped frame)."""

    faces: Union[list[FaceResult], str]
    shape: tuple = (0, 0, 3)


@dataclass
class _Waiting:
    index: int
    timestamp: float
    payload: Union[np.ndarray, bytes, torch.Tensor, FrameError]  # bytes until the decoding thread has them
    future: Future
    ready: Optional[torch.cuda.Event] = None  # a decoded tensor's: its decoding done on the GPU

    @property
    def encoded(self) -> bool:
        """Still to be decoded."""
        return isinstance(self.payload, (bytes, bytearray))


@dataclass
class LiveSession:
    """One stream (or, ``one_shot``, one image): its tracking and its frames waiting for their turn."""

    tracking: VideoPipeline
    one_shot: bool = False
    waiting: deque = field(default_factory=deque)
    closed: bool = False
    frames: int = 0  # submitted so far: the next frame's index


def _frames_of(items: list) -> list[_Waiting]:
    """The frames of a step's items (session, frames waited for, decoded frames)."""
    return [w for _, waiting, _ in items for w in waiting]


class LiveLoop:
    """The GPU loop of every live session (see the module)."""

    def __init__(self, pipeline: Pipeline, config: LiveConfig = LiveConfig(),
                 decode_jpeg: Optional[Callable[[list[bytes]], list[torch.Tensor]]] = None,
                 on_step: Optional[StepHook] = None) -> None:
        """``decode_jpeg``: decodes a list of JPEG bytes to ``(H, W, 3)`` uint8 RGB tensors on the engine's
        device, for frames handed in encoded (see :func:`emonet.io.jpeg.gpu_decoder`)."""
        self.pipeline, self.config = pipeline, config
        self.scheduler = Scheduler(pipeline)
        self.decode_jpeg = decode_jpeg
        self._on_step = on_step
        self._sessions: list[LiveSession] = []
        self._in_hand: list[_Waiting] = []  # the frames of the steps in flight (failed if the loop stops)
        self._turn = 0  # where the next step starts taking frames: every stream gets its turn
        self._sizes: set[tuple] = set()  # stream frame sizes prepared for (see _prepare)
        mutex = threading.Lock()
        self._lock = threading.Condition(mutex)  # the loop waits on it for decoded frames
        self._undecoded: deque[_Waiting] = deque()  # frames handed in encoded, for the decoding thread
        self._decodable = threading.Condition(mutex)  # the decoding thread waits on it for encoded frames
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="emonet-live", daemon=True)
        self._thread.start()
        self._decoder: Optional[threading.Thread] = None
        if decode_jpeg is not None:
            gpu = pipeline.engine.device.type == "cuda"
            # High priority: its few kernels (colour conversion, the copy to HWC) go as the engine's blocks finish.
            self._decode_stream = torch.cuda.Stream(pipeline.engine.device, priority=-1) if gpu else None
            self._decoder = threading.Thread(target=self._decoding, name="emonet-live-decode", daemon=True)
            self._decoder.start()

    # -- clients (any thread) ----------------------------------------------------------------------------
    def open(self, one_shot: bool = False) -> LiveSession:
        """A new session: a stream, or (``one_shot``) one image read as a photo is (no smoothing, no drops)."""
        tracking = VideoPipeline(self.pipeline, detect_every=self.config.detect_every,
                                 smooth=self.config.smooth and not one_shot, scheduler=self.scheduler)
        session = LiveSession(tracking, one_shot)
        with self._lock:
            self._sessions.append(session)
        return session

    def submit(self, session: LiveSession, payload: Union[np.ndarray, bytes], index: Optional[int] = None,
               timestamp: Optional[float] = None) -> Future:
        """Queue the session's next frame: an RGB ``(H, W, 3)`` uint8 array, or JPEG bytes where the loop decodes
        them (:attr:`decode_jpeg`); ``index``: its number in the stream (default: the next). The future gives its
        :class:`LiveResult` (or the exception that failed it)."""
        if not isinstance(payload, (bytes, bytearray)):
            payload = np.asarray(payload)
            if payload.ndim != 3 or payload.shape[2] != 3 or payload.dtype != np.uint8 or min(payload.shape[:2]) < 1:
                raise ValueError(f"a frame is an RGB (H, W, 3) uint8 image, not {payload.dtype} {payload.shape}")
        elif self._decoder is None:
            raise ValueError("this loop takes decoded frames only (it has no JPEG decoder)")
        elif not self._decoder.is_alive():
            raise RuntimeError("the live loop's JPEG decoding has stopped")
        future: Future = Future()
        dropped = None
        with self._lock:
            if session.closed or self._closing:
                raise RuntimeError("the session is closed" if session.closed else "the live loop has stopped")
            if session.one_shot and session.frames:
                raise RuntimeError("a one-shot session reads one image")
            index = session.frames if index is None else index
            session.frames = index + 1
            if not session.one_shot and len(session.waiting) >= self.config.max_waiting:
                dropped = session.waiting.popleft()
            item = _Waiting(index, time.perf_counter() if timestamp is None else timestamp, payload, future)
            session.waiting.append(item)
            if item.encoded:
                self._undecoded.append(item)
                self._decodable.notify()
            else:
                self._lock.notify()
        if dropped is not None:
            self._drop(dropped)
        return future

    def close_session(self, session: LiveSession) -> None:
        """The client has gone: its waiting frames are dropped; frames already stepped finish unheard."""
        with self._lock:
            session.closed = True
            if session in self._sessions:
                self._sessions.remove(session)
            waiting, session.waiting = list(session.waiting), deque()
        for item in waiting:
            item.future.cancel()

    def close(self) -> None:
        """Answer every frame submitted, then stop the loop."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            self._decodable.notify_all()
        self._thread.join()
        if self._decoder is not None:
            self._decoder.join()

    # -- the loop -----------------------------------------------------------------------------------------
    def _drop(self, item: _Waiting) -> None:
        if item.future.set_running_or_notify_cancel():
            item.future.set_result(LiveResult(DROPPED))

    def _take(self, wait: bool) -> Optional[list[tuple[LiveSession, list[_Waiting]]]]:
        """Every session's waiting frames, a chunk each, up to max_frames in all, the sessions in turn; waits for
        one where ``wait``; None once closing with nothing left. A stream's frame past ``max_age`` is dropped."""
        stale: list[_Waiting] = []
        try:
            with self._lock:
                return self._take_locked(wait, stale)
        finally:
            for item in stale:
                self._drop(item)

    def _take_locked(self, wait: bool, stale: list) -> Optional[list[tuple[LiveSession, list[_Waiting]]]]:
        config = self.config
        # A frame is taken once decoded; while closing, the loop waits for those still in the decoder's hands.
        while wait and not any(s.waiting and not s.waiting[0].encoded for s in self._sessions) and (
                not self._closing or any(s.waiting for s in self._sessions)):
            self._lock.wait()
        sessions = self._sessions
        if not sessions:
            return None if self._closing else []
        oldest = time.perf_counter() - config.max_age if config.max_age is not None else None
        taken, room = [], config.max_frames
        start = self._turn % len(sessions)
        order = sessions[start:] + sessions[:start]
        last = start - 1
        for k, session in enumerate(order):
            if not session.waiting:
                continue
            if room <= 0:
                break
            chunk = []
            while session.waiting and not session.waiting[0].encoded and len(chunk) < min(config.chunk, room):
                item = session.waiting.popleft()
                if oldest is not None and not session.one_shot and item.timestamp < oldest:
                    stale.append(item)
                else:
                    chunk.append(item)
            if not chunk:
                continue
            room -= len(chunk)
            taken.append((session, chunk))
            last = start + k
        # The next step starts after the last session taken: with more waiting than a step holds, every
        # stream gets its turn in order.
        self._turn = last + 1
        for session, _ in taken:
            if session.one_shot:
                sessions.remove(session)  # its one image is in hand
        if not taken and self._closing and not any(s.waiting for s in sessions):
            return None
        return taken

    def _frames(self, taken: list[tuple[LiveSession, list[_Waiting]]]) -> list[tuple[LiveSession, list[_Waiting], list[Frame]]]:
        """The frames of the items taken; an item whose decoding failed is answered with its error and left out
        (the rest of its session's chunk goes on)."""
        out = []
        for session, chunk in taken:
            frames, kept = [], []
            for w in chunk:
                if not w.future.set_running_or_notify_cancel():
                    continue  # its client has gone
                if isinstance(w.payload, Exception):
                    w.future.set_exception(w.payload)
                    continue
                if torch.is_tensor(w.payload) and w.payload.device.type == "cuda":
                    frames.append(Frame(w.index, w.timestamp, None, w.payload, w.ready))
                elif torch.is_tensor(w.payload):  # a decoder of the CPU's
                    frames.append(Frame(w.index, w.timestamp, w.payload.numpy()))
                else:
                    frames.append(Frame(w.index, w.timestamp, w.payload))
                kept.append(w)
            if frames:
                out.append((session, kept, frames))
        return out

    def _decoding(self) -> None:
        """The decoding thread: every frame handed in encoded since its last call, in one call, until the loop
        closes (a frame dropped or cancelled meanwhile is not decoded)."""
        batch: list[_Waiting] = []
        try:
            while True:
                with self._lock:
                    while not self._undecoded and not self._closing:
                        self._decodable.wait()
                    batch = [w for w in self._undecoded if not w.future.done()]
                    self._undecoded.clear()
                    if not batch and self._closing:
                        return
                if not batch:
                    continue
                images, ready = self._decode([w.payload for w in batch])
                with self._lock:
                    for w, image in zip(batch, images):
                        w.payload, w.ready = image, ready
                    batch = []
                    self._lock.notify_all()
        except BaseException as exc:  # noqa: BLE001 - nothing encoded can be read now: the loop stops, saying why
            with self._lock:
                failed = RuntimeError(f"the JPEG decoding stopped: {type(exc).__name__}: {exc}")
                for w in [*batch, *self._undecoded, *(w for s in self._sessions for w in s.waiting)]:
                    if w.encoded:
                        w.payload = failed
                self._undecoded.clear()
                self._lock.notify_all()
            raise

    def _decode(self, data: list[bytes]) -> tuple[list, Optional[torch.cuda.Event]]:
        """JPEG bytes decoded in one call (each alone where the batch fails: its error kept), and the event of
        their decoding on the GPU."""
        stream = self._decode_stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            try:
                images = self.decode_jpeg(data)
            except Exception:  # noqa: BLE001 - one corrupt frame fails the batch: each on its own then
                images = []
                for one in data:
                    try:
                        images.append(self.decode_jpeg([one])[0])
                    except Exception as exc:  # noqa: BLE001 - said to its client
                        images.append(FrameError(f"the image could not be decoded (truncated or corrupt: {exc})"))
            ready = None
            if stream is not None:
                ready = torch.cuda.Event()
                ready.record(stream)
        return images, ready

    def _run(self) -> None:
        try:
            self._steps()
        except BaseException as exc:  # noqa: BLE001 - the loop cannot go on: every frame in hand is told so
            with self._lock:
                self._closing = True
                waiting = [w for s in self._sessions for w in s.waiting]
                for s in self._sessions:
                    s.waiting.clear()
            self._fail(waiting + self._in_hand, RuntimeError(f"the live loop stopped: {type(exc).__name__}: {exc}"))
            raise

    def _steps(self) -> None:
        scheduler = self.scheduler
        previous: Optional[tuple[PendingStep, list, float]] = None
        while True:
            taken = self._take(wait=previous is None)
            if taken is None:
                break
            if not taken:
                if previous is not None:  # nothing waits: the step in flight is answered now
                    self._answer(*previous)
                    previous = None
                continue
            t0 = time.perf_counter()
            self._in_hand = [w for _, chunk in taken for w in chunk] + (
                _frames_of(previous[1]) if previous is not None else [])
            items = []
            try:
                items = self._frames(taken)
                self._prepare(items)
                # With a step in flight, only queued here: that step is answered first (below), while the GPU runs
                # the detector's first network, whose candidates launch() then waits for.
                queued = (scheduler.detect([(s.tracking, frames) for s, _, frames in items],
                                           advance=previous is None) if items else None)
            except Exception as exc:  # noqa: BLE001 - this step's frames fail; the loop goes on
                self._fail([w for _, chunk in taken for w in chunk], exc)
                items, queued = [], None
            if previous is not None:
                # The step before answered before this one is launched: its frames' answers need not wait for
                # this step's host work (the candidates read, the close look queued and collected, the faces
                # planned and cropped), and the GPU, given this step's detection queued above, works meanwhile.
                self._answer(*previous)
            previous = None
            if queued is not None:
                try:
                    previous = (scheduler.launch(queued), items, t0)
                except Exception as exc:  # noqa: BLE001
                    self._fail(_frames_of(items), exc)
        if previous is not None:
            self._answer(*previous)

    def _prepare(self, items: list) -> None:
        """A stream's first frame of a size not seen before: the pipeline warmed for it (the detector's graphs for
        every batch size prepared at once, in the background where it captures them so), as the tools do for a
        video before its first frame; otherwise each new batch size of the size would run eagerly, choosing its
        kernels, while a step waits. One-shot images (photos of any size) are not prepared for; at most
        SIZES_PREPARED sizes are (each keeps its graphs)."""
        for session, _, frames in items:
            if session.one_shot or len(self._sizes) >= SIZES_PREPARED:
                continue
            shape = tuple(frames[0].shape)
            if shape not in self._sizes:
                self._sizes.add(shape)
                self.pipeline.warmup(shape, log=lambda _: None)

    def _settle(self, step: PendingStep, items: list, t0: float):
        try:
            return self.scheduler.settle(step), items, t0
        except Exception as exc:  # noqa: BLE001
            self._fail(_frames_of(items), exc)
            return None

    def _answer(self, step: PendingStep, items: list, t0: float) -> None:
        settled = self._settle(step, items, t0)
        if settled is not None:
            self._deliver(*settled)

    def _deliver(self, settled: list, items: list, t0: float) -> None:
        faces = 0
        for chunk, (session, waiting, frames) in zip(settled, items):
            try:
                per_frame = session.tracking.results(chunk)
            except Exception as exc:  # noqa: BLE001
                self._fail(waiting, exc)
                continue
            for w, frame, found in zip(waiting, frames, per_frame):
                faces += len(found)
                w.future.set_result(LiveResult(found, frame.shape))
            for frame in frames:
                frame.pixels = frame.ready = None  # done with: free the GPU copy now
        if self._on_step is not None and items:
            try:
                self._on_step(sum(len(i[1]) for i in items), faces, time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - a figure not recorded is no reason to stop answering
                pass

    @staticmethod
    def _fail(waiting: list[_Waiting], exc: BaseException) -> None:
        for w in waiting:
            if not w.future.done():
                w.future.set_exception(exc)
