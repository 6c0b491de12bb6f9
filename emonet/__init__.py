"""emonet: facial expression, valence, arousal and landmarks from faces with EmoNet (Toisoul et al., 2021).

One path for every face: images -> :mod:`emonet.detection` -> crops (:mod:`emonet.geometry`) ->
:mod:`emonet.engine` -> :class:`emonet.results.FaceResult` (:mod:`emonet.pipeline`), the same for photos,
video frames and datasets. The names below are imported on first use, so ``import emonet`` (and a
drawing or decoding worker that imports one submodule) does not pay for torch until it is needed.
"""
from __future__ import annotations

import importlib

__version__ = "0.2.0"

_EXPORTS = {
    "EmoNet": "models", "load_model": "models", "Weights": "models", "WEIGHTS": "models",
    "CheckpointError": "models", "class_names": "classes", "EXPRESSIONS_8": "classes",
    "EXPRESSIONS_5": "classes", "RuntimeConfig": "runtime", "configure": "runtime",
    "select_device": "runtime", "LatencyTimer": "timing", "model_cost": "timing",
    "Reader": "api", "FrameFaces": "api", "summarize": "api",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'emonet' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
