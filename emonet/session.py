"""A session of the scheduler (:mod:`emonet.scheduler`): one video's or one live stream's faces over time — which
frames the detector sees, the faces it follows with stable ids, where they are cropped between detections, and
their smoothing. The scheduler steps many sessions together; a session alone steps through a scheduler of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .detection.close_look import LookMemory
from .pipeline import Outputs, Pending, Pipeline, PlannedFace
from .results import FaceResult
from .scheduler import PendingChunk, PendingStep, QueuedDetection, Scheduler, SettledChunk
from .tracking import Tracker, longer_side

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
    memory: Optional[LookMemory] = None  # what the look again reads

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
        # Candidates verified at the last periodic detection carry their verdict (see LookMemory).
        self.look_memory = LookMemory()
        gpu = self.engine.device.type == "cuda"
        self.standby = gpu and getattr(self.detector, "queues", False) if standby is None else standby

    # -- one session alone, through its own scheduler ------------------------------------------------------
    def detect(self, chunk: list) -> tuple[list[bool], QueuedDetection]:
        """Queue the detector on the chunk's detection frames (see :meth:`Scheduler.detect`)."""
        entry = self.scheduler.detect([(self, chunk)]).entries[0]
        return entry.flags, entry

    def launch(self, chunk: list, flags: list[bool], queued: QueuedDetection) -> PendingStep:
        """Track and plan every frame of the chunk, crop, and queue EmoNet (without waiting for it); once per
        :meth:`detect`."""
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
        """Which frames of the chunk the detector sees, ``(frame, small faces too, memory or None)`` each: every
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
        # A periodic detection frame reads and updates the session's memory of verified candidates; a look again
        # (after a loss) reads it as it is now, before this chunk (the same whenever the loss was known), and
        # changes nothing.
        picked = [(f, s, self.look_memory) for f, s, d in zip(chunk, small, flags) if d]
        again = self.look_memory.copy() if self.look_memory is not None else None
        # A first frame detected anyway is looked at again only after a loss, not twice in every such chunk.
        if not flags[0] and known:  # a loss known now: looked at again in any case
            picked.insert(0, (chunk[0], relook_small, again))
        entry = QueuedDetection(self, chunk, flags, len(picked), not flags[0] and known, frozenset(whole_only),
                                relook_memory=again)
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
        take = _Take(self, entry.chunk, flags, boxes, whole_only, memory=entry.relook_memory)
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
        made: dict[int, tuple] = {}  # track id -> what its last crop came from, and the crop

        def crop_of(track, shape: tuple) -> np.ndarray:
            # From the last landmarks or, where the detector saw the face later (earlier in this chunk), from its
            # box: whichever is newer. Made once for each box, not once a frame.
            known = made.get(track.id)
            if not (known and known[0] is track.crop_box and known[1] is track.box
                    and known[2:4] == (track.detected_since, shape)):
                matrix = track.crop_matrix()
                if matrix is None:
                    matrix = self.detector.crop_matrix(track.box, shape)
                known = made[track.id] = (track.crop_box, track.box, track.detected_since, shape, matrix)
            return known[4].copy()

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
                    matrix = crop_of(track, frame.shape)
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
