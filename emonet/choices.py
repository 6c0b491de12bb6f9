"""The names a command line chooses among, in a module that imports nothing heavy: ``--help`` lists them
without loading torch. The modules that act on them take their names from here."""
from __future__ import annotations

ENGINES = ("eager", "fast", "compiled", "tuned", "max")   # emonet.engine.PRESETS, besides "auto"
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")             # emonet.runtime
DETECTORS = ("yunet", "blazeface", "sfd", "none")        # emonet.detection
# One pass over the whole image, faces the frame's edge cuts, fewer animals passed, and cheaper than BlazeFace
# with its fine view (docs/PERFORMANCE.md, *Face detection*).
DEFAULT_DETECTOR = "yunet"
