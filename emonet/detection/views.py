"""The views of an image the back model runs on, and which images get which.

Every image is seen whole, letterboxed into the network's square input (:func:`letterbox`). An image whose long
side is over FINE_FROM times that input is also seen in the fine view (:func:`fine_view`): whole, at FINE_SCALE
(at most FINE_MAX_SIDE long), the network run over all of it at once (it is fully convolutional: its anchors are
laid over the larger grid), so a 40-px face of a 1080p frame is 24 px there. Over TILES_FROM it is also searched
in overlapping tiles (:func:`tile_grid`, :func:`inside_tile`). Resizing runs on the detector's device.
"""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import torch

from .transfer import frames_on

# Only over three times the network's input: on smaller images the fine view raised non-faces' scores.
FINE_FROM = 3
# A margin above the smallest scale that found the same faces (measured: see docs/PERFORMANCE.md, Face detection).
FINE_SCALE = 0.6
FINE_MAX_SIDE = 1536
FINE_SIZES_KEPT = 8  # fine-view input sizes whose CUDA graphs and anchors are kept (a video has one)
# Over this long side (4K frames, scans, mosaics) the image is also searched in overlapping tiles.
TILES_FROM = 2560
# A face at least this many pixels of the whole view's input (its box's longer side) is found by the whole view
# alone (measured: see docs/PERFORMANCE.md, Face detection).
WHOLE_VIEW_LEAST = 24


def letterbox(images: Sequence[Union[np.ndarray, torch.Tensor]], size: int,
              device: torch.device) -> tuple[torch.Tensor, list[tuple[float, float, float]]]:
    """Each whole image scaled to fit a square input of ``size`` and padded with black (centred): the
    ``(B, 3, size, size)`` input in [-1, 1] on ``device`` and, per image, ``(scale, pad_x, pad_y)``.

    Resized on ``device`` (antialiased bilinear), so a large frame costs one upload instead of a CPU resize.
    """
    s = size
    batch = torch.full((len(images), 3, s, s), -1.0, device=device)  # -1 is black after scaling
    # Images of one size (a video's frames) are resized together: a few launches per call, not per image.
    groups: dict = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.shape[:2]), []).append(i)
    params = [None] * len(images)
    for (h, w), members in groups.items():
        scale = s / max(h, w)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        px, py = (s - nw) // 2, (s - nh) // 2
        x = resized([images[i] for i in members], nh, nw, device)
        if members == list(range(members[0], members[-1] + 1)):
            batch[members[0]:members[-1] + 1, :, py:py + nh, px:px + nw] = x
        else:  # interleaved sizes (rare): row by row, no index upload that would stall the host
            for k, i in enumerate(members):
                batch[i, :, py:py + nh, px:px + nw] = x[k]
        for i in members:
            params[i] = (scale, px, py)
    return batch, params


def fine_view(images: Sequence[Union[np.ndarray, torch.Tensor]], size: int,
              device: torch.device) -> tuple[torch.Tensor, list[tuple[float, float, float]]]:
    """Images of one size, each scaled by FINE_SCALE (at most FINE_MAX_SIDE long) and padded with black on the
    right and below to whole cells of the coarser grid of a network of input ``size``: ``(B, 3, H, W)`` in
    [-1, 1] on ``device`` and, per image, ``(scale, 0, 0)`` (see :func:`letterbox`)."""
    h, w = images[0].shape[:2]
    scale = min(FINE_SCALE, FINE_MAX_SIDE / max(h, w))
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    cell = size // 8
    batch = torch.full((len(images), 3, -(-nh // cell) * cell, -(-nw // cell) * cell), -1.0, device=device)
    batch[:, :, :nh, :nw] = resized(images, nh, nw, device)
    return batch, [(scale, 0, 0)] * len(images)


def resized(images: Sequence[Union[np.ndarray, torch.Tensor]], height: int, width: int,
            device: torch.device) -> torch.Tensor:
    """Images of one size, uploaded and resized on ``device`` (antialiased bilinear): ``(B, 3, height, width)``
    in [-1, 1]."""
    x = torch.nn.functional.interpolate(frames_on(device, images), size=(height, width), mode="bilinear",
                                        antialias=True, align_corners=False)
    return x / 127.5 - 1.0


def tile_grid(height: int, width: int, least: int) -> list[tuple[int, int, int]]:
    """Overlapping square tiles ``(x, y, side)`` of an image whose long side exceeds ``least`` pixels.

    The side is half the long side, between ``least`` and twice that (so a tile is seen at a quarter of
    its size or more), at most the short side; tiles overlap by half, so a face smaller than half a tile
    lies whole inside one. None for an image that is not larger.
    """
    long, short = max(height, width), min(height, width)
    if long <= least:
        return []
    side = min(short, max(least, min(2 * least, long // 2)))

    def starts(length: int) -> list[int]:
        if length <= side:
            return [0]
        n = int(np.ceil((length - side) / (side / 2))) + 1
        return [int(round(v)) for v in np.linspace(0, length - side, n)]
    return [(x, y, side) for y in starts(height) for x in starts(width)]


def inside_tile(faces: np.ndarray, x: int, y: int, side: int, shape: tuple) -> np.ndarray:
    """A tile's detections, less those cut by one of its edges inside the image (another view sees them whole)."""
    h, w = shape
    margin = 0.02 * side
    keep = np.ones(len(faces), bool)
    keep &= ~((faces[:, 0] < margin) & (x > 0))
    keep &= ~((faces[:, 1] < margin) & (y > 0))
    keep &= ~((faces[:, 2] > side - margin) & (x + side < w))
    keep &= ~((faces[:, 3] > side - margin) & (y + side < h))
    return faces[keep].copy()
