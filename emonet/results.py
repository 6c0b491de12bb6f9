"""Typed results: one :class:`FaceResult` per face per image or frame, and how it is written as a JSON
record or a CSV row. Nothing else in the package turns network outputs into results
(:meth:`emonet.pipeline.Pipeline.results` is the one place that builds them; ``collect`` waits and calls it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

N_LANDMARKS = 68
CROP_SIZE = 256  # side of the network's square input crop; FaceResult.matrix maps the image onto it


@dataclass
class FaceResult:
    """One face in one image or video frame: where it is, and what EmoNet reads from it."""

    frame: int                      # index of the image (photos, datasets) or frame (video) it belongs to
    face_id: int                    # video: the track id, stable over frames; photos: the face's index
    box: np.ndarray                 # x1, y1, x2, y2 in image pixels (detector box, or the landmarks' box)
    score: float                    # detection score (between detections: NaN, written as an empty cell or null)
    detected: bool                  # the detector ran on this frame and found this face
    expression: int                 # arg-max class index
    probabilities: np.ndarray       # softmax over the classes
    valence: float                  # clamped to [-1, 1]
    arousal: float                  # clamped to [-1, 1]
    landmarks: np.ndarray           # (68, 2) x, y in image pixels
    matrix: np.ndarray = field(repr=False)  # image -> 256x256 crop affine the prediction was made on

    def top(self, class_names: Sequence[str], k: int = 3) -> list[tuple[str, float]]:
        """The k most probable classes with their probabilities."""
        order = np.argsort(-self.probabilities)[:k]
        return [(class_names[i], float(self.probabilities[i])) for i in order]


@dataclass
class FrameFaces:
    """One video frame's faces."""

    index: int                      # frame number in the video
    timestamp: float                # seconds (the frame's presentation or capture time)
    faces: list[FaceResult] = field(default_factory=list)


def face_record(face: FaceResult, class_names: Sequence[str]) -> dict:
    """One face as JSON: id, box, score, whether the detector saw it, expression, probabilities by class name,
    valence, arousal, landmarks."""
    # Rounded by numpy, as the video rows are, in a few calls: a live service writes this for every face of
    # every frame, in the process that steps the GPU.
    return {
        "face_id": face.face_id,
        "box": np.round(np.asarray(face.box, np.float64), 2).tolist(),
        # Between detections (video, streams) there is no score of the frame's own: null, never NaN (not JSON).
        "score": round(face.score, 4) if face.detected else None,
        "detected": face.detected,
        "expression": class_names[face.expression],
        "expression_index": face.expression,
        "probabilities": dict(zip(class_names, np.round(np.asarray(face.probabilities, np.float64), 5).tolist())),
        "valence": round(face.valence, 5),
        "arousal": round(face.arousal, 5),
        "landmarks": np.round(np.asarray(face.landmarks, np.float64).reshape(-1, 2), 2).tolist(),
    }


def frame_fields(class_names: Sequence[str], landmarks: bool) -> list[str]:
    """The columns of a per-face-per-frame row (video CSV and JSONL)."""
    fields = ["frame", "timestamp", "face_id", "detected", "score", "x1", "y1", "x2", "y2", "expression",
              *[f"p_{c}" for c in class_names], "valence", "arousal"]
    if landmarks:
        # Not "x1", "y1", ...: those name the box's corners.
        fields += [f"lm{i}_{axis}" for i in range(N_LANDMARKS) for axis in ("x", "y")]
    return fields


def frame_row(face: Optional[FaceResult], frame: int, timestamp: float, class_names: Sequence[str],
              landmarks: bool) -> dict:
    """One row of :func:`frame_fields`; ``face=None`` is the row of a frame with no face (empty values)."""
    if face is None:
        return {"frame": frame, "timestamp": round(timestamp, 4)}
    # A tracked frame's face has no detector score of its own: the column stays empty (null in JSON).
    values = [frame, round(timestamp, 4), face.face_id, int(face.detected),
              round(face.score, 4) if face.detected else None, *np.round(face.box, 2).tolist(), class_names[face.expression],
              *np.round(face.probabilities, 5).tolist(), round(face.valence, 5), round(face.arousal, 5)]
    if landmarks:
        values += np.round(face.landmarks, 2).ravel().tolist()  # lm0_x, lm0_y, lm1_x, ...
    return dict(zip(frame_fields(class_names, landmarks), values))


def photo_fields(class_names: Sequence[str]) -> list[str]:
    """The columns of the photo tool's CSV: one row per face per image."""
    return ["image", "face_id", "x1", "y1", "x2", "y2", "score", "expression", *[f"p_{c}" for c in class_names],
            "valence", "arousal", "error"]


def photo_row(image: str, face: Optional[FaceResult], class_names: Sequence[str], error: str = "") -> dict:
    """One row of :func:`photo_fields`; ``face=None``: an image with no face (or, with ``error``, unreadable)."""
    if face is None:
        return {"image": image, "error": error}
    values = [image, face.face_id, *np.round(face.box, 2).tolist(), round(face.score, 4),
              class_names[face.expression], *np.round(face.probabilities, 5).tolist(), round(face.valence, 5),
              round(face.arousal, 5), ""]
    return dict(zip(photo_fields(class_names), values))
