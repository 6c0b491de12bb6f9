"""The benchmark, beside the core (nothing in the package imports it): the released way of running
EmoNet against each engine mode, the video tool end to end, crops, and kernel profiles. The command line is
:mod:`.run`; each benchmark is a module of its own beside it (its docstring names them)."""
from .run import main, startup_floor

__all__ = ["main", "startup_floor"]
