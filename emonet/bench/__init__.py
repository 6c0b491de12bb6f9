"""The benchmark, beside the core (nothing in the package imports it): the released way of running
EmoNet against each engine mode, the video tool end to end, crops, and kernel profiles (:mod:`.run`)."""
from .run import main, process_age, real_face_crops, startup_floor

__all__ = ["main", "process_age", "real_face_crops", "startup_floor"]
