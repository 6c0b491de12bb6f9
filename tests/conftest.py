"""Shared fixtures: checkpoints in the released format made by the tests, the compact parity reference
(``tests/data``, always here), and the larger shared reference (``../shared/reference``, optional)."""
from __future__ import annotations

from pathlib import Path

import pytest
import numpy as np
import torch

import emonet
from emonet.log import install
from emonet.models import EmoNet

# The library's messages as the tools show them (one line each on standard error), for the tests that read them.
install()

DATA = Path(__file__).resolve().parent / "data"
PARITY = DATA / "emonet_parity_compact.pt"
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


def rebuild_parity_weights(n_expression: int, seed: int, keys: list[str]) -> dict[str, torch.Tensor]:
    """The compact reference's weights, rebuilt by its published recipe (the reference README)."""
    shapes = {k: v.shape for k, v in EmoNet(n_expression).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key in keys:
        shape = shapes[key]
        if key.endswith("num_batches_tracked"):
            state[key] = torch.zeros(shape, dtype=torch.long)
        elif key.endswith("running_mean"):
            state[key] = 0.1 * torch.randn(shape, generator=g)
        elif key.endswith("running_var"):
            state[key] = 0.5 + 1.5 * torch.rand(shape, generator=g)
        elif key.endswith("weight") and len(shape) == 1:
            state[key] = 0.5 + torch.rand(shape, generator=g)
        elif key.endswith("bias"):
            state[key] = 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = 1
            for s in shape[1:]:
                fan_in *= s
            state[key] = torch.randn(shape, generator=g) * (0.25 / fan_in) ** 0.5
    return state


@pytest.fixture(scope="session")
def parity_data() -> dict:
    """The compact reference: inputs, and the released model's outputs for 8 and 5 classes."""
    return torch.load(PARITY, weights_only=True)


@pytest.fixture(scope="session")
def parity(parity_data):
    """``parity(n) -> (model, uint8 inputs, expected outputs)``: the released model's outputs for weights
    rebuilt from the compact reference's seed."""
    cache: dict = {}

    def get(n: int = 8):
        if n not in cache:
            ref = parity_data[f"n{n}"]
            model = EmoNet(n)
            model.load_state_dict(rebuild_parity_weights(n, parity_data["seed"], ref["keys"]))
            model.weights_source = f"parity-{n}"
            cache[n] = model.eval()
        return cache[n], parity_data["inputs_uint8"], parity_data[f"n{n}"]
    return get


@pytest.fixture(scope="session")
def parity_checkpoint(parity, tmp_path_factory) -> Path:
    """The 8-class parity model saved as the released files are (``module.`` prefix)."""
    path = tmp_path_factory.mktemp("parity") / "emonet_8.pth"
    torch.save({f"module.{k}": v for k, v in parity(8)[0].state_dict().items()}, path)
    return path


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
    """The larger shared reference (a full checkpoint and its outputs), beside this repository's CI only."""
    if not (REFERENCE_DIR / "emonet8_reference.pth").is_file():
        pytest.skip(f"the shared reference is not here ({REFERENCE_DIR}); the compact parity tests cover "
                    f"the same ground")
    return REFERENCE_DIR


@pytest.fixture(scope="session")
def reference_model(parity_checkpoint):
    """The parity model, loaded through the public loader from a released-format checkpoint."""
    return emonet.load_model(parity_checkpoint, device="cpu")


FACE = np.array([175, 70, 275, 185])  # the astronaut's face in scikit-image's photo, checked by eye


def small_faces_scene(widths=(40, 60, 90), places=((300, 700), (1000, 200), (1500, 800))):
    """A 1920x1080 real scene (scikit-learn's photo of a temple, enlarged) holding copies of a real face
    (scikit-image's astronaut) ``widths`` px wide at ``places``; returns the scene and the faces' boxes."""
    import cv2

    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn holds the scene")
    data = pytest.importorskip("skimage.data", reason="scikit-image holds the face")
    scene = cv2.resize(np.ascontiguousarray(datasets.load_sample_image("china.jpg")), (1920, 1080))
    astronaut = np.ascontiguousarray(data.astronaut())
    truth = []
    for (x, y), width in zip(places, widths):
        s = width / (FACE[2] - FACE[0])
        small = cv2.resize(astronaut, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
        fx, fy = int(FACE[0] * s), int(FACE[1] * s)
        pad = int(width * 0.6)
        patch = small[max(fy - pad, 0):fy + int((FACE[3] - FACE[1]) * s) + pad, max(fx - pad, 0):fx + width + pad]
        scene[y:y + patch.shape[0], x:x + patch.shape[1]] = patch
        ox, oy = x - max(fx - pad, 0), y - max(fy - pad, 0)
        truth.append(FACE * s + [ox, oy, ox, oy])
    return scene, truth


def free_port() -> int:
    """A TCP port free on loopback now (for a server or sender the test starts)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
