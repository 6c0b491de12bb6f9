"""Faces over time for many videos or streams at once: one scheduler, one detector call and one engine batch a step.

A *session* (:class:`~emonet.session.VideoPipeline`, in :mod:`emonet.session`) is one video's or one live
stream's tracking: which frames the detector sees, the faces it follows with stable ids, where they are cropped
between detections, their smoothing. A :class:`Scheduler` runs a *step* for many sessions together, each with a
chunk of its frames:

1. :meth:`Scheduler.detect` queues one detector call on every session's detection frames;
2. :meth:`Scheduler.launch` collects it, lets each session track and plan its faces, and queues every
   planned crop of every session through the engine in one batch;
3. :meth:`Scheduler.settle` waits for the outputs and hands each session's tracks their landmarks (all the
   next launch needs);
4. each session's :meth:`~emonet.session.VideoPipeline.results` then makes its rows (smoothing), which may
   come after the next step is launched: the GPU works meanwhile.

The video runner (:mod:`emonet.video.runner`) steps one video at a time; the live service
(:mod:`emonet.video.live`) steps every stream that has frames waiting. Both go through the same code, so a
stream gives the rows ``emonet-video`` gives for the same frames in the same chunks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Optional, Protocol, Sequence

import numpy as np
import torch

from .geometry import landmarks_boxes
from .pipeline import Outputs, Pending, Pipeline
from .tracking import set_many_landmarks

class Session(Protocol):
    """What the scheduler asks of a session (:class:`~emonet.session.VideoPipeline` is one; its module imports
    this one, as a session alone steps through a scheduler of its own)."""

    hold_score: Optional[float]

    def plan_detection(self, chunk: list) -> tuple["QueuedDetection", list]: ...  # [(frame, small, memory)]

    def take_detections(self, entry: "QueuedDetection", boxes: list): ...

    def plan_faces(self, take) -> "PendingChunk": ...

    def settle_outputs(self, chunk: "PendingChunk", outputs: Outputs, held: np.ndarray,
                       lost: bool) -> "SettledChunk": ...


@dataclass
class QueuedDetection:
    """One session's part of a step's detection (see :meth:`Scheduler.detect`): its chunk, which frames the
    detector sees, how many images it gave the detector, whether the first is the chunk's first frame held in
    standby, the frames whose detection looks at the whole frame only, and what a look again at the chunk's first
    frame reads of the session's close looks (a copy of its LookMemory before the chunk)."""

    session: Session
    chunk: list                     # emonet.io.video.Frame
    flags: list[bool]
    count: int = 0
    standby: bool = False
    whole_only: frozenset = frozenset()
    standby_wanted: Optional[tuple] = None  # (small,): a standby look the scheduler adds if the detector runs
    relook_memory: object = None  # what a look again at the chunk's first frame reads (a LookMemory's copy)
    step: Optional["QueuedStep"] = field(default=None, repr=False)


@dataclass
class QueuedStep:
    """A step whose detection is queued: every session's part, and the detector's one handle (None: no image)."""

    entries: list[QueuedDetection]
    handle: object = None


@dataclass
class PendingChunk:
    """One session's chunk whose faces are planned and queued: its frames, its planned faces (image indices
    within the chunk), the Track of each, and what each face's landmarks are held to: its track's last detection
    as of its frame (a later frame of the chunk may be detected before the chunk settles) and the frames since."""

    session: Session
    frames: list                    # emonet.io.video.Frame
    pending: Pending
    tracks: list
    references: list = field(default_factory=list)  # per face, (4,) x1, y1, x2, y2
    since: list = field(default_factory=list)       # per face, frames since that detection


@dataclass
class PendingStep:
    """A step queued through the engine: every session's chunk, and the one launch of all their crops."""

    chunks: list[PendingChunk]
    pending: Pending


@dataclass
class SettledChunk:
    """A chunk whose outputs have come back and whose tracks have their landmarks (see :meth:`Scheduler.settle`);
    its results are still to be made (:meth:`~emonet.session.VideoPipeline.results`)."""

    chunk: PendingChunk
    outputs: Outputs
    boxes: list[np.ndarray]         # each face's box as reported


class Scheduler:
    """Steps of many sessions on one pipeline: one detector call and one engine batch a step.

    On a GPU the detector gets a stream of its own: a step's detection then runs beside, and waits for
    nothing of, the previous step's engine work; high priority, so its few small kernels get the SMs as the
    engine's blocks finish instead of queueing behind all of them.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.engine, self.detector = pipeline.engine, pipeline.detector
        gpu = self.engine.device.type == "cuda"
        self.det_stream = torch.cuda.Stream(self.engine.device, priority=-1) if gpu else None

    def _on_det_stream(self):
        return torch.cuda.stream(self.det_stream) if self.det_stream is not None else contextlib.nullcontext()

    def _launch_detector(self, frames: list, small: list[bool], memory: Optional[list] = None):
        if self.det_stream is None:
            return self.detector.launch([f.image for f in frames], small, memory)
        waited: set = set()
        with torch.cuda.stream(self.det_stream):
            return self.detector.launch([f.on_device(self.engine.device, self.det_stream, waited) for f in frames],
                                        small, memory)

    def _collect_detector(self, handle, min_score: Optional[float]) -> list:
        # On the detector's stream: its close look at the candidates (more network work) must not queue behind,
        # and wait for, the previous step's engine work on the main stream.
        with self._on_det_stream():
            return self.detector.collect(handle, min_score=min_score)

    def detect(self, items: Sequence[tuple[Session, list]], *, advance: bool = True) -> QueuedStep:
        """Each session decides which frames of its chunk the detector sees; all of them are queued in one call
        and, with ``advance``, taken one step on (:meth:`~emonet.detection.FaceDetector.advance`: the close look at
        the candidates queued), which waits for the detector's first network but not for the previous step's
        engine work; without, :meth:`launch` takes it on (the caller's host work goes first meanwhile)."""
        planned = [session.plan_detection(chunk) for session, chunk in items]
        # A standby look rides along wherever the detector runs in this step anyway, whichever session's frames
        # make it run (a stream's chunk of one frame seldom has a detection frame of its own).
        detecting = any(picked for _, picked in planned)
        entries, frames, small, memory = [], [], [], []
        for entry, picked in planned:
            if entry.standby_wanted and detecting:
                picked.insert(0, (entry.chunk[0], entry.standby_wanted[0], entry.relook_memory))
                entry.standby, entry.count = True, entry.count + 1
            entries.append(entry)
            frames += [f for f, _, _ in picked]
            small += [s for _, s, _ in picked]
            memory += [m for _, _, m in picked]
        step = QueuedStep(entries)
        for entry in entries:
            entry.step = step
        if frames:
            step.handle = self._launch_detector(frames, small, memory)
            if advance:
                with self._on_det_stream():
                    step.handle = self.detector.advance(step.handle)
        return step

    def launch(self, step: QueuedStep) -> PendingStep:
        """Collect the step's detections, let each session track and plan its faces, and queue every planned crop
        of every session through the engine in one batch (without waiting for it)."""
        # Every session of a scheduler has its detector, and so its threshold and hold margin.
        hold_score = step.entries[0].session.hold_score if step.entries else None
        for entry in step.entries:
            # The entries' way back to their step, no longer needed (a step is launched once): without it, a
            # step's frames (their pixels on the GPU among them) are freed when it is done with, not when the
            # garbage collector next finds the cycle.
            entry.step = None
        boxes = self._collect_detector(step.handle, hold_score) if step.handle is not None else []
        takes, start = [], 0
        for entry in step.entries:
            takes.append(entry.session.take_detections(entry, boxes[start:start + entry.count]))
            start += entry.count
        # A loss known only now (the chunk before settled after this step's detection was queued): the chunk's
        # first frame looked at again, every such session's in one call, while the GPU waits.
        relooks = [t for t in takes if t.relook is not None]
        if relooks:
            handle = self._launch_detector([t.chunk[0] for t in relooks], [t.relook for t in relooks],
                                           [t.memory for t in relooks])
            for take, dets in zip(relooks, self._collect_detector(handle, hold_score)):
                take.looked_again(dets)
        chunks = [t.session.plan_faces(t) for t in takes]
        faces, pixels, waited = [], [], set()
        stream = torch.cuda.current_stream(self.engine.device) if self.det_stream is not None else None
        for chunk in chunks:
            offset = len(pixels)
            faces += [replace(f, image=f.image + offset) for f in chunk.pending.faces] if offset else chunk.pending.faces
            if not chunk.pending.faces:
                pixels += [None] * len(chunk.frames)  # never read
            elif stream is not None:  # uploaded once (by the reader or decoder), shared with the detector
                pixels += [f.on_device(self.engine.device, stream, waited) for f in chunk.frames]
            else:
                pixels += [f.image for f in chunk.frames]
        return PendingStep(chunks, self.pipeline.launch(pixels, faces))

    def settle(self, step: PendingStep) -> list[SettledChunk]:
        """Wait for a step's outputs; each session's chunk settled (see
        :meth:`~emonet.session.VideoPipeline.settle_outputs`).
        The arithmetic runs over every session's faces at once: a step of many streams holds a few faces each."""
        outputs = self.pipeline.read(step.pending)
        faces = [f for chunk in step.chunks for f in chunk.pending.faces]
        marked = landmarks_boxes(outputs.landmarks)
        # Row by row, as each session alone: a track is in one session's chunk only.
        held, ok = set_many_landmarks([t for chunk in step.chunks for t in chunk.tracks], outputs.landmarks,
                                      references=[r for chunk in step.chunks for r in chunk.references],
                                      since=[n for chunk in step.chunks for n in chunk.since], boxes=marked)
        own = marked.copy()  # each face's own box: the detection's, else its landmarks'
        detected = np.array([f.detected for f in faces], bool)
        for k, face in enumerate(faces):
            if face.box is not None:
                own[k] = face.box
        shapes = np.array([chunk.frames[f.image].shape[:2] for chunk in step.chunks for f in chunk.pending.faces],
                          np.float64).reshape(-1, 2)
        x1, y1, x2, y2 = own.T
        # A face whose landmarks' box broke its bounds, that left the frame or collapsed: the detector looks again.
        lost = ((~ok & ~detected) | (x2 < 0) | (y2 < 0) | (x1 > shapes[:, 1]) | (y1 > shapes[:, 0])
                | ((x2 - x1) < 8)).tolist()
        settled, start = [], 0
        for chunk in step.chunks:
            n = len(chunk.pending.faces)
            part = slice(start, start + n)
            start += n
            settled.append(chunk.session.settle_outputs(chunk, Outputs(outputs.values[part], outputs.landmarks[part]),
                                                        held[part], any(lost[part])))
        return settled
