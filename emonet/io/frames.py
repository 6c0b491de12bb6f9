"""What a video reader hands out: each decoded :class:`Frame` (host pixels, a GPU copy, or both), and the
:class:`Ending` that says how a video's frames ended."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

@dataclass
class Frame:
    """One decoded frame: its index in the video, its time in seconds, its pixels (and an RGB copy on the GPU)."""

    index: int
    timestamp: float
    host: Optional[np.ndarray]                    # (H, W, 3) uint8 RGB in host memory; None when the
                                                  # reader kept only the GPU copy
    pixels: Optional[torch.Tensor] = None         # (H, W, 3) uint8 RGB on the GPU, uploaded by the reader
    ready: Optional["torch.cuda.Event"] = None    # recorded when that upload has finished

    @property
    def shape(self) -> tuple:
        """``(H, W, 3)``."""
        return self.host.shape if self.host is not None else tuple(self.pixels.shape)

    @property
    def image(self) -> np.ndarray:
        """The RGB pixels in host memory (copied back from the GPU on first use if the reader kept none)."""
        if self.host is None:
            self.ready.synchronize()
            self.host = self.pixels.cpu().numpy()
        return self.host

    def on_device(self, device: torch.device, stream: Optional["torch.cuda.Stream"] = None,
                  waited: Optional[set] = None) -> torch.Tensor:
        """The frame as an ``(H, W, 3)`` uint8 RGB tensor on ``device``, ordered on ``stream`` (default: the current
        one). ``waited``: upload events ``stream`` already waits for (frames uploaded together share one), kept."""
        if self.pixels is not None and self.pixels.device == device:
            stream = stream or torch.cuda.current_stream(device)
            if waited is None or self.ready not in waited:
                stream.wait_event(self.ready)
                if waited is not None:
                    waited.add(self.ready)
            self.pixels.record_stream(stream)  # the reader's stream allocated it; this one reads it
            return self.pixels
        return torch.from_numpy(self.image).to(device, non_blocking=True)


@dataclass
class Ending:
    """How a video's frames ended: how many were read, how many the container declares (0: it does not
    say), and whether decoding stopped at damaged data."""

    produced: int
    declared: int = 0
    damaged: bool = False
    dropped: int = 0  # a live source's frames read and dropped: the analysis was behind
