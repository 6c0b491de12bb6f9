"""The service's GPU loop in a process of its own: the web server's event loop and the live loop never share an
interpreter.

Every stream's frames go through one :class:`~emonet.video.live.LiveLoop`; its host work (each session's tracking,
planning and results, the detector's and the engine's launches) and the web server's (reading frames off the
sockets, writing JSON) each take most of a core at a few dozen streams, and in one process they would take turns
holding one interpreter. :class:`LoopProcess` starts the loop in a helper process (:mod:`emonet.io.helper`: a
fresh interpreter, pipes both ways, one Ctrl-C policy) and speaks to it as the loop itself is spoken to:
:meth:`~LoopProcess.open`, :meth:`~LoopProcess.submit` (a future per frame), :meth:`~LoopProcess.close_session`,
:meth:`~LoopProcess.close`. The frames go over as their encoded bytes (decoded on the GPU there) or as RGB
pixels; the answers come back as :class:`Answer`\\ s, their faces already JSON: the web server's event loop,
which also reads every frame off its socket, only puts the pieces of a reply together.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import sys
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict, dataclass, replace
from itertools import count
from typing import Optional, Union

import numpy as np

from ..build import SIGNAL_CHECK, ModelOptions
from ..errors import HelperError, InputError
from ..io.helper import PIPE_BYTES, HelperClient, start_helper
from ..log import LOGGER, say
from ..results import face_record
from ..video.live import DROPPED, FrameError, LiveConfig, LiveResult, StepHook


@dataclass
class Answer:
    """A frame's answer as the service sends it: its faces already as JSON text (an array of
    :func:`~emonet.results.face_record`, made in the loop's process, where the web server's event loop does not
    wait for it), and its shape; ``faces`` is None for a frame dropped."""

    faces: Optional[str]
    shape: tuple = (0, 0, 3)

    @property
    def dropped(self) -> bool:
        """Answered as dropped (newer frames pushed it out, or it was too old when its turn came)."""
        return self.faces is None


DROPPED_ANSWER = Answer(None)


def to_json(value) -> str:
    """The service's JSON: compact, UTF-8 as it is, never NaN."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

FAST_EXIT = True  # the helper: every answer is written before main returns; the CUDA tear-down is not waited for

# A stream's frames on their way to the loop or in it, not yet answered, at most: the loop holds a couple waiting
# and a couple in each of its two steps in flight; past that, the pipes are behind, and a new frame is answered
# dropped here at once (what a client makes the two processes hold stays bounded whatever it sends).
IN_FLIGHT = 8


class LoopProcess:
    """The live loop of :mod:`emonet.video.live` in a process of its own (see the module); the model is loaded
    and warmed there before the constructor returns."""

    def __init__(self, options: ModelOptions, live: LiveConfig = LiveConfig(), gpu_decode: bool = True,
                 on_step: Optional[StepHook] = None, quiet: bool = False, wait: bool = True) -> None:
        """``gpu_decode``: JPEG frames decoded on the GPU there where it can; ``on_step(frames, faces, seconds)``: each
        step's figures, called in this process's listener thread; ``quiet``: its loading says nothing short of an
        error (a pool's loops after the first, whose lines would repeat the first one's); ``wait``: until it is
        ready (else :meth:`wait_ready`, so that several start side by side). Raises what :meth:`wait_ready`
        raises."""
        self.on_step = on_step
        self.about: Optional[dict] = None  # what it runs (provenance, detector, JPEG decoder)
        self._refused: Optional[str] = None
        self._futures: dict[int, tuple[int, Future]] = {}  # request -> (session, its answer)
        self._in_flight: dict[int, int] = {}  # session -> its requests in _futures
        self._lock = threading.Lock()
        self._ids = count()
        spec = json.dumps({"options": asdict(options), "live": asdict(live), "gpu_decode": gpu_decode,
                           "quiet": quiet})
        self._helper = HelperClient(
            "analysis loop", start_helper("emonet.serve.loop_process:main", spec, pipe_bytes=PIPE_BYTES),
            {"ready": self._ready, "refused": self._refuse, "answer": self._answer, "failed": self._failed,
             "cancelled": self._cancelled, "step": self._step},
            thread="emonet-loop", on_end=self._ended)
        self._helper.start()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until the model is loaded and warmed there. Raises :class:`~emonet.errors.InputError` with the loader's
        one line where the model cannot be loaded (a missing checkpoint, say), and
        :class:`~emonet.errors.HelperError` where the process died starting; the process is ended if anything
        (Ctrl-C too) stops the wait."""
        ready = lambda: self.about is not None or self._refused or self._helper.ended  # noqa: E731
        try:
            with self._helper.state:
                # In short waits: Python acts on a signal only in this thread, and a Ctrl-C or SIGTERM the system
                # gives another thread (this one holds them while it starts a process) does not end a wait here:
                # in one wait without end, it would take effect only once the loop had loaded.
                while not self._helper.state.wait_for(ready, timeout=SIGNAL_CHECK):
                    pass
        except BaseException:
            self._helper.close(kill=True)
            raise
        if self.about is None:
            why = self._refused
            self._helper.close(kill=True)
            if why is not None:
                raise InputError(why)
            raise HelperError(self._helper.failure or "the analysis loop process did not start")

    # -- what the service calls (any thread) --------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Whether the loop still takes frames."""
        return not (self._helper.ended or self._helper.closing)

    @property
    def failure(self) -> Optional[str]:
        """Why the loop's process ended, where it ended unasked."""
        return self._helper.failure

    def open(self, one_shot: bool = False) -> int:
        """A new session (see :meth:`emonet.video.live.LiveLoop.open`): its number."""
        session = next(self._ids)
        self._helper.send(("open", session, one_shot))
        return session

    def submit(self, session: int, payload: Union[np.ndarray, bytes], index: Optional[int] = None,
               timestamp: Optional[float] = None) -> Future:
        """Queue the session's next frame (see :meth:`emonet.video.live.LiveLoop.submit`); the future gives its
        :class:`Answer`, or a refusal there."""
        if not self.alive:
            raise RuntimeError(self._helper.failure or "the live loop has stopped")
        request, future = next(self._ids), Future()
        with self._lock:
            if self._in_flight.get(session, 0) >= IN_FLIGHT:
                future.set_result(DROPPED_ANSWER)
                return future
            self._futures[request] = (session, future)
            self._in_flight[session] = self._in_flight.get(session, 0) + 1
        if self._helper.ended:  # it ended after the check above, and its futures may have been failed already
            self._fail_all(RuntimeError(self._helper.failure or "the live loop has stopped"))
            return future
        self._helper.send(("frame", session, request, payload, index, timestamp))
        return future

    def close_session(self, session: int) -> None:
        """The client has gone: its frames not yet answered are cancelled, here and there."""
        self._helper.send(("close", session))
        with self._lock:
            mine = [r for r, (s, _) in self._futures.items() if s == session]
            futures = [self._futures.pop(r)[1] for r in mine]
            self._in_flight.pop(session, None)
        for future in futures:
            future.cancel()

    def close(self) -> None:
        """Answer every frame submitted, then stop the loop and its process."""
        self._helper.close()
        self._fail_all(RuntimeError("the live loop has stopped"))

    def close_now(self) -> None:
        """End the process at once, whatever it was doing (it is starting, say); frames in hand are failed."""
        if not self._helper.closing:
            self._helper.close(kill=True)
        self._fail_all(RuntimeError("the live loop has stopped"))

    # -- the listener thread ------------------------------------------------------------------------------
    def _ready(self, about: dict) -> None:
        self.about = about

    def _refuse(self, why: str) -> None:
        self._refused = why

    def _pop(self, request: int) -> Optional[Future]:
        """A request's future, no longer in flight (None: its session closed meanwhile)."""
        with self._lock:
            entry = self._futures.pop(request, None)
            if entry is None:
                return None
            left = self._in_flight.get(entry[0], 0) - 1
            if left > 0:
                self._in_flight[entry[0]] = left
            else:
                self._in_flight.pop(entry[0], None)
        return entry[1]

    def _take(self, request: int) -> Optional[Future]:
        future = self._pop(request)
        if future is None or not future.set_running_or_notify_cancel():
            return None  # its session closed, or its client stopped waiting
        return future

    def _answer(self, request: int, result) -> None:
        future = self._take(request)
        if future is not None:
            future.set_result(result)

    def _failed(self, request: int, bad_frame: bool, why: str) -> None:
        future = self._take(request)
        if future is not None:
            future.set_exception(FrameError(why) if bad_frame else RuntimeError(why))

    def _cancelled(self, request: int) -> None:
        future = self._pop(request)
        if future is not None:
            future.cancel()

    def _step(self, frames: int, faces: int, seconds: float) -> None:
        if self.on_step is not None:
            try:
                self.on_step(frames, faces, seconds)
            except Exception:  # noqa: BLE001 - a figure not recorded is no reason to stop answering
                pass

    def _ended(self) -> None:
        if self._helper.failure is not None and not self._helper.closing and self.about is not None:
            say(f"warning: {self._helper.failure}: its streams and requests are answered with that")
        self._fail_all(RuntimeError(self._helper.failure or "the live loop has stopped"))

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            futures = [f for _, f in self._futures.values()]
            self._futures.clear()
            self._in_flight.clear()
        for future in futures:
            try:
                if future.set_running_or_notify_cancel():
                    future.set_exception(exc)
            except InvalidStateError:  # answered meanwhile
                pass


def main(spec: str) -> int:
    """The helper process: load the model, run the live loop, take sessions and frames from standard input and
    write their answers to standard output until its input ends."""
    import torch

    from ..build import build_pipeline
    from ..detection import DetectorError
    from ..io.ipc import frame, messages
    from ..models.weights import CheckpointError
    from ..runtime import DeviceError, freeze_loaded
    from ..io.jpeg import gpu_decoder
    from ..provenance import provenance
    from ..video.live import LiveLoop

    # The messages keep the process's standard output to themselves: anything printed goes to standard error.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    config = json.loads(spec)
    if config.get("quiet"):
        logging.getLogger(LOGGER).setLevel(logging.ERROR)
    try:
        pipeline = build_pipeline(ModelOptions(**config["options"]))
        pipeline.warmup()
    except (InputError, CheckpointError, DetectorError, DeviceError) as exc:  # the user's to mend: one line
        return _refuse(out, str(exc))
    except torch.cuda.OutOfMemoryError:
        return _refuse(out, "the GPU has too little memory free for the model and its CUDA graphs; free some, "
                            "or run fewer GPU loops (--loops 1)")
    engine = pipeline.engine
    jpeg = gpu_decoder(engine.device) if config["gpu_decode"] else None
    names = list(engine.class_names)
    outbox: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
    outbox.put(("ready", {**provenance(engine), "untrained": engine.untrained, "detector": pipeline.detector.name,
                          "jpeg_decoder": "nvjpeg" if jpeg is not None else "cpu"}))

    def write() -> None:
        # One thread writes: an answer is pickled here, not in the loop's thread, which called back with it; the
        # answers come in runs (a step's), and a run goes in one write (see emonet.io.ipc.messages).
        while True:
            items = [outbox.get()]
            while items[-1] is not None:
                try:
                    items.append(outbox.get_nowait())
                except queue.Empty:
                    break
            done = items[-1] is None
            try:
                out.write(b"".join(frame(_outcome(*item[1:], names) if item[0] == "done" else item)
                                   for item in items if item))
                out.flush()
            except BrokenPipeError:  # the server has gone (stopped while this loop loaded, say): no one to answer
                return
            if done:
                return

    writer = threading.Thread(target=write, name="emonet-loop-write", daemon=True)
    writer.start()
    live = LiveConfig(**config["live"])
    if engine.device.type != "cuda":
        live = replace(live, max_age=None)  # a CPU's step outlasts any age allowed: no frame dropped for it
    loop = LiveLoop(pipeline, live, decode_jpeg=jpeg,
                    on_step=lambda *figures: outbox.put(("step", *figures)))
    freeze_loaded()
    sessions = {}
    try:
        for message in messages(sys.stdin.buffer):
            kind = message[0]
            if kind == "frame":
                _, session, request, payload, index, timestamp = message
                try:
                    future = loop.submit(sessions[session], payload, index, timestamp)
                except Exception as exc:  # noqa: BLE001 - a refused frame is said to its client
                    outbox.put(("failed", request, False, str(exc)))
                    continue
                future.add_done_callback(lambda f, request=request: outbox.put(("done", request, f)))
            elif kind == "open":
                sessions[message[1]] = loop.open(one_shot=message[2])
            elif kind == "close":
                session = sessions.pop(message[1], None)
                if session is not None:
                    loop.close_session(session)
    finally:
        loop.close()  # every frame taken is answered
        outbox.put(None)
        writer.join()
        with contextlib.suppress(BrokenPipeError):
            out.close()
    return 0


def _refuse(out, why: str) -> int:
    """Say why the model cannot be loaded (the server may have gone meanwhile: then to no one); exit code 2."""
    from ..io.ipc import send

    with contextlib.suppress(BrokenPipeError):
        send(out, ("refused", why))
    return 2


def _outcome(request: int, future: Future, names: list) -> tuple:
    """A frame's answer as a message: its faces as the service's JSON (see :class:`Answer`)."""
    if future.cancelled():
        return ("cancelled", request)
    exc = future.exception()
    if exc is not None:
        if isinstance(exc, FrameError):
            return ("failed", request, True, str(exc))
        return ("failed", request, False, f"{type(exc).__name__}: {exc}")
    result: LiveResult = future.result()
    if isinstance(result.faces, str) and result.faces == DROPPED:
        return ("answer", request, DROPPED_ANSWER)
    return ("answer", request, Answer(to_json([face_record(face, names) for face in result.faces]),
                                      tuple(result.shape)))
