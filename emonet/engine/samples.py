"""Real face crops for checks, from the sample photo shipped with the package: what the engine's checks, the
conditioned checkpoint (:mod:`.check`) and the benchmarks run on."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from ..geometry import box_to_matrix, to_tensor, warp_crops

# scikit-image's astronaut (public domain), shipped with the package: real face crops for checks.
SAMPLE_PHOTO = Path(__file__).resolve().parent / "astronaut.jpg"
CONDITIONED_SEED = 20261125  # conditioned_model's default seed


def real_face_crops(n: int = 16) -> torch.Tensor:
    """``n`` real 256x256 face crops (uint8): the test photo's face with small shifts, zooms and flips."""
    image = cv2.imread(str(SAMPLE_PHOTO))
    if image is None:
        raise FileNotFoundError(f"the sample photo is missing: {SAMPLE_PHOTO}; reinstall emonet")
    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    rng = np.random.default_rng(0)
    box = np.array([175.0, 70.0, 275.0, 185.0])  # the astronaut's face (hand-checked)
    mats = [box_to_matrix(box + rng.normal(0, 4, 4)) for _ in range(n)]
    crops = warp_crops(image, mats)
    crops[1::2] = crops[1::2, :, ::-1]
    return to_tensor(crops)


def varied_face_crops(n: int = 32) -> torch.Tensor:
    """``n`` real face crops that differ more than :func:`real_face_crops`' (wider shifts and zooms, flips,
    and changes of brightness, contrast and colour balance), for estimating statistics."""
    image = cv2.cvtColor(cv2.imread(str(SAMPLE_PHOTO)), cv2.COLOR_BGR2RGB)
    rng = np.random.default_rng(1)
    box = np.array([175.0, 70.0, 275.0, 185.0])
    mats = [box_to_matrix(box + rng.normal(0, 12, 4)) for _ in range(n)]
    crops = warp_crops(image, mats).astype(np.float32)
    gain = rng.uniform(0.6, 1.4, (n, 1, 1, 3)) * rng.uniform(0.7, 1.3, (n, 1, 1, 1))
    crops = (crops - 128.0) * gain + 128.0 + rng.normal(0, 20, (n, 1, 1, 1))
    crops = np.clip(crops, 0, 255).astype(np.uint8)
    crops[1::2] = crops[1::2, :, ::-1]
    return to_tensor(crops)
