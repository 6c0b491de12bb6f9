"""Drawing results: on photos with OpenCV (:mod:`.opencv`), on video frames with torch (:mod:`.canvas`),
from marks planned with NumPy (:mod:`.marks`), for an annotated video in a process of its own
(:mod:`.process`).

The canvas is imported on first use, so what needs only the palette, the photo marks or the planning (a
plotting process, say) does not import torch.
"""
from __future__ import annotations

import importlib

from .marks import coded_size, panel_width
from .opencv import PALETTE, annotate, draw_circumplex, draw_face, face_marks

__all__ = ["PALETTE", "annotate", "draw_circumplex", "draw_face", "face_marks", "VideoCanvas", "coded_size",
           "panel_width"]


def __getattr__(name: str):
    if name == "VideoCanvas":
        return importlib.import_module(".canvas", __name__).VideoCanvas
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
