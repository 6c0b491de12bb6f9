"""face-alignment's S3FD, the released demo's detector; its weights download on first use."""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import torch

from .base import DetectorError, FaceDetector


class SFDDetector(FaceDetector):
    """face-alignment's S3FD (the released demo's detector); weights download on first use."""

    name = "sfd"

    def __init__(self, device: Union[str, torch.device] = "cpu", min_score: float = 0.5) -> None:
        try:
            from face_alignment.detection.sfd.sfd_detector import SFDDetector as _SFD
            self._sfd = _SFD(device=str(device), filter_threshold=min_score)
        except Exception as exc:  # offline: urllib errors; no weights cached
            raise DetectorError(f"the S3FD detector's weights could not be downloaded ({type(exc).__name__}); "
                                f"use --detector blazeface, which works offline") from None

    def detect(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        results = []
        for image in images:
            boxes = self._sfd.detect_from_image(image[..., ::-1].copy())  # S3FD expects BGR
            arr = np.array([b[:5] for b in boxes], dtype=np.float64).reshape(-1, 5)
            results.append(arr[np.argsort(-arr[:, 4])])
        return results
