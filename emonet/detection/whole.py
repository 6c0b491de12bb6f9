"""``none``: each image already is a tight face crop, resized whole to 256x256 as the released demo does."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..geometry import CROP_SIZE
from .base import FaceDetector


class WholeImageDetector(FaceDetector):
    """``none``: the image is already a tight face crop; the whole of it is the face."""

    name = "none"

    def detect(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.array([[0.0, 0.0, img.shape[1], img.shape[0], 1.0]]) for img in images]

    def crop_matrix(self, box: np.ndarray, image_shape: tuple) -> np.ndarray:
        # The released demo resizes the whole image to 256x256 (non-uniform scale); the pipeline
        # reproduces that with cv2.resize and uses this matrix only to map landmarks back.
        h, w = image_shape[:2]
        return np.array([[CROP_SIZE / w, 0.0, 0.0], [0.0, CROP_SIZE / h, 0.0]])
