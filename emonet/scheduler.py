"""Faces over time for many videos or streams at once: one scheduler, one detector call and one engine batch a step.

A *session* (:class:`VideoPipeline`) is one video's or one live stream's tracking: which frames the detector
sees, the faces it follows with stable ids, where they are cropped between detections, their smoothing. A
:class:`Scheduler` runs a *step* for many sessions together, each with a chunk of its frames:

1. :meth:`Scheduler.detect` queues one detector call on every session's detection frames;
2. :meth:`Scheduler.launch` collects it, lets each session track and plan its faces, and queues every
   planned crop of every session through the engine in one batch;
3. :meth:`Scheduler.settle` waits for the outputs and hands each session's tracks their landmarks (all the
   next launch needs);
4. each session's :meth:`VideoPipeline.results` then makes its rows (smoothing), which may come after the
   next step is launched: the GPU works meanwhile.

The video runner (:mod:`emonet.video.runner`) steps one video at a time; the live service
(:mod:`emonet.video.live`) steps every stream that has frames waiting. Both go through the same code, so a
stream gives the rows ``emonet-video`` gives for the same frames in the same chunks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np
import torch

from .geometry import landmarks_boxes
from .pipeline import Outputs, Pending, Pipeline, PlannedFace
from .results import FaceResult
from .tracking import Tracker, longer_side, set_many_landmarks

# The detector looks for small faces (its fine view: faces under its small_face_limit) on every
# SMALL_FACES_EVERY-th periodic detection frame, and on the look again after a loss while a small face is
# followed; on the others it sees the whole frame only, which finds every face from that limit on, and small
# faces already followed are followed on from their landmarks. A new small face is found within
# detect_every * SMALL_FACES_EVERY frames (half a second at 30 frames/s by default).
SMALL_FACES_EVERY = 3

# Hysteresis: a face the tracker already follows is kept down to HOLD_MARGIN under the detector's threshold,
# while a new face needs the threshold itself. A real face in compressed video dips under it from frame to
# frame; a face-like thing never starts a track.
HOLD_MARGIN = 0.1


@dataclass
class QueuedDetection:
    """One session's part of a step's detection (see :meth:`Scheduler.detect`): its chunk, which frames the
    detector sees, how many images it gave the detector, whether the first is the chunk's first frame held in
    standby, and the frames whose detection looks at the whole frame only."""

    session: "VideoPipeline"
    chunk: list                     # emonet.io.video.Frame
    flags: list[bool]
    count: int = 0
    standby: bool = False
    whole_only: frozenset = frozenset()
    standby_wanted: Optional[tuple] = None  # (small,): a standby look the scheduler adds if the detector runs
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

    session: "VideoPipeline"
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
    its results are still to be made (:meth:`VideoPipeline.results`)."""

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

    def _launch_detector(self, frames: list, small: list[bool]):
        if self.det_stream is None:
            return self.detector.launch([f.image for f in frames], small)
        waited: set = set()
        with torch.cuda.stream(self.det_stream):
            return self.detector.launch([f.on_device(self.engine.device, self.det_stream, waited) for f in frames],
                                        small)

    def _collect_detector(self, handle, min_score: Optional[float]) -> list:
        # On the detector's stream: its close look at the candidates (more network work) must not queue behind,
        # and wait for, the previous step's engine work on the main stream.
        with self._on_det_stream():
            return self.detector.collect(handle, min_score=min_score)

    def detect(self, items: Sequence[tuple["VideoPipeline", list]]) -> QueuedStep:
        """Each session decides which frames of its chunk the detector sees; all of them are queued in one call
        and taken one step on (:meth:`~emonet.detection.FaceDetector.advance`: the close look at the candidates
        queued), which waits for the detector's first network but not for the previous step's engine work."""
        planned = [session.plan_detection(chunk) for session, chunk in items]
        # A standby look rides along wherever the detector runs in this step anyway, whichever session's frames
        # make it run (a stream's chunk of one frame seldom has a detection frame of its own).
        detecting = any(picked for _, picked in planned)
        entries, frames, small = [], [], []
        for entry, picked in planned:
            if entry.standby_wanted and detecting:
                picked.insert(0, (entry.chunk[0], entry.standby_wanted[0]))
                entry.standby, entry.count = True, entry.count + 1
            entries.append(entry)
            frames += [f for f, _ in picked]
            small += [s for _, s in picked]
        step = QueuedStep(entries)
        for entry in entries:
            entry.step = step
        if frames:
            with self._on_det_stream():
                step.handle = self.detector.advance(self._launch_detector(frames, small))
        return step

    def launch(self, step: QueuedStep) -> PendingStep:
        """Collect the step's detections, let each session track and plan its faces, and queue every planned crop
        of every session through the engine in one batch (without waiting for it)."""
        # Every session of a scheduler has its detector, and so its threshold and hold margin.
        hold_score = step.entries[0].session.hold_score if step.entries else None
        boxes = self._collect_detector(step.handle, hold_score) if step.handle is not None else []
        takes, start = [], 0
        for entry in step.entries:
            takes.append(entry.session.take_detections(entry, boxes[start:start + entry.count]))
            start += entry.count
        # A loss known only now (the chunk before settled after this step's detection was queued): the chunk's
        # first frame looked at again, every such session's in one call, while the GPU waits.
        relooks = [t for t in takes if t.relook is not None]
        if relooks:
            handle = self._launch_detector([t.chunk[0] for t in relooks], [t.relook for t in relooks])
            for take, dets in zip(relooks, self._collect_detector(handle, hold_score)):
                take.looked_again(dets)
        chunks = [t.session.plan_faces(t) for t in takes]
        faces, pixels, waited = [], [], set()
        stream = torch.cuda.current_stream(self.engine.device) if self.det_stream is not None else None
        for chunk in chunks:
            offset = len(pixels)
            faces += [replace(f, image=f.image + offset) for f in chunk.pending.faces]
            if not chunk.pending.faces:
                pixels += [None] * len(chunk.frames)  # never read
            elif stream is not None:  # uploaded once (by the reader or decoder), shared with the detector
                pixels += [f.on_device(self.engine.device, stream, waited) for f in chunk.frames]
            else:
                pixels += [f.image for f in chunk.frames]
        return PendingStep(chunks, self.pipeline.launch(pixels, faces))

    def settle(self, step: PendingStep) -> list[SettledChunk]:
        """Wait for a step's outputs; each session's chunk settled (see :meth:`VideoPipeline.settle_outputs`).
        The arithmetic runs over every session's faces at once: a step of many streams holds a few faces each."""
        outputs = self.pipeline.read(step.pending)
        faces = [f for chunk in step.chunks for f in chunk.pending.faces]
        # Row by row, as each session alone: a track is in one session's chunk only.
        held, ok = set_many_landmarks([t for chunk in step.chunks for t in chunk.tracks], outputs.landmarks,
                                      references=[r for chunk in step.chunks for r in chunk.references],
                                      since=[n for chunk in step.chunks for n in chunk.since])
        own = landmarks_boxes(outputs.landmarks)  # each face's own box: the detection's, else its landmarks'
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


@dataclass
class _Take:
    """A session's detections for its chunk, taken in :meth:`Scheduler.launch` (see
    :meth:`VideoPipeline.take_detections`); ``relook``: the first frame is still to be looked at again, small
    faces too or not."""

    session: "VideoPipeline"
    chunk: list
    flags: list[bool]
    boxes: list
    whole_only: set
    relook: Optional[bool] = None

    def looked_again(self, dets: np.ndarray) -> None:
        """The first frame's look again, done (see :meth:`VideoPipeline.take_detections`)."""
        self.session._use_relook(self, dets, self.relook)
        self.relook = None


class VideoPipeline:
    """One video's (or live stream's) faces over time: frames in chunks -> per frame, its faces' results.

    The detector runs on every ``detect_every``-th frame, looking for small faces on every SMALL_FACES_EVERY-th
    of those, and again on the next chunk's first frame whenever a frame had no face, a face left the frame or
    its landmarks broke the bounds its last detection sets. Faces are tracked with stable ids
    (:class:`~emonet.tracking.Tracker`); between detections each face is cropped from its last landmarks' box by
    the training convention, held to its last detection (:func:`~emonet.tracking.bound_box`). Within a chunk, a
    frame between detections takes the landmarks of the last chunk's frames (a trade of crop freshness for
    batching: chunks of one frame use the previous frame's); detected frames are the same at any chunk size.

    Alone it steps through its own :class:`Scheduler`: :meth:`detect`, :meth:`launch`, :meth:`settle` (all the
    next launch needs), :meth:`results` (after the next launch, while the GPU runs it), or :meth:`finish` for
    the last two. ``standby`` (default: on a GPU, with a detector that queues its work there) queues the look
    again at a chunk's first frame with the chunk's other detections while the last chunk read lost a face (losses
    come in runs), used only where needed: a loss then costs no detection of its own while the GPU waits.
    """

    def __init__(self, pipeline: Pipeline, detect_every: int = 5, smooth: bool = True,
                 tracker: Optional[Tracker] = None, standby: Optional[bool] = None,
                 scheduler: Optional[Scheduler] = None) -> None:
        self.pipeline = pipeline
        self.scheduler = scheduler or Scheduler(pipeline)
        self.engine, self.detector = pipeline.engine, pipeline.detector
        self.detect_every = detect_every
        self.smooth = smooth
        self.tracker = tracker or Tracker()
        threshold = getattr(self.detector, "min_score", None)
        self.start_score = threshold if threshold is not None else 0.0
        self.hold_score = threshold - HOLD_MARGIN if threshold is not None else None
        # A face was lost (set when a chunk settles): the next chunk's first frame is looked at again.
        self.need_detection = False
        # Whether the last chunk read lost a face: losses come in runs, and the standby is queued only while they
        # do (otherwise its views would be GPU work thrown away nearly every chunk).
        self.losing = True
        self.seen = 0  # frames so far: the periodic detections fall on the same frames at any chunk size
        gpu = self.engine.device.type == "cuda"
        self.standby = gpu and getattr(self.detector, "queues", False) if standby is None else standby

    # -- one session alone, through its own scheduler ------------------------------------------------------
    def detect(self, chunk: list) -> tuple[list[bool], QueuedDetection]:
        """Queue the detector on the chunk's detection frames (see :meth:`Scheduler.detect`)."""
        entry = self.scheduler.detect([(self, chunk)]).entries[0]
        return entry.flags, entry

    def launch(self, chunk: list, flags: list[bool], queued: QueuedDetection) -> PendingStep:
        """Track and plan every frame of the chunk, crop, and queue EmoNet (without waiting for it)."""
        queued.flags = flags
        return self.scheduler.launch(queued.step)

    def settle(self, step: PendingStep) -> SettledChunk:
        """Wait for the chunk's outputs and hand each track its landmarks (see :meth:`settle_outputs`)."""
        return self.scheduler.settle(step)[0]

    def finish(self, step: PendingStep) -> list[list[FaceResult]]:
        """Per frame of the chunk, its faces' results (:meth:`settle`, then :meth:`results`)."""
        return self.results(self.settle(step))

    # -- the session's own decisions, called by the scheduler ----------------------------------------------
    def plan_detection(self, chunk: list) -> tuple[QueuedDetection, list[tuple]]:
        """Which frames of the chunk the detector sees, and whether it looks for small faces in each: every
        ``detect_every``-th frame counted from the first, whatever the chunks, small faces on every
        SMALL_FACES_EVERY-th of them; and the chunk's first frame looked at again where a loss is known already
        (its chunk settled before this one's detection), or in standby (see the class)."""
        flags, small, whole_only = [], [], set()
        for frame in chunk:
            full = self.seen % (self.detect_every * SMALL_FACES_EVERY) == 0
            flags.append(full or self.seen % self.detect_every == 0)
            # A frame whose small faces the detector does not look for apart (a small frame, another detector)
            # is never whole-only: all of it is looked at every time.
            if flags[-1] and not full and self.detector.small_face_limit(frame.shape) > 0:
                whole_only.add(frame.index)
            small.append(frame.index not in whole_only)
            self.seen += 1
        relook_small = self._relook_small(chunk[0].shape)
        known = self.need_detection
        if known and flags[0] and relook_small and chunk[0].index in whole_only:
            whole_only.discard(chunk[0].index)  # looked at as the look again needs: small faces too
            small[0] = True
        picked = [(f, s) for f, s, d in zip(chunk, small, flags) if d]
        # A first frame detected anyway is looked at again only after a loss, not twice in every such chunk.
        if not flags[0] and known:  # a loss known now: looked at again in any case
            picked.insert(0, (chunk[0], relook_small))
        entry = QueuedDetection(self, chunk, flags, len(picked), not flags[0] and known, frozenset(whole_only))
        if not flags[0] and not known and self.standby and self.losing:
            # In standby, where the step's detector runs anyway (the scheduler decides): small faces or not.
            entry.standby_wanted = (relook_small,)
        return entry, picked

    def take_detections(self, entry: QueuedDetection, boxes: list) -> _Take:
        """The chunk's detections as the tracker will take them; where the chunk before lost a face after this
        chunk's detection was queued, its first frame is to be looked at again (unless it was already as the look
        needs, or is in standby): :attr:`_Take.relook` then says whether for small faces too."""
        boxes = list(boxes)
        flags, whole_only = entry.flags, set(entry.whole_only)
        standby = boxes.pop(0) if entry.standby else None
        take = _Take(self, entry.chunk, flags, boxes, whole_only)
        first = entry.chunk[0].index
        small = self.need_detection and self._relook_small(entry.chunk[0].shape)
        looked = flags[0] and (first not in whole_only or not small)
        if self.need_detection and not looked:
            if standby is None:
                take.relook = small
            else:
                self._use_relook(take, standby, small)
        return take

    def _use_relook(self, take: _Take, dets: np.ndarray, small: bool) -> None:
        first = take.chunk[0].index
        if take.flags[0]:
            take.boxes[0] = dets
        else:
            take.flags[0] = True
            take.boxes.insert(0, dets)
        if small:
            take.whole_only.discard(first)
        else:
            take.whole_only.add(first)

    def plan_faces(self, take: _Take) -> PendingChunk:
        """Track every frame of the chunk and plan its faces' crops (image indices within the chunk)."""
        self.need_detection = False
        chunk, flags, whole_only = take.chunk, take.flags, take.whole_only
        detections = iter(take.boxes)
        planned, tracks, references, since = [], [], [], []
        max_faces = self.pipeline.max_faces
        for i, (frame, is_det) in enumerate(zip(chunk, flags)):
            if is_det:
                dets = next(detections)
                unseen = self.detector.small_face_limit(frame.shape) if frame.index in whole_only else 0.0
                followed = self.tracker.update(dets[:max_faces] if max_faces else dets, frame.index,
                                               start_score=self.start_score, unseen_below=unseen)
            else:
                followed = self.tracker.active
            if max_faces:  # the most recently detected first (a small face followed unseen beside a new one)
                followed = sorted(followed, key=lambda t: -t.det_frame)[:max_faces]
            for track in followed:
                if track.det_frame == frame.index:  # the detector saw it on this frame
                    box = track.box.copy()  # a snapshot: a later frame of the chunk moves the track on
                    planned.append(PlannedFace(i, frame.index, track.id, box, track.score, True,
                                               self.detector.crop_matrix(box, frame.shape)))
                else:
                    # From the last landmarks or, where the detector saw the face later (earlier in this
                    # chunk), from its box: whichever is newer.
                    matrix = track.crop_matrix()
                    if matrix is None:
                        matrix = self.detector.crop_matrix(track.box, frame.shape)
                    # No detector score: the detector did not see this frame (rows say detected=0).
                    planned.append(PlannedFace(i, frame.index, track.id, None, float("nan"), False, matrix))
                tracks.append(track)
                references.append(track.det_box if track.det_box is not None else track.box)
                since.append(frame.index - track.det_frame)
        return PendingChunk(self, chunk, Pending(planned), tracks, references, since)

    def settle_outputs(self, chunk: PendingChunk, outputs: Outputs, held: np.ndarray, lost: bool) -> SettledChunk:
        """Hand each track its landmarks' box as held to its bounds (``held``, from :meth:`Scheduler.settle`), and
        decide whether the next chunk's first frame is looked at again (``lost``: a face broke its bounds, left the
        frame or collapsed; or a frame had no face): all that the next launch needs of this chunk. Its results are
        made by :meth:`results`."""
        faces = chunk.pending.faces
        if lost:
            self.need_detection = True
        # The box reported: the detection's on a detected frame; else the landmarks', held to the bounds of the
        # track's last detection, as it is cropped.
        boxes = []
        for face, track, box in zip(faces, chunk.tracks, held):
            if face.detected:
                boxes.append(face.box)
            else:
                if face.frame > track.det_frame:  # not older than the track's last detection (a later frame's)
                    track.box = box.copy()
                boxes.append(box.copy())
        if len({f.image for f in faces}) < len(chunk.frames):  # a frame without a face
            self.need_detection = True
        self.losing = self.need_detection
        return SettledChunk(chunk, outputs, boxes)

    def results(self, settled: SettledChunk) -> list[list[FaceResult]]:
        """Per frame of a settled chunk, its faces' results. Call it once per chunk, in the chunks' order: each
        track's smoothing takes its faces in frame order."""
        chunk = settled.chunk
        smoothers = [t.smoother for t in chunk.tracks] if self.smooth else None
        results = self.pipeline.results(chunk.pending, settled.outputs, smoothers, settled.boxes)
        per_frame: list[list[FaceResult]] = [[] for _ in chunk.frames]
        for face, result in zip(chunk.pending.faces, results):
            per_frame[face.image].append(result)
        return per_frame

    def _relook_small(self, shape: tuple) -> bool:
        """Whether a look again after a loss, at a frame of ``shape``, looks for small faces: while the tracker
        follows one (it may be the face lost; the whole frame alone would not find it), or where the detector
        looks at small and large faces alike (a small frame: nothing to leave out)."""
        limit = self.detector.small_face_limit(shape)
        if limit <= 0:
            return True
        return any(longer_side(t.det_box) < limit for t in self.tracker.tracks if t.det_box is not None)
