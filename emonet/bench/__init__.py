"""The benchmark, beside the core (nothing in the package imports it): the released way of running
EmoNet against each engine mode, the video tool end to end, crops, and kernel profiles (:mod:`.run`)."""
from .run import main, startup_floor

__all__ = ["main", "startup_floor"]
