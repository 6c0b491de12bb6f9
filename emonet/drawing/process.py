"""The annotated video drawn in a process of its own (:mod:`.worker`): planned, drawn on the frames' GPU
and handed to the encoders there, while this process analyses the next frames.

On a GPU the frames never leave it: this process copies each chunk into a ring of chunk-sized slots on
the GPU that both processes map (CUDA IPC), and interprocess events order the copies and the drawing
on the device, without either process waiting. On the CPU the frames go through the pipe.
"""
from __future__ import annotations

import pickle
import resource
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ..io import ipc
from ..io.annotated import AnnotatedVideoWriter
from ..io.encode_worker import WORKER_ENV, Spare
from ..io.helper import HelperClient, start_helper
from ..errors import HelperError, OutputError
from .canvas import VideoCanvas
from .marks import ChunkMarks, Planner, coded_size, panel_layout
from .opencv import disc_sprite
from .planning import PlanningProcess

SLOTS = 3  # chunks in the GPU frame ring: one being drawn, one waiting, one being copied in
RING_BYTES = 1 << 30  # the GPU frame ring's size, at most (a chunk's slot holds fewer frames of large videos)


@dataclass
class DrawnVideo:
    """How an annotated video's drawing and encoding went."""

    path: Optional[Path]                 # the video, None when no frame was written
    seconds: dict[str, float]            # where it is drawn: plan, plan wait (for a planning process), draw,
                                         # to encoders, encoder wait;
                                         # encode: the encoders'
    cpu: dict[str, float] = field(default_factory=dict)  # CPU-seconds: drawing, encoding
    resized: bool = False                # the video changed frame size; frames were resized to the first's
    apart: bool = True                   # drawn in a process of its own (else in the analysing one)
    not_in_put: float = 0.0              # drawn in the analysing one: of ``seconds`` (but encode), those not
                                         # spent within put() (planned in a planning process; drawn at finish)
    planned_apart: int = 0               # frames whose marks were planned in a planning process

    @classmethod
    def from_report(cls, report: dict, apart: bool = True) -> "DrawnVideo":
        """From :meth:`VideoDrawing.close`'s report; :class:`OutputError` if the video failed."""
        if report["error"] is not None:
            raise _failure(report["error"])
        cpu = report["cpu"] if apart else {"encoding": report["cpu"]["encoding"]}  # else in this process's
        return cls(Path(report["path"]) if report["path"] else None, {**report["seconds"], "encode": report["encode"]},
                   cpu, report["resized"], apart, report["not in put"], report["planned apart"])


def _failure(error: str, died: bool = False) -> OutputError:
    """The one line a failed annotated video ends with: a :class:`HelperError` when a process died (the drawing
    process, ``died``, or an encoding process), else an :class:`OutputError`."""
    prefix = "writing the annotated video failed"
    message = error if error.startswith(prefix) else f"{prefix}: {error}"
    return HelperError(message) if died or "process ended unexpectedly" in error else OutputError(message)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class VideoDrawing:
    """One annotated video's planner, canvas, encoders and clocks (in the drawing process, or in this one)."""

    def __init__(self, spec: dict, device, spare: Optional[Spare] = None) -> None:
        """``spare``: where the video's first encoder is taken from (started ahead), if given."""
        self.planner = Planner(spec["class_names"], banner=bool(spec["banner"]))
        self.canvas = VideoCanvas(spec["class_names"], spec["banner"], device)
        self.seconds = dict.fromkeys(("plan", "plan wait", "draw", "to encoders", "encoder wait"), 0.0)
        self.not_in_put = 0.0  # of the seconds above, those not spent within put() (see DrawnVideo)
        self.planned_apart = 0  # frames whose marks a planning process planned
        self.cpu0 = _cpu()
        self.writer, self.failed = None, None
        try:  # its encoders start now, and its ring where the frames' size is known
            self.writer = AnnotatedVideoWriter(spec["path"], spec["fps"], codec=spec["codec"], spare=spare)
            if spec.get("frame"):
                self.writer.prepare(coded_size(*spec["frame"]), device)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which turns it into one line
            self.failed = f"{exc}"

    def draw(self, images: list, indices: list, faces: list, colors: list) -> None:
        """Plan, draw and hand over one chunk."""
        self.render(images, indices, self.plan([tuple(i.shape[:2]) for i in images], faces, colors))

    def plan(self, shapes: list, faces: list, colors: list) -> ChunkMarks:
        """One chunk's marks, planned here."""
        t0 = time.perf_counter()
        marks = self.planner.plan(shapes, faces, colors)
        self.seconds["plan"] += time.perf_counter() - t0
        return marks

    def render(self, images: list, indices: list, marks: ChunkMarks) -> None:
        """Draw one chunk's planned ``marks`` and hand it over."""
        t1 = time.perf_counter()
        drawn = self.canvas.render(images, marks)
        t2 = time.perf_counter()
        waited = self.writer.wait_seconds
        self.writer.put(indices, drawn, self.canvas.size)
        waited = self.writer.wait_seconds - waited
        self.seconds["draw"] += t2 - t1
        self.seconds["to encoders"] += time.perf_counter() - t2 - waited
        self.seconds["encoder wait"] += waited

    def close(self) -> dict:
        """Finish the video (every frame handed over is encoded and kept); how it went, as a dict (it crosses
        the pipe)."""
        path, writer = None, self.writer
        if writer is not None:
            try:
                path = writer.close()
            except Exception as exc:  # noqa: BLE001
                self.failed = self.failed or f"{exc}"
        return {"path": str(path) if path else None, "seconds": self.seconds, "error": self.failed,
                "resized": self.canvas.resized, "not in put": self.not_in_put,
                "planned apart": self.planned_apart,
                "encode": writer.encode_seconds if writer else 0.0,
                "cpu": {"drawing": _cpu() - self.cpu0,
                        "encoding": sum(writer.cpu_seconds.values()) if writer else 0.0}}


class DrawingProcess:
    """``open()`` a video (a number for it), ``put()`` its frames chunk after chunk with their faces,
    ``finish()`` it; several videos one after the other (the next one may open before the last one's final
    frames are put); ``close()`` at the end.

    The process starts at once (torch's import and the device's start-up run while the model loads).
    ``put`` returns as soon as the frames are copied (on a GPU, queued), unless the drawing is a full
    ring behind: ``wait_seconds`` is the time it waited then.
    """

    def __init__(self, device: Union[str, torch.device]) -> None:
        self.device = torch.device(device)
        self._ready: Optional[list] = None
        self._busy = [False] * SLOTS  # per ring slot: handed to the drawing process, not yet drawn
        self._next = 0
        self._errors: dict[int, str] = {}      # per video
        self._closed: dict[int, dict] = {}     # per video, its report
        self._videos = 0
        self._events: list = []          # the drawing process's "slot read" events (GPU)
        self._copied: list = []          # this process's "slot copied" events (GPU)
        self._ring: Optional[torch.Tensor] = None
        self._in_flight = 0  # chunks sent, not yet drawn
        self.wait_seconds = 0.0
        self._helper = HelperClient(
            "drawing", start_helper("emonet.drawing.worker:main", str(self.device), env=WORKER_ENV),
            {"ready": self._on_ready, "done": self._on_done, "error": self._on_error, "closed": self._on_closed},
            thread="emonet-drawing")
        self._state = self._helper.state  # held by the handlers below
        self._helper.start()

    def _on_ready(self, events: Optional[list]) -> None:
        self._ready = events or []

    def _on_done(self, slot: Optional[int]) -> None:
        self._in_flight -= 1
        if slot is not None:
            self._busy[slot] = False

    def _on_error(self, video: int, message: str) -> None:
        self._errors.setdefault(video, message)

    def _on_closed(self, video: int, report: dict) -> None:
        self._closed[video] = report

    def _send(self, message, shared: bool = False) -> None:
        """Queue one message (as :func:`emonet.io.ipc.send` writes it); ``shared``: CUDA tensors in it cross
        as IPC handles (torch's reductions for multiprocessing; pickled here, on the stream of their work)."""
        self._check(None)
        if shared:
            from multiprocessing.reduction import ForkingPickler
            from torch.multiprocessing import reductions

            reductions.init_reductions()
            data = ipc.frame(message, bytes(ForkingPickler.dumps(message, pickle.HIGHEST_PROTOCOL)))
        else:
            data = ipc.frame(message)  # pickled now: a CPU chunk's arrays are the caller's frames
        if message[0] == "chunk":
            with self._state:
                self._in_flight += 1
        self._helper.send_framed(data)

    def _wait(self, done) -> None:
        """Wait (counted in ``wait_seconds``) until ``done()`` or the process has ended."""
        t0 = time.perf_counter()
        with self._state:
            while not done() and not self._helper.ended:
                self._state.wait(timeout=0.5)
        self.wait_seconds += time.perf_counter() - t0

    def _check(self, video: Optional[int]) -> None:
        """Raise :class:`OutputError` if the video failed, :class:`HelperError` if the process has ended."""
        error = self._errors.get(video)
        if error is not None:
            raise _failure(error)
        if self._helper.failure is not None:  # its only failure: it ended
            raise _failure(self._helper.failure, died=True)

    def open(self, path: Union[str, Path], fps: float, class_names: Sequence[str], banner: Optional[str] = None,
             codec: str = "h264", frame: Optional[tuple[int, int]] = None) -> int:
        """Start a video at ``path`` (its encoders start now; with ``frame``, the ``(H, W)`` of its frames, their
        ring too); its number, for :meth:`put` and :meth:`finish`."""
        self._videos += 1
        self._send(("open", self._videos, {"path": str(path), "fps": fps, "class_names": list(class_names),
                                           "banner": banner, "codec": codec, "frame": frame}))
        return self._videos

    def warm(self, frame: tuple[int, int]) -> None:
        """Draw a throwaway frame of ``frame`` = (H, W) now (the sprites and kernels of its size), while the
        model loads, not on the first chunk of a video of that size."""
        self._send(("warm", tuple(frame)))

    def put(self, video: int, images: Sequence[torch.Tensor], indices: Sequence[int], faces: Sequence,
            colors: Sequence) -> None:
        """Draw these frames of ``video`` (``(H, W, 3)`` uint8 RGB tensors on the device, in order) with their
        faces (per frame, ``(FaceResult, trail)`` pairs) and colours (per frame, one per face), and encode them."""
        self._check(video)
        if not len(images):
            return
        shape = tuple(images[0].shape)
        if self.device.type != "cuda" or any(tuple(i.shape) != shape for i in images):
            # The CPU's frames, or a chunk whose frames changed size (rare): through the pipe, a few chunks ahead.
            self._wait(lambda: self._ready is not None and self._in_flight < SLOTS)
            frames = [i.cpu().numpy() if self.device.type != "cuda" else i for i in images]
            self._send(("chunk", video, None, frames, list(indices), list(faces), list(colors)),
                       shared=self.device.type == "cuda")
            return
        capacity = self._capacity(shape, len(images))
        for lo in range(0, len(images), capacity):  # a chunk larger than a slot goes in pieces
            self._put_slot(video, images[lo:lo + capacity], indices[lo:lo + capacity], faces[lo:lo + capacity],
                           colors[lo:lo + capacity])
        self._check(video)

    def _capacity(self, shape: tuple, frames: int) -> int:
        """Frames per slot (a new ring, sized for chunks of ``frames``, when the frames are not the ring's)."""
        if self._ring is not None and tuple(self._ring.shape[2:]) == shape:
            return self._ring.shape[1]
        self._wait(lambda: self._ready is not None)
        self._wait(lambda: not any(self._busy))  # the old ring's chunks drawn
        self._check(None)
        capacity = int(np.clip(RING_BYTES // (SLOTS * int(np.prod(shape))), 1, max(frames, 32)))
        stream = torch.cuda.current_stream(self.device)
        for event in self._events:  # the old ring's memory is reused only after the drawing has read it
            stream.wait_event(event)
        with torch.cuda.device(self.device):
            self._ring = torch.empty((SLOTS, capacity, *shape), dtype=torch.uint8, device=self.device)
            self._events = [torch.cuda.Event.from_ipc_handle(self.device, h) for h in self._ready]
            self._copied = [torch.cuda.Event(interprocess=True) for _ in range(SLOTS)]
        self._send(("ring", self._ring, [e.ipc_handle() for e in self._copied]), shared=True)
        return capacity

    def _put_slot(self, video: int, images: Sequence[torch.Tensor], indices: Sequence[int], faces: Sequence,
                  colors: Sequence) -> None:
        slot = self._next
        self._wait(lambda: not self._busy[slot])
        self._check(video)
        self._next = (slot + 1) % SLOTS
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self._events[slot])  # its last chunk read by the drawing
        torch.stack(list(images), out=self._ring[slot, :len(images)])
        self._copied[slot].record(stream)
        with self._state:
            self._busy[slot] = True
        self._send(("chunk", video, slot, None, list(indices), list(faces), list(colors)))

    def finish(self, video: int) -> DrawnVideo:
        """Finish ``video``: every frame put is drawn, encoded and kept. Raises :class:`OutputError` on a
        failure, after keeping what could be kept."""
        self._send(("close", video))
        self._wait(lambda: video in self._closed)
        report = self._closed.pop(video, None)
        if report is None:
            self._check(None)
        return DrawnVideo.from_report(report)

    @property
    def ready(self) -> bool:
        """The process is up (torch imported, the device started): a chunk put now is drawn at once."""
        return self._ready is not None

    def close(self, now: bool = False) -> None:
        """End the process (an open video is finished first); ``now``: at once, not used (still starting)."""
        self._helper.close(kill=now)
        self._ring = None
        self._events = self._copied = []


@dataclass
class _Planned:
    """A chunk handed over, its marks being planned in the planning process, not yet drawn."""

    images: list
    indices: list
    shapes: list
    faces: list
    colors: list
    marks: Optional[tuple] = None  # (marks, seconds planning), once taken from the planning process


class LocalDrawing:
    """What :class:`DrawingProcess` does, in this process: for jobs too short to repay the process's start-up.

    With ``plan_apart`` (by default where the frames are on a GPU), the marks are planned in a
    :class:`~emonet.drawing.planning.PlanningProcess` (started at once, up in a fraction of a second): a chunk
    put is planned there while the next one is analysed, and drawn here as the next one is put (or at
    :meth:`finish`). Until it is up, or if it fails, chunks are planned here; the frames are the same.
    """

    def __init__(self, device: Union[str, torch.device], plan_apart: Optional[bool] = None) -> None:
        self.device = torch.device(device)
        self.wait_seconds = 0.0  # never waits for another process's drawing: it is done here
        self._videos: dict[int, VideoDrawing] = {}
        self._planned: dict[int, deque] = {}  # per video: its chunks planned apart, in order, not yet drawn
        # Per video: its chunks go to the planning process (True), not yet (False), or never again (None: it
        # could not plan one, or the video failed; its chunks sent there are planned here).
        self._apart: dict[int, Optional[bool]] = {}
        self._count = 0
        self._spare = Spare()  # the encoder of the first video, then of each next one
        if plan_apart is None:
            plan_apart = self.device.type == "cuda"
        self._planning = PlanningProcess() if plan_apart else None

    def open(self, path: Union[str, Path], fps: float, class_names: Sequence[str], banner: Optional[str] = None,
             codec: str = "h264", frame: Optional[tuple[int, int]] = None) -> int:
        """As :meth:`DrawingProcess.open`."""
        self._count += 1
        self._videos[self._count] = VideoDrawing({"path": str(path), "fps": fps, "class_names": list(class_names),
                                                  "banner": banner, "codec": codec, "frame": frame},
                                                 self.device, self._spare)
        self._planned[self._count] = deque()
        self._apart[self._count] = False
        return self._count

    def warm(self, frame: tuple[int, int]) -> None:
        """Make the panel's sprite of frames of ``frame`` = (H, W) now (OpenCV's font loaded with it), while the
        model loads, not on the first chunk of a video of that size."""
        disc_sprite(panel_layout(frame[0])[2])

    def put(self, video: int, images: Sequence[torch.Tensor], indices: Sequence[int], faces: Sequence,
            colors: Sequence) -> None:
        """As :meth:`DrawingProcess.put`: drawn before it returns, or, planned apart, as the next chunk is put."""
        drawing = self._videos[video]
        if drawing.failed is None and len(images):
            try:
                images, indices, faces, colors = list(images), list(indices), list(faces), list(colors)
                shapes = [tuple(i.shape[:2]) for i in images]
                if drawing.planner.shape is None:  # the video's, whichever process plans its first chunk
                    drawing.planner.shape = shapes[0]
                if self._plans_apart(video):
                    self._planning.plan(video, shapes, faces, colors)
                    self._planned[video].append(_Planned(images, indices, shapes, faces, colors))
                    self._draw_planned(video, keep=1)
                else:
                    self._draw_planned(video)  # the chunks before it first
                    drawing.render(images, indices, drawing.plan(shapes, faces, colors))
            except OutputError as exc:
                drawing.failed = f"{exc}"
        if drawing.failed is not None:
            self._planned[video].clear()
            self._stop_apart(video)
            raise _failure(drawing.failed)

    @property
    def plans_apart(self) -> bool:
        """A chunk of a video put from now on is planned in the planning process (it is up)."""
        return self._planning is not None and self._planning.ready

    def _plans_apart(self, video: int) -> bool:
        """Whether ``video``'s next chunk goes to the planning process: from the first chunk put once it is up
        (its plans then start from the video's frame size), as long as it plans them."""
        if self._apart[video] is False and self.plans_apart:
            self._apart[video] = True
            planner = self._videos[video].planner
            self._planning.open(video, planner.class_names, planner.banner, planner.shape)
        return bool(self._apart[video])

    def _stop_apart(self, video: int) -> None:
        """Plan ``video``'s chunks here from now on (those sent there too), by a new planner whose marks start the
        canvas's atlas again."""
        if self._apart.get(video):
            self._planning.close_video(video)
            old = self._videos[video].planner
            self._videos[video].planner = Planner(old.class_names, banner=old.banner, shape=old.shape)
        self._apart[video] = None

    def _draw_planned(self, video: int, keep: int = 0) -> None:
        """Draw ``video``'s chunks planned apart, oldest first, waiting for their marks, all but the last
        ``keep``. Where the planning process has ended or could not plan one, they are planned here
        (:meth:`_stop_apart`)."""
        drawing, planned = self._videos[video], self._planned[video]
        while len(planned) > keep:
            chunk = planned[0]
            if chunk.marks is None and self._apart[video]:
                t0 = time.perf_counter()
                chunk.marks = self._planning.take(video)  # kept with its chunk: taken once, whatever comes next
                drawing.seconds["plan wait"] += time.perf_counter() - t0
                if chunk.marks is None:
                    self._stop_apart(video)
                else:
                    drawing.seconds["plan"] += chunk.marks[1]
                    drawing.not_in_put += chunk.marks[1]
                    drawing.planned_apart += len(chunk.indices)
            marks = chunk.marks[0] if chunk.marks is not None else drawing.plan(chunk.shapes, chunk.faces,
                                                                                chunk.colors)
            planned.popleft()
            drawing.render(chunk.images, chunk.indices, marks)

    def finish(self, video: int) -> DrawnVideo:
        """As :meth:`DrawingProcess.finish`."""
        return DrawnVideo.from_report(self._end(video), apart=False)

    def _end(self, video: int) -> dict:
        """Draw ``video``'s chunks still planned apart, finish it; its report."""
        drawing = self._videos[video]
        try:
            if drawing.failed is None:
                before, apart = sum(drawing.seconds.values()), drawing.not_in_put
                try:
                    self._draw_planned(video)
                except OutputError as exc:
                    drawing.failed = f"{exc}"
                drawing.not_in_put = apart + sum(drawing.seconds.values()) - before  # all of it: not in put()
        finally:
            if self._apart.pop(video, None):
                self._planning.close_video(video)
            self._planned.pop(video, None)
            report = self._videos.pop(video).close()
        return report

    def close(self, now: bool = False) -> None:
        """Finish the videos still open (with every frame put; each one, whatever the others raise), and end the
        planning process; then raise the first error, if any."""
        first: Optional[BaseException] = None
        for video in list(self._videos):
            try:
                self._end(video)
            except BaseException as exc:  # noqa: BLE001 - the others are finished first
                first = first or exc
        if self._planning is not None:
            self._planning.close()
        self._spare.close()
        if first is not None:
            raise first
