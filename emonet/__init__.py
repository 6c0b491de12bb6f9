"""emonet: facial expression, valence, arousal and landmarks from faces with EmoNet (Toisoul et al., 2021).

One path for every face: images -> :mod:`emonet.detection` -> crops (:mod:`emonet.geometry`) ->
:mod:`emonet.engine` -> :class:`emonet.results.FaceResult` (:mod:`emonet.pipeline`), the same for photos,
video frames and datasets.
"""
from .classes import EXPRESSIONS_5, EXPRESSIONS_8, class_names
from .models import WEIGHTS, CheckpointError, EmoNet, Weights, load_model
from .runtime import RuntimeConfig, configure, select_device
from .timing import LatencyTimer, model_cost

__version__ = "0.2.0"

__all__ = [
    "EmoNet", "load_model", "Weights", "WEIGHTS", "CheckpointError", "class_names",
    "EXPRESSIONS_8", "EXPRESSIONS_5", "RuntimeConfig", "configure", "select_device",
    "LatencyTimer", "model_cost", "__version__",
]
