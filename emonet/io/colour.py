"""Colour conversions of decoded frames: I420 (or NV12) planes to RGB, the same arithmetic on a CPU or a GPU,
and the decoder's layout names."""
from __future__ import annotations

from typing import Optional

import cv2
import numpy as np
import torch

# Y'CbCr -> RGB: (Kr, Kb) of each matrix the decoder names.
_MATRICES = {"601": (0.299, 0.114), "709": (0.2126, 0.0722)}


def i420_to_rgb(yuv: torch.Tensor, matrix: str = "601", full_range: bool = False, nv12: bool = False) -> torch.Tensor:
    """``(..., H * 3 // 2, W)`` uint8 yuv420p planes (one after the other) -> ``(..., H, W, 3)`` uint8 RGB.

    Chroma is repeated over each 2x2 block, as OpenCV's ``COLOR_YUV2RGB_I420`` does; ``matrix`` is
    ``"601"`` or ``"709"``, ``full_range`` for JPEG-style (yuvj420p) levels; ``nv12``: the two chroma
    planes interleaved (Cb, Cr, Cb, ...), as NVDEC gives them. On any device.
    """
    kr, kb = _MATRICES[matrix]
    kg = 1.0 - kr - kb
    lead = yuv.shape[:-2]
    h, w = yuv.shape[-2] * 2 // 3, yuv.shape[-1]
    flat = yuv.reshape(*lead, -1)
    y_scale, c_scale, y0 = (1.0, 1.0, 0.0) if full_range else (255.0 / 219.0, 255.0 / 224.0, 16.0)
    # (Cb, Cr) -> (R, G, B) offsets from luma: each product rounded, then their sum (element-wise steps, not a
    # matrix product, whose kernels may fuse the multiply-add differently on each device): eagerly on a CPU or a
    # CUDA GPU, the same pixels.
    if nv12:
        chroma = flat[..., h * w:h * w * 3 // 2]
    else:
        chroma = torch.stack([flat[..., h * w:h * w * 5 // 4], flat[..., h * w * 5 // 4:h * w * 3 // 2]], -1)
    chroma = chroma.reshape(*lead, h // 2, w // 2, 2, 1).float() - 128.0
    weights = torch.tensor([[0.0, -2 * (1 - kb) * kb / kg, 2 * (1 - kb)],
                            [2 * (1 - kr), -2 * (1 - kr) * kr / kg, 0.0]], device=yuv.device) * c_scale
    offsets = (chroma * weights).sum(dim=-2).unsqueeze(-2).unsqueeze(-4)  # (..., h/2, 1, w/2, 1, 3)
    del chroma
    # Luma as 2x2 blocks, (..., h/2, 2, w/2, 2, 1), so that each block's offsets broadcast over it: RGB is written
    # once, at full size, with no full-size copy of the offsets first (luma scaled in place: a copy of its own).
    luma = flat[..., :h * w].reshape(*lead, h // 2, 2, w // 2, 2, 1).to(torch.float32, copy=True)
    rgb = offsets + luma.sub_(y0).mul_(y_scale)
    return rgb.reshape(*lead, h, w, 3).round_().clamp_(0, 255).to(torch.uint8)


def colours(layout: str) -> Optional[tuple[str, bool]]:
    """The decoder's ``layout`` (``bgr`` or ``i420:MATRIX:RANGE``) as ``(matrix, full_range)``; None for BGR."""
    if layout == "bgr":
        return None
    _, matrix, levels = layout.split(":")
    return matrix, levels == "full"


def host_rgb(array: np.ndarray, colour: Optional[tuple[str, bool]]) -> np.ndarray:
    """A decoded frame (BGR where ``colour`` is None, else I420 planes in ``colour``, see :func:`colours`) as
    ``(H, W, 3)`` uint8 RGB on the host."""
    if colour is None:
        return cv2.cvtColor(array, cv2.COLOR_BGR2RGB)
    # The GPU's conversion, so a run on the CPU sees the same pixels (OpenCV's fast path is up to a few
    # levels off the exact arithmetic near black and in saturated colours).
    return i420_to_rgb(torch.from_numpy(array), *colour).numpy()
