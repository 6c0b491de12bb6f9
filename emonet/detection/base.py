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


def view_around(box: np.ndarray, shape: tuple, zoom: float = 6.0, least: int = 64) -> tuple[int, int, int]:
    """A square view ``(x, y, side)`` ``zoom`` times ``box``'s longer side (at least ``least`` px) around its
    centre, moved inside the image (and no larger than its short side): where a face already followed is
    looked for again, at a scale the network sees well however small it is in the whole image."""
    h, w = shape[:2]
    side = int(min(max(zoom * max(box[2] - box[0], box[3] - box[1]), least), h, w))
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    x = int(np.clip(round(cx - side / 2), 0, w - side))
    y = int(np.clip(round(cy - side / 2), 0, h - side))
    return x, y, side


class FaceDetector:
    """Base class: find faces, and say how a box of this detector becomes a crop."""

    name = "base"
    reference_scale = S3FD_REFERENCE_SCALE  # FAN convention: scale = (w + h) / reference_scale
    shift = DETECTOR_SHIFT                  # box centre moved up by this fraction of its height

    def detect(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per image, an ``(k, 5)`` array ``x1, y1, x2, y2, score``, best first."""
        raise NotImplementedError

    def launch(self, images: Sequence[np.ndarray], search: Optional[Sequence[bool]] = None,
               regions: Optional[Sequence[Sequence[tuple[int, int, int]]]] = None):
        """Start detecting; :meth:`collect` returns what :meth:`detect` would. A GPU backend queues its
        work and returns at once, so the caller can do something else meanwhile; the default just detects.

        Hints a detector that looks at parts of an image may take (the default, which looks at the whole
        image at every scale, needs neither): ``search[i]``, whether image ``i`` gets the full search for
        small faces; ``regions[i]``, square views ``(x, y, side)`` of image ``i`` worth a closer look (around
        faces already followed)."""
        return self.detect(images)

    def collect(self, handle) -> list[np.ndarray]:
        """The boxes of a :meth:`launch`, waiting for them if need be."""
        return handle

    def crop_matrix(self, box: np.ndarray, image_shape: tuple) -> np.ndarray:
        """The 2x3 affine from the image to this face's 256x256 crop."""
        return box_to_matrix(box, self.reference_scale, self.shift)

    def warmup(self, shape: tuple = (720, 1280, 3)) -> None:
        """Pay one-off start-up costs (autotuning, kernel loading) before real images; default: nothing."""
