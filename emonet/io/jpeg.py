"""JPEG frames decoded on the GPU (nvJPEG through torchvision), many in one call; the CPU decodes otherwise.

torchvision's ``decode_jpeg`` takes a list of encoded images and decodes them as one batch on the device:
a live service's JPEG frames then cost the CPU nothing but their reading off the socket. torchvision is used
where it is installed (it is on every usual CUDA set-up of PyTorch); without it, or on a CPU, frames are decoded
with OpenCV (libjpeg-turbo), as photos are. The two decoders' pixels are not bit-identical (their inverse DCT
and chroma upsampling differ by a level or two here and there): docs/PERFORMANCE.md gives the measured
difference and its effect on the rows.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

Decoder = Callable[[list[bytes]], list[torch.Tensor]]


def gpu_decoder(device: torch.device) -> Optional[Decoder]:
    """A function decoding a list of JPEG bytes to ``(H, W, 3)`` uint8 RGB tensors on ``device`` (a CUDA
    device) in one call; None where torchvision's GPU decoding is not to be had (then decode on the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception:  # noqa: BLE001 - not installed, or built for another torch: the CPU decodes
        return None

    def decode(data: list[bytes]) -> list[torch.Tensor]:
        encoded = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
        images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True)
        return [image.permute(1, 2, 0).contiguous() for image in images]

    try:  # a tiny JPEG once: the library loads, and a machine where it does not work is found now
        import cv2
        import numpy as np

        decode([cv2.imencode(".jpg", np.zeros((16, 16, 3), np.uint8))[1].tobytes()])
    except Exception:  # noqa: BLE001 - nvJPEG missing from this build: the CPU decodes
        return None
    return decode
