"""One path for every face: images -> detect -> crops -> engine -> :class:`~emonet.results.FaceResult`.

Photos, video frames and dataset images all go through :class:`Pipeline`. A face is first *planned*
(:class:`PlannedFace`: which image, which id, the box and score as they are at that moment, and the crop
matrix), then every planned face of a batch of images is cropped and run through the engine in one call
(:meth:`Pipeline.launch`), and :meth:`Pipeline.collect` turns the outputs into results: the one place
where that happens. :class:`VideoPipeline` adds tracking, which decides which frames are re-detected and
where faces are cropped in between; it plans from a snapshot of each track, so a row always carries its
own frame's box and score, whatever the batch size.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import cv2
import numpy as np
import torch

from .cli import say
from .detection import FaceDetector
from .detection.whole import WholeImageDetector
from .engine import Engine
from .engine.graphs import synchronize
from .geometry import CROP_SIZE, box_to_matrix, crop_frames, crop_to_image, landmarks_box, landmarks_boxes, to_tensor
from .results import FaceResult
from .tracking import Tracker, longer_side, set_many_landmarks


@dataclass(frozen=True)
class PlannedFace:
    """A face to read: its image (index in the batch), id, box and score as planned, and its crop."""

    image: int                      # index of the image in the batch handed to launch
    frame: int                      # index recorded in the result (photo number, frame number)
    face_id: int
    box: Optional[np.ndarray]       # x1, y1, x2, y2; None: the result's box is its own landmarks' box
    score: float
    detected: bool
    matrix: np.ndarray              # image -> crop affine


@dataclass
class Pending:
    """Planned faces whose engine outputs are on their way back (one copy, waited for in collect)."""

    faces: list[PlannedFace]
    outputs: Optional[torch.Tensor] = None   # per face: logits, valence, arousal, 68 x 2 landmarks (crop px)
    done: Optional["torch.cuda.Event"] = None
    flipped: bool = False                    # two more columns: the mirrored crop's valence and arousal


@dataclass
class Outputs:
    """A launch's outputs on the host (see :meth:`Pipeline.read`)."""

    values: np.ndarray               # (n, classes + 2): per face its raw logits, valence and arousal
    landmarks: np.ndarray            # (n, 68, 2): x, y in image pixels


Smoother = Callable[[np.ndarray], np.ndarray]


class Pipeline:
    """``pipeline(images)`` -> per image, a list of :class:`FaceResult` (RGB uint8 ``(H, W, 3)`` images in)."""

    def __init__(self, engine: Engine, detector: Optional[FaceDetector] = None, refine: bool = False,
                 max_faces: Optional[int] = None) -> None:
        self.engine = engine
        self.detector = detector
        self.whole_image = isinstance(detector, WholeImageDetector)
        self.refine = refine and not self.whole_image
        self.max_faces = max_faces

    # -- the steps ---------------------------------------------------------------------------
    def plan(self, images: Sequence[np.ndarray], detections: Sequence[np.ndarray],
             frames: Optional[Sequence[int]] = None) -> list[PlannedFace]:
        """Every detected face of every image, cropped by the detector's convention; ids are per-image indices."""
        planned = []
        for i, (image, dets) in enumerate(zip(images, detections)):
            for k, det in enumerate(dets[: self.max_faces] if self.max_faces else dets):
                box = np.asarray(det[:4], dtype=np.float64)
                planned.append(PlannedFace(i, frames[i] if frames is not None else i, k, box, float(det[4]), True,
                                           self.detector.crop_matrix(box, image.shape)))
        return planned

    def crops(self, images: Sequence, faces: Sequence[PlannedFace]) -> torch.Tensor:
        """The planned faces' ``(N, 3, 256, 256)`` uint8 crops on the engine's device (images: arrays or
        ``(H, W, 3)`` tensors already there)."""
        if self.whole_image:
            # Exactly the released demo's preprocessing: the whole image resized to 256x256.
            resized = [cv2.resize(np.asarray(images[f.image]), (CROP_SIZE, CROP_SIZE)) for f in faces]
            return to_tensor(np.stack(resized)) if resized else torch.zeros(0, 3, CROP_SIZE, CROP_SIZE,
                                                                             dtype=torch.uint8)
        return crop_frames(images, [(f.image, f.matrix) for f in faces], self.engine.device)

    def launch(self, images: Sequence, faces: list[PlannedFace], crops: Optional[torch.Tensor] = None,
               flip: bool = False) -> Pending:
        """Crop the planned faces (unless ``crops`` are given, one per face) and queue them through the
        engine; the outputs come back without waiting. ``flip`` also reads the mirrored crops (the
        evaluation protocol's test-time flip, spec §7)."""
        pending = Pending(faces, flipped=flip)
        if not faces:
            return pending
        if crops is None:
            crops = self.crops(images, faces)
        out = self.engine(crops)
        # Every output leaves the device in one copy (landmarks decoded there).
        columns = [out["expression"], out["valence"][:, None], out["arousal"][:, None], out["landmarks"].flatten(1)]
        if flip:
            mirrored = self.engine(crops.flip(-1))
            columns += [mirrored["valence"][:, None], mirrored["arousal"][:, None]]
        packed = torch.cat(columns, dim=1)
        if packed.device.type == "cuda":
            pending.outputs = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            pending.outputs.copy_(packed, non_blocking=True)
            pending.done = torch.cuda.Event()
            pending.done.record()
        else:
            pending.outputs = packed
        return pending

    def collect(self, pending: Pending, smoothers: Optional[Sequence[Optional[Smoother]]] = None) -> list[FaceResult]:
        """The planned faces' results, in order (waits for them): :meth:`read`, then :meth:`results`.

        ``smoothers`` (one per face, or None) map a face's raw ``logits, valence, arousal`` to the values
        reported (video smoothing, spec §6); the landmarks are never smoothed.
        """
        return self.results(pending, self.read(pending), smoothers)

    def read(self, pending: Pending) -> Outputs:
        """Wait for a launch's outputs: per face its raw values and its landmarks in image pixels."""
        n = self.engine.n_expression
        if not pending.faces:
            return Outputs(np.zeros((0, n + 2)), np.zeros((0, 68, 2)))
        if pending.done is not None:
            pending.done.synchronize()
        outputs = pending.outputs.numpy().astype(np.float64)
        if pending.flipped:
            # Valence and arousal: the mean of the crop's and the mirrored crop's raw outputs, clamped after;
            # the expression and landmarks are the unflipped crop's (spec §7).
            outputs[:, n:n + 2] = (outputs[:, n:n + 2] + outputs[:, -2:]) / 2
            outputs = outputs[:, :-2]
        landmarks = crop_to_image([f.matrix for f in pending.faces], outputs[:, n + 2:].reshape(len(outputs), -1, 2))
        return Outputs(outputs[:, :n + 2], landmarks)

    def results(self, pending: Pending, outputs: Outputs, smoothers: Optional[Sequence[Optional[Smoother]]] = None,
                boxes: Optional[Sequence[np.ndarray]] = None) -> list[FaceResult]:
        """The planned faces' results from their outputs (see :meth:`collect`): the one place network outputs
        become results. ``boxes``: each face's box as reported (default: its planned box, else its landmarks')."""
        n = self.engine.n_expression
        results = []
        for k, face in enumerate(pending.faces):
            landmarks = outputs.landmarks[k]
            if boxes is not None:
                box = boxes[k]
            else:
                box = face.box if face.box is not None else landmarks_box(landmarks)
            raw = outputs.values[k]
            smooth = smoothers[k] if smoothers is not None else None
            values = smooth(raw) if smooth is not None else raw
            probs = np.exp(values[:n] - values[:n].max())
            probs /= probs.sum()
            results.append(FaceResult(
                frame=face.frame, face_id=face.face_id, box=box,
                score=face.score, detected=face.detected, expression=int(probs.argmax()), probabilities=probs,
                valence=float(np.clip(values[n], -1, 1)), arousal=float(np.clip(values[n + 1], -1, 1)),
                landmarks=landmarks, matrix=face.matrix))
        return results

    # -- photos and dataset images ---------------------------------------------------------------
    def __call__(self, images: Sequence[np.ndarray], boxes: Optional[Sequence[np.ndarray]] = None,
                 frames: Optional[Sequence[int]] = None) -> list[list[FaceResult]]:
        """Faces of each image; ``boxes`` (per image ``(k, 5)``) skips detection when given."""
        if boxes is None and self.detector is None:
            raise ValueError("this pipeline has no detector: pass the faces' boxes")
        detections = list(boxes) if boxes is not None else self.detector.detect(images)
        planned = self.plan(images, detections, frames)
        results = self.collect(self.launch(images, planned))
        if self.refine and results:
            # Second pass: re-crop from EmoNet's own landmarks with the training convention (spec §5); the
            # box reported is then the landmarks' box.
            planned = [PlannedFace(f.image, f.frame, f.face_id, None, f.score, f.detected,
                                   box_to_matrix(landmarks_box(r.landmarks))) for f, r in zip(planned, results)]
            results = self.collect(self.launch(images, planned))
        per_image: list[list[FaceResult]] = [[] for _ in images]
        for face, result in zip(planned, results):
            per_image[face.image].append(result)
        return per_image

    def warmup(self, shape: tuple = (720, 1280, 3), log: Optional[Callable[[str], None]] = None) -> float:
        """On a GPU, run detection (its close look too), cropping, EmoNet and landmark decoding once on a blank
        ``shape`` image.

        The engine warms itself at load; this pays the rest of the first image's one-off costs (the
        detector's autotuning and graphs, lazy loading of kernels) and reports them on one line. Where graphs
        are prepared in the background it is one eager pass that loads the kernels the first images would
        wait for, while the graphs are captured. Nothing on a CPU (nothing to pay ahead), nor for an engine
        built without warm-up. ``log`` takes the report line (default: standard error). Returns the seconds
        spent.
        """
        if self.engine.device.type != "cuda" or not self.engine.config.warmup:
            return 0.0
        t0 = time.perf_counter()
        if self.detector is not None:
            self.detector.warmup(shape)
        h, w = shape[:2]
        self([np.zeros(shape, np.uint8)], boxes=[np.array([[w / 4, h / 4, w / 2, h / 2, 1.0]])])
        synchronize(self.engine.device)
        seconds = time.perf_counter() - t0
        what = "first kernels" if self.engine.config.background else "detector autotuning, first kernels"
        (log or say)(f"pipeline warm-up ({what}): {seconds:.2f} s")
        return seconds


# In video the detector looks for small faces (its fine view: faces under its small_face_limit) on every
# SMALL_FACES_EVERY-th periodic detection frame, and on the look again after a loss while a small face is
# followed; on the others it sees the whole frame only, which finds every face from that limit on, and small
# faces already followed are followed on from their landmarks. A new small face is found within
# detect_every * SMALL_FACES_EVERY frames (half a second at 30 frames/s by default); the fine view is most of the
# detector's cost (docs/PERFORMANCE.md).
SMALL_FACES_EVERY = 3

# Hysteresis: a face the tracker already follows is kept down to HOLD_MARGIN under the detector's threshold,
# while a new face needs the threshold itself. A real face in compressed video dips under it from frame to
# frame (a real 640x360 clip: a quarter of its detection frames within 0.07 under the threshold, with the close
# look's front model alone); a face-like thing never starts a track.
HOLD_MARGIN = 0.1


@dataclass
class QueuedDetection:
    """A chunk's detection on its way (see :meth:`VideoPipeline.detect`): the detector's handle, whether its first
    image is the chunk's first frame held in standby, and the frames whose detection looks at the whole frame only."""

    handle: object
    standby: bool = False
    whole_only: frozenset = frozenset()


@dataclass
class PendingChunk:
    """A chunk of video frames whose faces are planned and queued (see :class:`VideoPipeline`)."""

    frames: list                    # emonet.io.video.Frame
    pending: Pending
    tracks: list                    # the Track of each planned face


@dataclass
class SettledChunk:
    """A chunk whose outputs have come back and whose tracks have their landmarks (see
    :meth:`VideoPipeline.settle`); its results are still to be made."""

    chunk: PendingChunk
    outputs: Outputs
    boxes: list[np.ndarray]         # each face's box as reported


class VideoPipeline:
    """Frames in chunks -> per frame, its faces' results, with tracking between detections.

    The detector runs on every ``detect_every``-th frame, looking for small faces on every
    SMALL_FACES_EVERY-th of those, and again on the next chunk's first frame whenever a frame had no face, a
    face left the frame or its landmarks broke the bounds its last detection sets (the next frame at
    ``batch_size=1``): that look sees the whole frame, and looks for small faces too while a small face is
    followed. Faces are tracked with stable ids (:class:`~emonet.tracking.Tracker`), and between detections
    each face is cropped from its last landmarks' box by the training convention, held to its last detection
    (:func:`~emonet.tracking.bound_box`). Within a chunk, a frame between detections takes the landmarks of
    the last chunk's frames (a trade of crop freshness for batching: ``batch_size=1`` uses the previous
    frame's); detected frames are the same at any chunk size.

    Steps a chunk, so that on a GPU the next chunk's detection runs while this one's results are read:
    :meth:`detect` (queue the detector, its close look too), :meth:`launch` (track, plan, crop, queue EmoNet),
    :meth:`settle` (wait for the outputs, hand the tracks their landmarks: all the next launch needs) and
    :meth:`results` (smooth, make the results; after the next launch, while the GPU runs it), or :meth:`finish`
    for both. Whether a chunk's first frame must be looked at again is known only in :meth:`settle`, after the next
    chunk's detection was queued; ``standby`` (default:
    on a GPU, with a detector that queues its work there) queues that look with the chunk's other detections
    anyway while the last chunk read (the one before the previous) lost a face, used only where needed, so that a
    loss in a run of them costs no detection of its own while the GPU waits (the boxes that detection would give,
    to float rounding: a frame's detection moves by that much with the frames batched beside it).
    """

    def __init__(self, pipeline: Pipeline, detect_every: int = 5, smooth: bool = True,
                 tracker: Optional[Tracker] = None, standby: Optional[bool] = None) -> None:
        self.pipeline = pipeline
        self.engine, self.detector = pipeline.engine, pipeline.detector
        self.detect_every = detect_every
        self.smooth = smooth
        self.tracker = tracker or Tracker()
        threshold = getattr(self.detector, "min_score", None)
        self.start_score = threshold if threshold is not None else 0.0
        self.hold_score = threshold - HOLD_MARGIN if threshold is not None else None
        self.need_detection = True
        # Whether the last chunk read lost a face: losses come in runs (landmarks that do not follow the faces
        # break their bounds chunk after chunk; landmarks that do, seldom), and the standby is queued only while
        # they do: otherwise its views would be GPU work thrown away nearly every chunk.
        self.losing = True
        self.seen = 0  # frames of the video so far: the periodic detections fall on the same frames at any chunk size
        # The detector gets a stream of its own: a chunk's detection then runs beside, and waits for
        # nothing of, the previous chunk's EmoNet work; high priority, so its few small kernels get the
        # SMs as EmoNet's blocks finish instead of queueing behind all of them.
        gpu = self.engine.device.type == "cuda"
        self.det_stream = torch.cuda.Stream(self.engine.device, priority=-1) if gpu else None
        self.standby = gpu and getattr(self.detector, "queues", False) if standby is None else standby

    def _launch_detector(self, frames: list, small: Optional[list[bool]] = None):
        if self.det_stream is None:
            return self.detector.launch([f.image for f in frames], small)
        with torch.cuda.stream(self.det_stream):
            return self.detector.launch([f.on_device(self.engine.device, self.det_stream) for f in frames], small)

    def _advance_detector(self, handle):
        # On the detector's stream, like its launch: the candidates' close look queued now waits for nothing of
        # the previous chunk's EmoNet work, and has mostly finished by the time launch() collects it.
        with torch.cuda.stream(self.det_stream) if self.det_stream is not None else contextlib.nullcontext():
            return self.detector.advance(handle)

    def _collect_detector(self, handle) -> list:
        # On the detector's stream: its close look at the candidates (more network work) must not queue
        # behind, and wait for, the previous chunk's EmoNet work on the main stream.
        with torch.cuda.stream(self.det_stream) if self.det_stream is not None else contextlib.nullcontext():
            return self.detector.collect(handle, min_score=self.hold_score)

    def detect(self, chunk: list) -> tuple[list[bool], Optional[QueuedDetection]]:
        """Decide which frames of the chunk run the detector, and queue it on them (``launch`` collects). A
        detector that works in steps is taken one step on (:meth:`~emonet.detection.FaceDetector.advance`: the
        close look at its candidates queued), which waits for its first network but not for the previous
        chunk's EmoNet work, queued before: that runs meanwhile.

        Every ``detect_every``-th frame of the video, counted from its first, whatever the chunks, small faces
        looked for on every SMALL_FACES_EVERY-th of them, and the video's first frame; with ``standby``, the
        chunk's first frame too, where it is no detection frame and another frame of the chunk is, as
        :meth:`launch` would look at it again, for it to use if the previous chunk lost a face (only while the last
        chunk read, the one before it, lost one: losses come in runs).
        """
        flags, small, whole_only = [], [], set()
        for frame in chunk:
            full = self.need_detection or self.seen % (self.detect_every * SMALL_FACES_EVERY) == 0
            flags.append(full or self.seen % self.detect_every == 0)
            # A frame whose small faces the detector does not look for apart (a small frame, another detector)
            # is never whole-only: all of it is looked at every time.
            if flags[-1] and not full and self.detector.small_face_limit(frame.shape) > 0:
                whole_only.add(frame.index)
            small.append(frame.index not in whole_only)
            self.seen += 1
            self.need_detection = False
        picked = [(f, s) for f, s, d in zip(chunk, small, flags) if d]
        relook_small = self._relook_small(chunk[0].shape)
        # It rides with the chunk's other detections; a first frame detected anyway (whole-only, while a small face
        # is followed) is looked at again only after a loss, not twice in every such chunk.
        standby = self.standby and self.losing and bool(picked) and not flags[0]
        if standby:
            picked.insert(0, (chunk[0], relook_small))
        if not picked:
            return flags, None
        handle = self._advance_detector(self._launch_detector([f for f, _ in picked], [s for _, s in picked]))
        return flags, QueuedDetection(handle, standby, frozenset(whole_only))

    def launch(self, chunk: list, flags: list[bool], queued: Optional[QueuedDetection]) -> PendingChunk:
        """Track and plan every frame of the chunk, crop, and queue EmoNet (without waiting for it)."""
        boxes = self._collect_detector(queued.handle) if queued is not None else []
        whole_only = set(queued.whole_only) if queued is not None else set()
        standby = boxes.pop(0) if queued is not None and queued.standby else None
        first = chunk[0].index
        # The previous chunk lost a face after this one's detection was queued: its first frame is looked at
        # again, unless it was already as the look needs (the tracks are as when detect() queued the standby).
        small = self.need_detection and self._relook_small(chunk[0].shape)
        looked = flags[0] and (first not in whole_only or not small)
        if self.need_detection and not looked:
            if standby is None:  # look now, while the GPU waits
                standby = self._collect_detector(self._launch_detector(chunk[:1], [small]))[0]
            if flags[0]:
                boxes[0] = standby
            else:
                flags[0] = True
                boxes.insert(0, standby)
            if small:
                whole_only.discard(first)
            else:
                whole_only.add(first)
        self.need_detection = False
        detections = iter(boxes)
        planned, tracks = [], []
        max_faces = self.pipeline.max_faces
        for i, (frame, is_det) in enumerate(zip(chunk, flags)):
            if is_det:
                dets = next(detections)
                unseen = 0.0
                if frame.index in whole_only:
                    unseen = self.detector.small_face_limit(frame.shape)
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
        if self.det_stream is not None and planned:  # uploaded once (by the reader), shared with the detector
            stream = torch.cuda.current_stream(self.engine.device)
            pixels = [f.on_device(self.engine.device, stream) for f in chunk]
        else:
            pixels = [f.image for f in chunk]
        return PendingChunk(chunk, self.pipeline.launch(pixels, planned), tracks)

    def finish(self, chunk: PendingChunk) -> list[list[FaceResult]]:
        """Per frame of the chunk, its faces' results; the tracks take their landmarks for the next crops
        (:meth:`settle`, then :meth:`results`)."""
        return self.results(self.settle(chunk))

    def settle(self, chunk: PendingChunk) -> SettledChunk:
        """Wait for the chunk's outputs and hand each track its landmarks, deciding whether the next chunk's first
        frame is looked at again: all that the next :meth:`launch` needs of this chunk. Its results are made by
        :meth:`results`, which may come after that launch: the GPU then works meanwhile."""
        outputs = self.pipeline.read(chunk.pending)
        faces = chunk.pending.faces
        held, ok = set_many_landmarks(chunk.tracks, outputs.landmarks, [f.frame for f in faces])
        detected = np.array([f.detected for f in faces], bool)
        own = landmarks_boxes(outputs.landmarks)  # each face's own box: the detection's, else its landmarks'
        for k, face in enumerate(faces):
            if face.box is not None:
                own[k] = face.box
        if (~ok & ~detected).any():
            self.need_detection = True  # the landmarks' box broke its bounds: the detector looks again
        shapes = np.array([chunk.frames[f.image].shape[:2] for f in faces], np.float64).reshape(-1, 2)
        x1, y1, x2, y2 = own.T
        if ((x2 < 0) | (y2 < 0) | (x1 > shapes[:, 1]) | (y1 > shapes[:, 0]) | ((x2 - x1) < 8)).any():
            self.need_detection = True  # a face left the frame or collapsed: look again
        # The box reported: the detection's on a detected frame; else the landmarks', held to the bounds of the
        # track's last detection, as it is cropped.
        boxes = []
        for face, track, box in zip(faces, chunk.tracks, held):
            if face.detected:
                boxes.append(face.box)
            else:
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
