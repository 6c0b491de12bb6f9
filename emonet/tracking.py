"""Faces over time: stable ids by box overlap, crops between detections from the last landmarks, smoothing.

Smoothing (spec §6): a weighted mean of a face's last 5 raw output vectors (logits, valence, arousal),
weights oldest to newest 0.1, 0.1, 0.15, 0.25, 0.4, normalised over the frames seen so far, so a new
face is not dragged towards zero as the released model's zero-initialised buffer does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .geometry import box_to_matrix, landmarks_boxes

SMOOTHING_WEIGHTS = np.array([0.1, 0.1, 0.15, 0.25, 0.4])

# Between detections a face is cropped from EmoNet's own landmarks; poor landmarks (a turned head, an
# occlusion, weights that do not fit the footage) would let the box drift and grow frame after frame. It
# is held to its last detection: its size within this factor either way, its centre moving at most
# MAX_SPEED face sizes a frame since then (a head crossing a 30 frames/s view in well under a second).
MAX_SCALE = 1.5
MAX_SPEED = 0.25


def longer_side(box: np.ndarray) -> float:
    """An ``x1, y1, x2, y2`` box's longer side."""
    return float(max(box[2] - box[0], box[3] - box[1]))


def bound_box(box: np.ndarray, reference: np.ndarray, frames: int) -> tuple[np.ndarray, bool]:
    """``box`` held to ``reference`` (the last detection, ``frames`` frames ago): its size within
    :data:`MAX_SCALE` either way and its centre within ``MAX_SPEED * frames`` face sizes; returns the box
    and whether it was within those bounds already (float64 arithmetic)."""
    boxes, ok = bound_boxes(np.asarray(box)[None], np.asarray(reference)[None], np.array([frames]))
    return boxes[0], bool(ok[0])


def bound_boxes(boxes: np.ndarray, references: np.ndarray, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bound_box` of ``(n, 4)`` boxes against their ``(n, 4)`` references, ``(n,)`` frames apart, at once:
    the boxes ``(n, 4)`` and whether each was within its bounds already ``(n,)``."""
    boxes, references = np.asarray(boxes, np.float64), np.asarray(references, np.float64)
    size = np.maximum(((boxes[:, 2] - boxes[:, 0]) + (boxes[:, 3] - boxes[:, 1])) / 2, 1e-6)
    ref_size = np.maximum(((references[:, 2] - references[:, 0]) + (references[:, 3] - references[:, 1])) / 2, 1e-6)
    ratio = size / ref_size
    scale = np.clip(ratio, 1 / MAX_SCALE, MAX_SCALE)
    centre, ref_centre = (boxes[:, :2] + boxes[:, 2:]) / 2, (references[:, :2] + references[:, 2:]) / 2
    shift, limit = centre - ref_centre, MAX_SPEED * ref_size * np.maximum(frames, 1)
    distance = np.hypot(shift[:, 0], shift[:, 1])
    ok = (np.abs(scale - ratio) < 1e-9) & (distance <= limit)
    out = boxes.copy()
    if ok.all():
        return out, ok
    far = distance > limit
    centre[far] = ref_centre[far] + shift[far] * (limit[far] / distance[far])[:, None]
    half = (boxes[:, 2:] - boxes[:, :2]) / 2 * (scale * ref_size / size)[:, None]
    out[~ok] = np.concatenate([centre - half, centre + half], axis=1)[~ok]
    return out, ok


class Smoother:
    """Spec §6 temporal smoothing of one face's raw outputs."""

    def __init__(self, weights: np.ndarray = SMOOTHING_WEIGHTS) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)
        self.history: Optional[np.ndarray] = None  # the last len(weights) vectors, oldest first
        self.seen = 0

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        """Add the newest raw vector; return the smoothed one."""
        raw = np.asarray(raw, dtype=np.float64)
        if self.history is None:
            self.history = np.zeros((len(self.weights), len(raw)))
        self.history[:-1] = self.history[1:]  # a row per frame: cheaper than stacking a deque each time
        self.history[-1] = raw
        self.seen = min(self.seen + 1, len(self.weights))
        w = self.weights[-self.seen:]
        return w @ self.history[-self.seen:] / w.sum()


def _max(a, b) -> np.ndarray:
    """Python's ``max(a, b)`` elementwise: ``a`` unless ``b`` is greater (a NaN ``a`` is kept, a NaN ``b`` not)."""
    return np.where(b > a, b, a)


def _min(a, b) -> np.ndarray:
    """Python's ``min(a, b)`` elementwise: ``a`` unless ``b`` is less."""
    return np.where(b < a, b, a)


def _ious(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`iou` of boxes broadcast against each other (``(..., 4)``), with Python's ``max`` and ``min`` for the
    corners (not NumPy's ``maximum``, which spreads a NaN where they do not): what a track's matching asks of it."""
    x1, y1 = _max(a[..., 0], b[..., 0]), _max(a[..., 1], b[..., 1])
    x2, y2 = _min(a[..., 2], b[..., 2]), _min(a[..., 3], b[..., 3])
    inter = _max(0.0, x2 - x1) * _max(0.0, y2 - y1)
    union = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1]) + (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1]) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two ``x1, y1, x2, y2`` boxes (float64)."""
    return float(_ious(np.asarray(a, np.float64)[:4], np.asarray(b, np.float64)[:4]))


@dataclass
class Track:
    """One face followed over frames."""

    id: int
    box: np.ndarray                       # latest box (detector's, or from the landmarks)
    score: float                          # latest detection score
    det_box: Optional[np.ndarray] = None  # latest detector box
    landmarks: Optional[np.ndarray] = None
    smoother: Smoother = field(default_factory=Smoother)
    missed: int = 0                       # detection frames in a row without a match
    detected_since: bool = True           # the detector saw it after its last landmarks were read
    det_frame: int = 0                    # the frame of the latest detection
    crop_box: Optional[np.ndarray] = None  # the last landmarks' box, held to the latest detection

    def crop_matrix(self) -> Optional[np.ndarray]:
        """The training-convention crop from the last landmarks' (bounded) box; None when the detector box
        is newer."""
        if self.crop_box is None or self.detected_since:
            return None
        return box_to_matrix(self.crop_box)

    def set_landmarks(self, landmarks: np.ndarray, frame: Optional[int] = None) -> bool:
        """EmoNet's landmarks of the face's frame ``frame``: the next crops come from their box, held to the
        latest detection (:func:`bound_box`). False when the box broke those bounds: look for the face again."""
        return bool(set_many_landmarks([self], np.asarray(landmarks)[None], [frame])[1][0])


def set_many_landmarks(tracks: Sequence[Track], landmarks: np.ndarray,
                       frames: Optional[Sequence[Optional[int]]] = None,
                       references: Optional[Sequence[np.ndarray]] = None,
                       since: Optional[Sequence[int]] = None,
                       boxes: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Track.set_landmarks` for many faces at once (``(n, 68, 2)`` landmarks of the faces' ``frames``; a
    track given more than once keeps its last): per face, its landmarks' box held to its bounds ``(n, 4)`` and
    whether it was within them ``(n,)``. Each face is held to its track's last detection box as the call finds it
    (a track without one, to its ``box`` then), or to ``references``, ``since`` frames before it, where given (the
    detection as of the face's own frame, when the track has been detected again since). ``boxes``: the
    landmarks' boxes (:func:`~emonet.geometry.landmarks_boxes`), where the caller has made them already."""
    if references is None:
        references = [t.det_box if t.det_box is not None else t.box for t in tracks]
        since = [0 if f is None else f - t.det_frame for t, f in zip(tracks, frames or [None] * len(tracks))]
    references = np.array(references, np.float64).reshape(-1, 4)
    held, ok = bound_boxes(landmarks_boxes(landmarks) if boxes is None else boxes, references,
                           np.array(since, np.int64))
    for track, points, box in zip(tracks, landmarks, held):
        track.landmarks, track.detected_since, track.crop_box = points, False, box
    return held, ok


class Tracker:
    """Greedy IoU matching of detections to tracks; ids are never reused.

    A track the detector misses is remembered (not predicted) for ``max_missed`` detection frames, so a
    one-frame detector miss does not change its id; after that it is dropped.
    """

    def __init__(self, iou_threshold: float = 0.3, max_missed: int = 1, max_shift: float = 0.6) -> None:
        self.iou_threshold = iou_threshold
        self.max_shift = max_shift  # centre distance over box size still counted as the same face
        self.max_missed = max_missed
        self.tracks: list[Track] = []
        self._next_id = 0

    @property
    def active(self) -> list[Track]:
        """Tracks matched at the last detection: the faces to predict."""
        return [t for t in self.tracks if t.missed == 0]

    def update(self, detections: np.ndarray, frame: int = 0, start_score: float = 0.0,
               unseen_below: float = 0.0) -> list[Track]:
        """Match ``(k, 5)`` float64 detections of frame ``frame`` to tracks (new ids for the unmatched that score at
        least ``start_score``); return the active tracks. A face already followed is kept by any detection given,
        so a detector asked for faces below its threshold holds a face that dips under it (hysteresis) while a
        new face still needs the threshold. ``unseen_below``: the detector did not look for faces under this
        size (a box's longer side) on this frame, though it may have found some: a track of such a face (by its
        last detection box) left unmatched is followed on as it was, not counted as missed, and such a
        detection left unmatched starts no track (it may be a followed face moved out of matching reach: the
        next frame that looks for small faces decides)."""
        affinities = self._affinities(detections).tolist()
        pairs = sorted(((a, ti, di) for ti, row in enumerate(affinities) for di, a in enumerate(row)), reverse=True)
        matched_t, matched_d = set(), set()
        for affinity, ti, di in pairs:
            if affinity <= 0 or ti in matched_t or di in matched_d:
                continue
            matched_t.add(ti)
            matched_d.add(di)
            t = self.tracks[ti]
            t.box = t.det_box = detections[di][:4].astype(np.float64)
            t.score, t.missed = float(detections[di][4]), 0
            t.detected_since, t.det_frame = True, frame
        for ti, t in enumerate(self.tracks):
            if ti not in matched_t:
                ref = t.det_box if t.det_box is not None else t.box
                if longer_side(ref) < unseen_below:
                    continue  # not looked for: followed on from its landmarks (or, missed before, waits as it is)
                t.missed += 1
                t.landmarks = t.crop_box = None  # stale: a re-found face is re-cropped from its detector box
        self.tracks = [t for t in self.tracks if t.missed <= self.max_missed]
        for di, d in enumerate(detections):
            if di not in matched_d and d[4] >= start_score and longer_side(d) >= unseen_below:
                box = d[:4].astype(np.float64)
                self.tracks.append(Track(self._next_id, box, float(d[4]), det_box=box, det_frame=frame))
                self._next_id += 1
        return self.active

    def _affinities(self, detections: np.ndarray) -> np.ndarray:
        """``(tracks, detections)`` float64: how surely each detection is each track's face (box overlap first, the
        best of the track's detection box, box and landmarks' box; then nearness of the centres; 0 = not), each as
        :func:`iou` and Python's ``max`` would make it pair by pair, so the matches are those of that loop."""
        tracks = self.tracks
        if not tracks or not len(detections):
            return np.zeros((len(tracks), len(detections)))
        dets = np.asarray(detections, np.float64)[None, :, :4]  # (1, D, 4): each track against every detection
        box = np.array([t.box for t in tracks], np.float64)[:, None]
        ref = np.array([t.det_box if t.det_box is not None else t.box for t in tracks], np.float64)[:, None]
        has_det_box = np.array([t.det_box is not None for t in tracks])[:, None]
        has_marks = np.array([t.landmarks is not None for t in tracks])[:, None]
        marks = box.copy()
        if has_marks.any():
            marks[has_marks[:, 0], 0] = landmarks_boxes([t.landmarks for t in tracks if t.landmarks is not None])
        # Python's max over (detection box, box, landmarks' box), the missing ones left out.
        overlap, second, third = _ious(ref, dets), _ious(box, dets), _ious(marks, dets)
        overlap = np.where(~has_det_box | (second > overlap), second, overlap)
        overlap = np.where(has_marks & (third > overlap), third, overlap)
        # Nearness: from the detection box, else the box.
        size = ref[..., 2] - ref[..., 0]
        for side in (ref[..., 3] - ref[..., 1], dets[..., 2] - dets[..., 0], dets[..., 3] - dets[..., 1], 1e-6):
            size = _max(size, side)
        dx = (ref[..., 0] + ref[..., 2] - dets[..., 0] - dets[..., 2]) / 2
        dy = (ref[..., 1] + ref[..., 3] - dets[..., 1] - dets[..., 3]) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            shift = np.hypot(dx, dy) / size
        near = np.where(shift < self.max_shift, _max(0.0, 1.0 - shift / self.max_shift), 0.0)
        return np.where(overlap >= self.iou_threshold, 1.0 + overlap, near)

