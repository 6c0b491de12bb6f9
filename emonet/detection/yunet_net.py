"""YuNet's network (libfacedetection.train, ``yunet_n``; Apache-2.0, see ``NOTICE.yunet``) in plain PyTorch.

The layers are named as in that repository's checkpoint, so its state dict loads as is. The network takes BGR
pixels as they are (0-255, no mean, no scaling), its height and width multiples of 32, and returns for every point
of its three grids (strides 8, 16, 32) a face score and the decoded box and five landmarks in input pixels.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.fusion import fuse_conv_bn_eval

STRIDES = (8, 16, 32)
CELL = 32  # the input's height and width are multiples of this


class DPUnit(nn.Module):
    """A 1x1 convolution, then a depthwise 3x3, then (optionally) BatchNorm and ReLU (``ConvDPUnit``)."""

    def __init__(self, cin: int, cout: int, bn_relu: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, groups=cout)
        self.bn_relu = bn_relu
        if bn_relu:
            self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The unit on ``x``."""
        x = self.conv2(self.conv1(x))
        return F.relu(self.bn(x)) if self.bn_relu else x


class Stem(nn.Module):
    """A strided 3x3 convolution with BatchNorm and ReLU, then a :class:`DPUnit` (``Conv_head``)."""

    def __init__(self, cin: int, cmid: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cmid, 3, 2, 1)
        self.bn1 = nn.BatchNorm2d(cmid)
        self.conv2 = DPUnit(cmid, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stem on ``x`` (half its size)."""
        return self.conv2(F.relu(self.bn1(self.conv1(x))))


class Block(nn.Module):
    """Two :class:`DPUnit` (``Conv4layerBlock``)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = DPUnit(cin, cin)
        self.conv2 = DPUnit(cin, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block on ``x``."""
        return self.conv2(self.conv1(x))


class Backbone(nn.Module):
    """Six stages; max-pooled after stages 0, 2, 3 and 4; stages 3, 4 and 5 feed the neck (strides 8, 16, 32)."""

    def __init__(self) -> None:
        super().__init__()
        self.model0 = Stem(3, 16, 16)
        self.model1 = Block(16, 64)
        for i in range(2, 6):
            self.add_module(f"model{i}", Block(64, 64))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The features at strides 8, 16 and 32."""
        out = []
        for i in range(6):
            x = getattr(self, f"model{i}")(x)
            if i >= 3:
                out.append(x)
            if i in (0, 2, 3, 4):
                x = F.max_pool2d(x, 2)
        return out


class Neck(nn.Module):
    """Top-down: each coarser level, convolved, is upsampled (nearest) and added to the finer one (``TFPN``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lateral_convs = nn.ModuleList(DPUnit(64, 64) for _ in STRIDES)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        """The three levels, each with what the coarser ones saw."""
        feats = list(feats)
        for i in range(len(feats) - 1, 0, -1):
            feats[i] = self.lateral_convs[i](feats[i])
            feats[i - 1] = feats[i - 1] + F.interpolate(feats[i], scale_factor=2.0, mode="nearest")
        feats[0] = self.lateral_convs[0](feats[0])
        return feats


class Head(nn.Module):
    """Per level: a shared :class:`DPUnit`, then class, objectness, box and landmark outputs (``YuNet_Head``)."""

    def __init__(self) -> None:
        super().__init__()
        levels = range(len(STRIDES))
        self.multi_level_share_convs = nn.ModuleList(nn.Sequential(DPUnit(64, 64)) for _ in levels)
        self.multi_level_cls = nn.ModuleList(DPUnit(64, 1, False) for _ in levels)
        self.multi_level_bbox = nn.ModuleList(DPUnit(64, 4, False) for _ in levels)
        self.multi_level_obj = nn.ModuleList(DPUnit(64, 1, False) for _ in levels)
        self.multi_level_kps = nn.ModuleList(DPUnit(64, 10, False) for _ in levels)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """``(N, P, 15)``: score, box ``x1, y1, x2, y2`` and five landmarks ``x, y`` in input pixels, for the P
        points of the three grids (finest first, row by row)."""
        out = []
        for i, (feat, stride) in enumerate(zip(feats, STRIDES)):
            feat = self.multi_level_share_convs[i](feat)
            n, _, h, w = feat.shape
            # The score as OpenCV's FaceDetectorYN gives it: the geometric mean of class and objectness.
            score = (self.multi_level_cls[i](feat).sigmoid() * self.multi_level_obj[i](feat).sigmoid()).sqrt()
            box = self.multi_level_bbox[i](feat)
            kps = self.multi_level_kps[i](feat)
            ys, xs = torch.meshgrid(torch.arange(h, device=feat.device, dtype=feat.dtype),
                                    torch.arange(w, device=feat.device, dtype=feat.dtype), indexing="ij")
            grid = torch.stack([xs, ys])[None]  # (1, 2, h, w): each point's cell
            centre = (box[:, :2] + grid) * stride
            half = box[:, 2:].exp() * (stride / 2)
            points = (kps.view(n, 5, 2, h, w) + grid[:, None]) * stride
            level = torch.cat([score, centre - half, centre + half, points.view(n, 10, h, w)], dim=1)
            out.append(level.flatten(2))
        return torch.cat(out, dim=2).transpose(1, 2)


def folded(net: "YuNet") -> "YuNet":
    """A copy of ``net`` (in eval mode) with each BatchNorm folded into the convolution before it: one pass over
    each unit's output fewer, the same function up to rounding."""
    net = copy.deepcopy(net).eval()
    for unit in net.modules():
        if isinstance(unit, DPUnit) and unit.bn_relu:
            unit.conv2, unit.bn = fuse_conv_bn_eval(unit.conv2, unit.bn), nn.Identity()
        elif isinstance(unit, Stem):
            unit.conv1, unit.bn1 = fuse_conv_bn_eval(unit.conv1, unit.bn1), nn.Identity()
    return net


class YuNet(nn.Module):
    """The whole network: ``(N, 3, H, W)`` BGR 0-255 in (H, W multiples of 32), ``(N, P, 15)`` out (:class:`Head`)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.neck = Neck()
        self.bbox_head = Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every grid point's score, box and landmarks (:class:`Head`)."""
        return self.bbox_head(self.neck(self.backbone(x)))
