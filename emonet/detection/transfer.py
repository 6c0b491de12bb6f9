"""Moving images and small tensors between the host and the detector's device without stalling the host: frames
uploaded as they are, a few values sent ahead of queued work, results copied back with an event to wait on."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
import torch


def frames_to(device: torch.device, images: Sequence[Union[np.ndarray, torch.Tensor]]) -> list[torch.Tensor]:
    """Images as ``(H, W, 3)`` tensors on ``device``: host images uploaded as they are, those there kept."""
    return [(image if torch.is_tensor(image) else torch.from_numpy(np.ascontiguousarray(image))).to(
        device, non_blocking=True) for image in images]  # (a tensor already there is returned as it is)


def frames_on(device: torch.device, images: Sequence[Union[np.ndarray, torch.Tensor]]) -> torch.Tensor:
    """Images of one size as one ``(B, 3, H, W)`` float batch on ``device`` (host images uploaded as they are,
    without a copy on the host first)."""
    frames = frames_to(device, images)
    frames = torch.stack(frames) if len(frames) > 1 else frames[0][None]
    return frames.permute(0, 3, 1, 2).float()


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device``, without waiting for the queue ahead of it."""
    return values.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else values


def to_host(values: torch.Tensor) -> tuple[torch.Tensor, Optional["torch.cuda.Event"]]:
    """A device tensor on its way to pinned host memory, and the event recorded after its copy (on the CPU: the
    tensor itself, and None)."""
    if values.device.type != "cuda":
        return values, None
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done
