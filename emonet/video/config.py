"""What a video run is asked to do (:class:`VideoConfig`), and the runtime's tuning constants, in one place."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..build import ModelOptions

# The stages a run's time is reported by. This process: decode (the decoder's own clock), detect, emonet
# (track, crop, network), results (the sinks' rows and summaries), hand-over (frames to the drawing), drawing
# wait (for it, when it is behind). Where the video is drawn: plan (what is drawn: NumPy, OpenCV; for a video
# drawn in this process, in a planning process of its own once it is up), plan wait (for that process's plan),
# draw (drawing it: torch), to encoders (copying drawn frames out), encoder wait (for the encoders' free
# slots), encode (the encoders').
STAGES = ("decode", "detect", "emonet", "results", "hand-over", "drawing wait", "plan", "plan wait", "draw",
          "to encoders", "encoder wait", "encode")
# Frames drawn at once on a GPU (at least a chunk): each drawing call's host work is mostly a fixed number of
# tensor operations, spread over more frames; the frames wait on the GPU meanwhile (about 3 MB each at 720p).
DRAW_FRAMES = 32
# A video this long (a collection: its videos together) starts the drawing process as it opens, and waits for
# it if it is not up once the model is loaded: the wait (a few seconds: Python and torch start) is repaid by
# drawing beside the analysis over about this many frames. A shorter one is drawn in the analysing process.
WAIT_FRAMES = 10_000
# With the networks on a GPU, this process's CPU tensor work (the detector's box decoding) is small; torch's
# default of a thread per core only competes with FFmpeg's decoding threads for the CPU.
GPU_RUN_THREADS = 4


@dataclass(frozen=True)
class VideoConfig:
    """A video run: the model, how frames are read and batched, how faces are found and followed, and how an
    annotated video is written. The tools build it from their arguments; the Python API from its own."""

    model: ModelOptions = field(default_factory=ModelOptions)
    batch_size: int = 32                  # frames whose faces go through EmoNet together (a chunk)
    detect_every: int = 5                 # the detector's period, in frames (and whenever a face is lost)
    smooth: bool = True                   # spec §6 smoothing per face
    max_faces: Optional[int] = None       # at most this many faces per frame
    start: float = 0.0                    # seconds into each video
    end: Optional[float] = None           # seconds; None: to the end
    max_frames: Optional[int] = None      # per video
    decoder: str = "auto"                 # auto, cpu or nvdec (see emonet-video --help)
    codec: str = "h264"                   # of the annotated video
    landmarks: bool = False               # rows carry the 68 landmarks

    def __post_init__(self) -> None:
        for name in ("batch_size", "detect_every", "max_frames", "max_faces"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
