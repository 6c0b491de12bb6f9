"""dlib's CNN face detector in PyTorch (emonet.detection.mmod): the converted weights, the crop scorer, and the
close look's third check on real photos."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

PORTRAITS = Path(__file__).resolve().parent / "data" / "portraits"
# YuNet's box of the face in obama.jpg (rounded): the crop tools/convert_mmod.py --check scores with dlib.
PORTRAIT, PORTRAIT_BOX = "obama.jpg", (199.0, 46.0, 320.0, 224.0)
CROP_SIZE = 200


def portrait_crop() -> tuple[np.ndarray, Path]:
    """A square crop twice the portrait's face box around its centre, CROP_SIZE pixels, sampled by the close
    look's crops (emonet.detection.crops), rounded to 8-bit RGB (what dlib reads): ``(size, size, 3)`` uint8."""
    from emonet.detection.crops import close_crops

    path = PORTRAITS / PORTRAIT
    image = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
    crop = close_crops([image], [np.array([PORTRAIT_BOX])], [((2.0,), CROP_SIZE)], torch.device("cpu"),
                       scaled=False)[0][0]
    return np.ascontiguousarray(crop.round().clamp(0, 255).byte().permute(1, 2, 0).numpy()), path
