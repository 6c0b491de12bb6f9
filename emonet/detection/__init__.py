"""Face detectors: one small interface (:class:`FaceDetector`), one module per backend.

| name | module |
| --- | --- |
| ``yunet`` (default) | :mod:`.yunet`: YuNet (libfacedetection) in PyTorch, one dense pass, weights shipped with the package |
| ``blazeface`` | :mod:`.blazeface`: MediaPipe BlazeFace in PyTorch, weights shipped with the package |
| ``sfd`` | :mod:`.sfd`: face-alignment's S3FD (downloads its weights on first use) |
| ``none`` | :mod:`.whole`: the image already is a face crop |

BlazeFace's parts beside its module: :mod:`.views` (the views an image is seen in), :mod:`.decoding` (anchors,
decoding, NMS, views merged). Shared by BlazeFace and YuNet (network in :mod:`.yunet_net`): :mod:`.close_look` (the
verifier, with :mod:`.onet`) and :mod:`.crops` (its crops), :mod:`.graph_policy` (what runs as CUDA graphs),
:mod:`.transfer` (copies between host and device).

Backends are imported when asked for, so a run that does not use one does not pay for importing it.
"""
from __future__ import annotations

from typing import Union

import torch

from .base import DetectorError, FaceDetector

from ..choices import DETECTORS  # noqa: F401 - re-exported


def create_detector(name: str, device: Union[str, torch.device] = "cpu", **kwargs) -> FaceDetector:
    """Build a detector by name: ``blazeface``, ``yunet``, ``sfd`` or ``none``."""
    if name == "blazeface":
        from .blazeface import BlazeFaceDetector
        return BlazeFaceDetector(device, **kwargs)
    if name == "yunet":
        from .yunet import YuNetDetector
        return YuNetDetector(device, **kwargs)
    if name == "sfd":
        from .sfd import SFDDetector
        return SFDDetector(device, **kwargs)
    if name == "none":
        from .whole import WholeImageDetector
        return WholeImageDetector()
    raise DetectorError(f"unknown detector {name!r}; choose one of {', '.join(DETECTORS)}")


__all__ = ["DETECTORS", "DetectorError", "FaceDetector", "create_detector"]
