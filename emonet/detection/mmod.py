"""The third look of the close look: dlib's CNN face detector (MMOD; King, 2015), ``mmod_human_face_detector.dat``,
in PyTorch. Trained on other faces than BlazeFace and ONet and with other features, it turns down animals' faces
that both of them take for a face.

The weights ship with the package (``mmod.pth``, converted by ``tools/convert_mmod.py``, which checks the network
against dlib itself; public domain (CC0): see ``NOTICE.mmod``).

dlib runs the network over an image pyramid (each level 5/6 of the one before) tiled into one image
(:class:`TiledPyramid`, as its ``input_rgb_image_pyramid`` does); a detection is an output above 0, its box the
network's 80x80 window at that point, mapped back to the image. :class:`CropScorer` scores square crops around
candidates the same way: per crop the best output whose box is centred in the crop's middle third, which is the
confidence dlib reports for the face of a crop of one face. Plain fp32 convolutions, on a GPU under the process's
TF32 setting as the close look's other networks (cuDNN's flags are global: a thread capturing graphs must not flip
them under the engine); for a crop size the shapes are fixed (the close look's CUDA graphs capture it).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Union

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .base import DetectorError

MMOD_WEIGHTS = Path(__file__).with_name("mmod.pth")
# dlib's net: three 5x5 stride-2 convolutions (16, 32, 32 filters) and three 5x5 (45), each with an affine
# (its batch norm, frozen) and a ReLU, then one 9x9 filter: the detection map, one point per 8 input pixels.
CHANNELS = (16, 32, 32, 45, 45, 45)
STRIDES = (2, 2, 2, 1, 1, 1)
HEAD = 9
PYRAMID_RATE = 5.0 / 6.0   # dlib's pyramid_down<6>
MIN_LEVEL_HEIGHT = 5
PYRAMID_PADDING, PYRAMID_OUTER_PADDING = 10, 11  # the .dat's input layer is the old one, with these defaults


class MMODNet(nn.Module):
    """dlib's MMOD face network with its affines folded into its convolutions: ``(B, 3, H, W)`` RGB as dlib scales
    it (``(pixel - mean) / 256``, :meth:`normalise`) -> the detection map ``(B, 1, h, w)``."""

    def __init__(self) -> None:
        super().__init__()
        convs, before = [], 3
        for out, stride in zip(CHANNELS, STRIDES):
            convs.append(nn.Conv2d(before, out, 5, stride, 0 if stride != 1 else 2))
            before = out
        self.convs = nn.ModuleList(convs)
        self.head = nn.Conv2d(before, 1, HEAD, 1, HEAD // 2)
        self.register_buffer("mean", torch.zeros(3))
        self.window = (80, 80)

    def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        """RGB pixels in [0, 255] ``(B, 3, H, W)`` -> the network's input."""
        return (pixels - self.mean.view(1, 3, 1, 1)) / 256.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu(conv(x))
        return self.head(x)

    @staticmethod
    def output_to_input(p: np.ndarray) -> np.ndarray:
        """A point of the detection map -> the input's (dlib's ``map_output_to_input``: ``p * stride - padding +
        size // 2`` per layer)."""
        for stride in STRIDES[::-1]:
            if stride != 1:
                p = p * stride + 2
        return p


def from_dlib(state: dict[str, torch.Tensor]) -> MMODNet:
    """The network from :func:`tools.convert_mmod`'s state dict (dlib's tensors: ``conv{i}.weight``,
    ``conv{i}.bias``, ``affine{i}.gamma``, ``affine{i}.beta``, ``head.weight``, ``head.bias``, ``mean``,
    ``window``), each affine ``y = gamma * x + beta`` folded into its convolution (in float64, then fp32)."""
    net = MMODNet()
    with torch.no_grad():
        for i, conv in enumerate(net.convs):
            gamma, beta = state[f"affine{i}.gamma"].double(), state[f"affine{i}.beta"].double()
            conv.weight.copy_(state[f"conv{i}.weight"].double() * gamma.view(-1, 1, 1, 1))
            conv.bias.copy_(state[f"conv{i}.bias"].double() * gamma + beta)
        net.head.weight.copy_(state["head.weight"])
        net.head.bias.copy_(state["head.bias"])
        net.mean.copy_(state["mean"])
    net.window = tuple(int(v) for v in state["window"])
    return net


def load_mmod(device: Union[str, torch.device], path: Union[str, Path, None] = None) -> MMODNet:
    """The network with the shipped weights (tensors only: loaded with ``weights_only``), in eval mode on
    ``device``."""
    path = Path(path) if path else MMOD_WEIGHTS
    if not path.is_file():
        raise DetectorError(f"MMOD weights not found at {path}; reinstall emonet (the file ships with the package)")
    return from_dlib(torch.load(path, map_location="cpu", weights_only=True)).to(device).eval()


class TiledPyramid:
    """dlib's tiled image pyramid (``input_rgb_image_pyramid``) for images of ``height`` x ``width``: the image
    and its levels, each 5/6 of the one before (bilinear, corners aligned, as dlib's ``resize_bilinear``), down to
    5 rows, tiled into one image (zeros between: the mean colour) as ``compute_tiled_image_pyramid_details``
    places them. ``rects``: each level's ``(left, top, right, bottom)`` (inclusive) in the tiled image."""

    def __init__(self, height: int, width: int,
                 padding: int = PYRAMID_PADDING, outer_padding: int = PYRAMID_OUTER_PADDING) -> None:
        sizes = [(height, width)]
        nr, nc = height, width
        while True:
            nr, nc = math.floor(PYRAMID_RATE * nr), math.floor(PYRAMID_RATE * nc)
            if nr * nc == 0 or nr < MIN_LEVEL_HEIGHT:
                break
            sizes.append((nr, nc))
        total = sum(h + padding for h, _ in sizes) - 2 * padding
        tall, previous = 0, 0
        for h, w in sizes:
            if w <= width - previous - padding and (tall - height) * 2 >= total - height:
                break
            tall += h + padding
            previous = w
        tall -= padding
        self.shape = (tall + 2 * outer_padding, width + 2 * outer_padding)
        rects = []
        y, i = outer_padding, 0
        while y < tall + outer_padding and i < len(sizes):
            h, w = sizes[i]
            rects.append((outer_padding, y, outer_padding + w - 1, y + h - 1))
            y += h + padding
            i += 1
        y -= padding
        while i < len(sizes):
            h, w = sizes[i]
            right, bottom = outer_padding + width - 1, y - 1
            rect = (right - (w - 1), bottom - (h - 1), right, bottom)
            first = rects[0]
            if not (rect[2] < first[0] or rect[0] > first[2] or rect[3] < first[1] or rect[1] > first[3]):
                break
            rects.append(rect)
            y -= h + padding
            i += 1
        self.rects = rects

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, 3, height, width)`` (the network's scaling) -> the tiled pyramid ``(B, 3, *shape)``."""
        out = x.new_zeros((x.shape[0], x.shape[1], *self.shape))
        level = x
        for k, (left, top, right, bottom) in enumerate(self.rects):
            if k:
                level = F.interpolate(level, size=(bottom - top + 1, right - left + 1), mode="bilinear",
                                      align_corners=True)
            out[:, :, top:bottom + 1, left:right + 1] = level
        return out

    def boxes(self, points: np.ndarray, window: tuple[int, int]) -> np.ndarray:
        """Points of the tiled image ``(n, 2)`` (x, y) -> the boxes dlib reports for its window there, in the
        image's pixels ``(n, 4)`` (left, top, right, bottom; rounded as dlib's ``rectangle``): the level whose
        rect is nearest (``tiled_pyramid_to_image``), then its ``rect_up``, ``p * 6/5 + 0.3`` a level."""
        rects = np.asarray(self.rects, np.float64)
        p = np.asarray(points, np.float64)
        nearest_x = np.clip(p[:, None, 0], rects[None, :, 0], rects[None, :, 2])
        nearest_y = np.clip(p[:, None, 1], rects[None, :, 1], rects[None, :, 3])
        distance = np.hypot(nearest_x - p[:, None, 0], nearest_y - p[:, None, 1])
        level = np.argmin(distance, axis=1)  # the first of equals; 0 where inside
        w, h = (window[0] - 1) / 2, (window[1] - 1) / 2
        box = np.stack([p[:, 0] - w, p[:, 1] - h, p[:, 0] + w, p[:, 1] + h], axis=1) - np.tile(rects[level, :2], 2)
        for k in range(1, len(self.rects)):
            up = level >= k
            box[up] = box[up] / PYRAMID_RATE + 0.3
        return np.sign(box) * np.floor(np.abs(box) + 0.5)  # dlib's rectangle(drectangle): lround (halves away from 0)


def detection_map_points(shape: tuple[int, int]) -> tuple[tuple[int, int], np.ndarray]:
    """The detection map's size for an input of ``shape`` and each map point's place in the input ``(h*w, 2)``
    (x, y), row by row."""
    h, w = shape
    for stride in STRIDES:
        if stride != 1:
            h, w = (h - 5) // stride + 1, (w - 5) // stride + 1
    ys, xs = np.mgrid[0:h, 0:w]
    return (h, w), MMODNet.output_to_input(np.stack([xs.reshape(-1), ys.reshape(-1)], axis=1).astype(np.float64))


class CropScorer:
    """Scores square crops of ``size`` x ``size`` pixels as dlib's detector would: each crop's tiled pyramid
    through the network, then the best output whose box (:meth:`TiledPyramid.boxes`) is centred in the crop's
    middle third (the crop's own face; a face beside it does not count)."""

    def __init__(self, net: MMODNet, size: int) -> None:
        self.net, self.size = net, int(size)
        self.pyramid = TiledPyramid(self.size, self.size)
        (h, w), points = detection_map_points(self.pyramid.shape)
        boxes = self.pyramid.boxes(points, net.window)
        cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        lo, hi = self.size / 3, 2 * self.size / 3
        central = (cx >= lo) & (cx <= hi) & (cy >= lo) & (cy <= hi)
        device = next(net.parameters()).device
        self.mask = torch.from_numpy(central.reshape(1, 1, h, w)).to(device)

    def __call__(self, crops: torch.Tensor) -> torch.Tensor:
        """Crops ``(B, 3, size, size)``, RGB pixels in [0, 255] -> their scores ``(B,)`` (dlib's confidence: a
        face from 0; fp32, on the crops' device)."""
        with torch.inference_mode():
            out = self.net(self.pyramid(self.net.normalise(crops)))
            low = torch.full_like(out, -1e4)
            return torch.where(self.mask, out, low).amax(dim=(1, 2, 3))
