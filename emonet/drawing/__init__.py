"""Drawing results: on photos with OpenCV (:mod:`.opencv`), on video frames with torch (:mod:`.canvas`).

The canvas is imported on first use, so what needs only the palette or the photo marks (a plotting
process, say) does not import torch.
"""
from __future__ import annotations

import importlib

from .opencv import PALETTE, annotate, draw_circumplex, draw_face, face_marks

_CANVAS = ("VideoCanvas", "coded_size", "panel_width")
__all__ = ["PALETTE", "annotate", "draw_circumplex", "draw_face", "face_marks", *_CANVAS]


def __getattr__(name: str):
    if name in _CANVAS:
        return getattr(importlib.import_module(".canvas", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
