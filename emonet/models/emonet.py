"""The EmoNet network (Toisoul et al., 2021), written from the project's specification.

Layer names equal the released checkpoints' state-dict names, so a released file loads with strict
key matching. Normalisation layers are BatchNorm: the released checkpoints carry BatchNorm tensors
and the released model computes them with running statistics (see the spec's §2).
"""
from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..classes import class_names

N_LANDMARKS = 68


def _conv3x3(in_ch: int, out_ch: int) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=1, padding=1, bias=False)


class ConvBlock(nn.Module):
    """Pre-activation residual block whose three 3x3 branches are concatenated (out/2, out/4, out/4)."""

    def __init__(self, in_planes: int, out_planes: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = _conv3x3(in_planes, out_planes // 2)
        self.bn2 = nn.BatchNorm2d(out_planes // 2)
        self.conv2 = _conv3x3(out_planes // 2, out_planes // 4)
        self.bn3 = nn.BatchNorm2d(out_planes // 4)
        self.conv3 = _conv3x3(out_planes // 4, out_planes // 4)
        self.downsample: nn.Module | None = None
        if in_planes != out_planes:
            self.downsample = nn.Sequential(
                nn.BatchNorm2d(in_planes),
                nn.ReLU(inplace=True),
                nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=1, bias=False),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o1 = self.conv1(F.relu(self.bn1(x)))
        o2 = self.conv2(F.relu(self.bn2(o1)))
        o3 = self.conv3(F.relu(self.bn3(o2)))
        residual = x if self.downsample is None else self.downsample(x)
        return torch.cat((o1, o2, o3), dim=1) + residual


class HourGlass(nn.Module):
    """Recursive hourglass of ConvBlocks; level ``depth`` is the outermost."""

    def __init__(self, depth: int = 4, features: int = 256) -> None:
        super().__init__()
        self.depth = depth
        # Registration order matches the released state dict's key order.
        for level in range(depth, 0, -1):
            self.add_module(f"b1_{level}", ConvBlock(features, features))
            self.add_module(f"b2_{level}", ConvBlock(features, features))
        self.add_module("b2_plus_1", ConvBlock(features, features))
        for level in range(1, depth + 1):
            self.add_module(f"b3_{level}", ConvBlock(features, features))

    def _level(self, level: int, inp: torch.Tensor) -> torch.Tensor:
        up1 = self._modules[f"b1_{level}"](inp)
        low1 = self._modules[f"b2_{level}"](F.max_pool2d(inp, 2, stride=2))
        if level > 1:
            low2 = self._level(level - 1, low1)
        else:
            low2 = self._modules["b2_plus_1"](low1)
        low3 = self._modules[f"b3_{level}"](low2)
        return up1 + F.interpolate(low3, scale_factor=2, mode="nearest")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._level(self.depth, x)


class EmoNet(nn.Module):
    """EmoNet: 2 stacked hourglasses for 68 landmarks, and an emotion head for expression, valence, arousal.

    Input: ``(N, 3, 256, 256)`` RGB in [0, 1]. Output: a dict with ``heatmap`` ``(N, 68, 64, 64)``,
    ``expression`` logits ``(N, n_expression)``, ``valence`` ``(N,)`` and ``arousal`` ``(N,)`` (raw,
    not clamped).
    """

    n_stacks = 2

    def __init__(self, n_expression: int = 8, attention: bool = True) -> None:
        super().__init__()
        if n_expression < 1:
            raise ValueError(f"n_expression must be positive, got {n_expression}")
        self.n_expression = n_expression
        self.attention = attention
        # Set by emonet.load_model to the checkpoint path; "random" means untrained weights.
        self.weights_source = "random"

        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.bn1 = nn.BatchNorm2d(64)
        self.conv2 = ConvBlock(64, 128)
        self.conv3 = ConvBlock(128, 128)
        self.conv4 = ConvBlock(128, 256)
        self.stem_pool = nn.MaxPool2d(2, 2)

        for i in range(self.n_stacks):
            self.add_module(f"m{i}", HourGlass(4, 256))
            self.add_module(f"top_m_{i}", ConvBlock(256, 256))
            self.add_module(f"conv_last{i}", nn.Conv2d(256, 256, kernel_size=1))
            self.add_module(f"bn_end{i}", nn.BatchNorm2d(256))
            self.add_module(f"l{i}", nn.Conv2d(256, N_LANDMARKS, kernel_size=1))
            if i < self.n_stacks - 1:
                self.add_module(f"bl{i}", nn.Conv2d(256, 256, kernel_size=1))
                self.add_module(f"al{i}", nn.Conv2d(N_LANDMARKS, 256, kernel_size=1))

        head_in = 256 * (self.n_stacks + 1) if attention else 256 * (self.n_stacks + 1) + N_LANDMARKS
        self.conv1x1_input_emo_2 = nn.Conv2d(head_in, 256, kernel_size=1)
        layers: list[nn.Module] = []
        for _ in range(4):
            layers += [ConvBlock(256, 256), nn.MaxPool2d(2, 2)]
        self.emo_net_2 = nn.Sequential(*layers)
        self.emo_fc_2 = nn.Sequential(
            nn.Linear(256, 128),
            nn.BatchNorm1d(128),
            nn.ReLU(inplace=True),
            nn.Linear(128, n_expression + 2),
        )

    @property
    def class_names(self) -> tuple[str, ...]:
        """Display names of the expression classes."""
        return class_names(self.n_expression)

    @property
    def untrained(self) -> bool:
        """True when the weights are random: predictions are meaningless, only timings are."""
        return self.weights_source == "random"

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        """The 256x256 input down to 256 features at 64x64."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.stem_pool(self.conv2(x))
        return self.conv4(self.conv3(x))

    def stack_tail(self, i: int, hg: torch.Tensor, previous: torch.Tensor):
        """After stack ``i``'s hourglass: its features, its heatmap and the next stack's input."""
        ll = self._modules[f"top_m_{i}"](hg)
        ll = F.relu(self._modules[f"bn_end{i}"](self._modules[f"conv_last{i}"](ll)))
        heat = self._modules[f"l{i}"](ll)
        if i < self.n_stacks - 1:
            ll = self._modules[f"bl{i}"](ll)
            previous = previous + ll + self._modules[f"al{i}"](heat)
        return ll, heat, previous

    def head(self, x: torch.Tensor, features: list, heat: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The emotion head on the stem's and stacks' features; returns the output dict."""
        if self.attention:
            mask = heat.sum(dim=1, keepdim=True)
            emo = self.conv1x1_input_emo_2(torch.cat((x, torch.cat(features, dim=1) * mask), dim=1))
        else:
            emo = self.conv1x1_input_emo_2(torch.cat((x, *features, heat), dim=1))
        return self.emotion(emo, heat)

    def emotion(self, emo: torch.Tensor, heat: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The head after its input convolution: blocks, pooling and the linear layers; the output dict."""
        emo = self.emo_net_2(emo)
        emo = F.adaptive_avg_pool2d(emo, 1).flatten(1)
        out = self.emo_fc_2(emo)
        n = self.n_expression
        return {
            "heatmap": heat,
            "expression": out[:, :n],
            "valence": out[:, n],
            "arousal": out[:, n + 1],
        }

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        x = self.stem(x)
        previous, features, heat = x, [], x
        for i in range(self.n_stacks):
            ll, heat, previous = self.stack_tail(i, self._modules[f"m{i}"](previous), previous)
            features.append(ll)
        return self.head(x, features, heat)
