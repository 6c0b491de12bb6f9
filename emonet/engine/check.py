"""Does a fast engine read faces as the exact fp32 network does? :func:`compare` on real face crops.

The benchmark reports it for every mode; ``--engine auto`` checks it before it picks bf16 on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from ..geometry import box_to_matrix, to_tensor, warp_crops
from ..models import EmoNet
from .core import Engine

# scikit-image's astronaut (public domain), shipped with the package: real face crops for checks.
SAMPLE_PHOTO = Path(__file__).resolve().parent / "astronaut.jpg"


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


@dataclass
class Agreement:
    """How a fast mode's outputs compare with fp32 eager on the same crops."""

    n: int
    argmax_agreement: float
    max_valence_diff: float
    max_arousal_diff: float
    tolerance: float = 0.01

    @property
    def ok(self) -> bool:
        """Same arg-max everywhere; valence and arousal within the tolerance."""
        return (self.argmax_agreement == 1.0 and self.max_valence_diff <= self.tolerance
                and self.max_arousal_diff <= self.tolerance)

    def format(self) -> str:
        """One line for reports."""
        return (f"{'OK' if self.ok else 'MISMATCH'}: arg-max agreement {self.argmax_agreement:.0%} "
                f"over {self.n} crops, max |dV| {self.max_valence_diff:.4f}, max |dA| "
                f"{self.max_arousal_diff:.4f} (tolerance {self.tolerance})")


def compare(engine: Engine, reference: EmoNet, crops: torch.Tensor) -> Agreement:
    """Compare ``engine`` with the fp32 eager ``reference`` model on ``crops`` (uint8 or float in [0, 1])."""
    ref_dev = next(reference.parameters()).device
    x = crops.float() / 255.0 if crops.dtype == torch.uint8 else crops.float()
    with torch.inference_mode():
        ref = reference.float().eval()(x.to(ref_dev))
    got = engine(crops)
    ref_cls = ref["expression"].argmax(1).cpu()
    got_cls = got["expression"].argmax(1).cpu()
    def diff(key: str) -> float:
        return float((got[key].cpu().clamp(-1, 1) - ref[key].cpu().clamp(-1, 1)).abs().max())
    return Agreement(n=len(crops), argmax_agreement=float((ref_cls == got_cls).float().mean()),
                     max_valence_diff=diff("valence"), max_arousal_diff=diff("arousal"))
