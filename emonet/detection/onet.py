"""The second opinion of the close look: MTCNN's output network (ONet; Zhang et al., 2016), which scores a
48x48 crop as a face or not. Trained on other data than BlazeFace (WIDER FACE and CelebA), it disagrees with
BlazeFace's models where they are fooled: an animal's face, a squashed photo. Weights shipped with the package
(``onet.pth``, MIT: see ``NOTICE.onet``); ``tools/convert_onet.py`` made them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

import numpy as np
import torch
from torch import nn

from .base import DetectorError

ONET_WEIGHTS = Path(__file__).with_name("onet.pth")
ONET_SIZE = 48


class ONet(nn.Module):
    """MTCNN's ONet: ``(B, 3, 48, 48)`` RGB scaled as ``(x - 127.5) / 128`` -> the face probability ``(B,)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)   # face or not
        self.dense6_2 = nn.Linear(256, 4)   # box regression (unused here)
        self.dense6_3 = nn.Linear(256, 10)  # five landmarks (unused here)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))
        # The weights come from a network that read images transposed (Caffe's MATLAB interface): the dense
        # layer takes its features in that order.
        x = self.prelu5(self.dense5(x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)))
        return torch.softmax(self.dense6_1(x), dim=1)[:, 1]


def load_onet(device: Union[str, torch.device], path: Union[str, Path, None] = None) -> ONet:
    """ONet with the shipped weights (tensors only: loaded with ``weights_only``), in eval mode on ``device``."""
    path = Path(path) if path else ONET_WEIGHTS
    if not path.is_file():
        raise DetectorError(f"ONet weights not found at {path}; reinstall emonet (the file ships with the package)")
    net = ONet()
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return net.to(device).eval()


def onet_input(crops: torch.Tensor) -> torch.Tensor:
    """Crops in [-1, 1] (as :func:`~emonet.detection.crops.zoomed_crops` makes them) -> ONet's scaling."""
    return crops * np.float32(127.5 / 128.0)
