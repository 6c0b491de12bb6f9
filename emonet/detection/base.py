"""The detector interface: find faces, and say how a box of this detector becomes a crop.

``detect(images)`` takes RGB uint8 ``(H, W, 3)`` arrays and returns, per image, an ``(k, 5)`` float array
of ``x1, y1, x2, y2, score`` in image pixels, best first. One module per backend beside this one.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..geometry import DETECTOR_SHIFT, S3FD_REFERENCE_SCALE, box_to_matrix


class DetectorError(Exception):
    """A detector cannot be set up (weights missing, offline download, ...); the message says what to do."""


class FaceDetector:
    """Base class: find faces, and say how a box of this detector becomes a crop."""

    name = "base"
    reference_scale = S3FD_REFERENCE_SCALE  # FAN convention: scale = (w + h) / reference_scale
    shift = DETECTOR_SHIFT                  # box centre moved up by this fraction of its height
    queues = False  # launch() queues its work on a device and returns at once: another image rides along cheaply

    def detect(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per image, an ``(k, 5)`` array ``x1, y1, x2, y2, score``, best first."""
        raise NotImplementedError

    def launch(self, images: Sequence[np.ndarray], small: Optional[Sequence[bool]] = None,
               memory: Optional[Sequence] = None):
        """Start detecting; :meth:`collect` returns what :meth:`detect` would. A GPU backend queues its
        work and returns at once, so the caller can do something else meanwhile; the default just detects.
        ``small`` (per image; default all) says whether to look for faces under :meth:`small_face_limit` too,
        where the detector looks for them apart (a video's frames between two such looks need not).
        ``memory`` (per image, a video's :class:`~emonet.detection.close_look.LookMemory` or None): YuNet's
        detector lets a candidate verified at that video's last periodic detection carry its verdict instead of
        being looked at again; every other detector ignores it."""
        return self.detect(images)

    def small_face_limit(self, shape: tuple) -> float:
        """The size (a face box's longer side, px) under which a face of an image of ``shape`` is found only
        when ``launch`` is asked to look for small faces; 0: every face is looked for every time (default)."""
        return 0.0

    def advance(self, handle):
        """Take a :meth:`launch` one step on where a backend works in steps (the verified BlazeFace decodes its
        candidates, waiting for its first network, and queues their close look), so that :meth:`collect` then
        waits for less; a caller with other GPU work queued calls it before waiting for that. Default: as is."""
        return handle

    def collect(self, handle, min_score: Optional[float] = None) -> list[np.ndarray]:
        """The boxes of a :meth:`launch` (advanced or not), waiting for them if need be; ``min_score``, where the detector takes
        it, reports faces down to that score instead of its own threshold (a tracker holding a face it follows)."""
        return handle

    def crop_matrix(self, box: np.ndarray, image_shape: tuple) -> np.ndarray:
        """The 2x3 affine from the image to this face's 256x256 crop."""
        return box_to_matrix(box, self.reference_scale, self.shift)

    def warmup(self, shape: tuple = (720, 1280, 3)) -> None:
        """Pay one-off start-up costs (autotuning, kernel loading) before real images; default: nothing."""
