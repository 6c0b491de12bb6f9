"""Shared fixtures: checkpoints in the released format, made by the tests, and the shared reference."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from emonet.models import EmoNet

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference"
if not REFERENCE_DIR.is_dir():  # a clone with shared/ inside it
    REFERENCE_DIR = Path(__file__).resolve().parents[1] / "shared" / "reference"


def _random_state_dict(n_expression: int, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = EmoNet(n_expression)
    # Non-trivial running statistics, so BatchNorm in eval mode is really exercised.
    for m in model.modules():
        if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.BatchNorm1d)):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.state_dict()


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory) -> Path:
    """A folder of checkpoints saved as the released files are: 8 classes with a ``module.`` prefix, 5 without."""
    root = tmp_path_factory.mktemp("checkpoints")
    sd8 = _random_state_dict(8, seed=1)
    torch.save({f"module.{k}": v for k, v in sd8.items()}, root / "emonet_8.pth")
    torch.save(_random_state_dict(5, seed=2), root / "emonet_5.pth")
    return root


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The shared reference checkpoint and its expected outputs."""
    if not (REFERENCE_DIR / "emonet8_reference.pth").is_file():
        pytest.fail(f"shared reference not found at {REFERENCE_DIR}")
    return REFERENCE_DIR
