"""emonet-export for real: PyTorch's ONNX exporter, the file run by ONNX Runtime on the CPU against the engine's
exact fp32 on real face crops, its provenance, and bad input."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
import onnxruntime as ort  # noqa: E402

from emonet.engine import Engine  # noqa: E402
from emonet.engine.check import real_face_crops  # noqa: E402
from emonet.engine.config import CPU_FP32  # noqa: E402
from emonet.export import OUTPUTS, read_metadata  # noqa: E402
from emonet.models.weights import load_model  # noqa: E402
from emonet.provenance import file_sha256  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # the exporter, in processes of its own


def export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emonet.apps.export", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def export_run(parity_checkpoint, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    path = tmp_path_factory.mktemp("onnx") / "emonet8.onnx"
    run = export("--weights", str(parity_checkpoint), "--output", str(path))
    assert run.returncode == 0, run.stderr
    return path, run


@pytest.fixture(scope="module")
def exported(export_run) -> Path:
    path, run = export_run
    assert "the same expression for every crop" in run.stderr and f"written: {path}" in run.stderr
    return path


def test_it_says_each_step_as_it_starts_and_nothing_of_torchs_internals(export_run):
    path, run = export_run
    lines = run.stderr.splitlines()
    assert lines[0].startswith("exporting EmoNet to ONNX (batch dynamic; about "), run.stderr
    assert lines[1].startswith("checking it: ONNX Runtime (CPU) against PyTorch fp32 on 16 real face crops")
    assert lines[2].startswith("ONNX Runtime (CPU) vs PyTorch fp32") and lines[3].startswith(f"written: {path}")
    # Nothing else: no "torchvision is not installed" notice, no FutureWarning from torch's own pytree code.
    assert len(lines) == 4, run.stderr


def test_help_shows_examples():
    run = export("--help")
    assert run.returncode == 0 and "examples:" in run.stdout and "--output emonet8.onnx" in run.stdout


def test_onnx_runtime_gives_the_engines_fp32_numbers_on_real_faces(exported, parity_checkpoint):
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == list(OUTPUTS)
    crops = real_face_crops(12)  # not the crops the export checked itself on
    got = dict(zip(OUTPUTS, session.run(None, {"crops": crops.numpy()})))  # a batch size of its own: dynamic
    engine = Engine(load_model(parity_checkpoint, device="cpu"), "cpu", CPU_FP32)
    want = {k: v.numpy() for k, v in engine(crops).items()}
    assert got["expression"].shape == (12, 8) and got["heatmap"].shape == (12, 68, 64, 64)
    for name in ("expression", "valence", "arousal"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got["landmarks"], want["landmarks"], atol=1e-4, rtol=0)


def test_the_file_says_which_weights_it_holds(exported, parity_checkpoint):
    meta = read_metadata(exported)
    assert meta["weights_sha256"] == file_sha256(parity_checkpoint) and meta["precision"] == "fp32"
    assert meta["classes"].split(",")[:2] == ["Neutral", "Happy"] and meta["batch"] == "dynamic"


def test_a_fixed_batch(parity_checkpoint, tmp_path):
    path = tmp_path / "b4.onnx"
    assert export("--weights", str(parity_checkpoint), "--output", str(path), "--batch", "4").returncode == 0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [4, 3, 256, 256]
    assert session.run(None, {"crops": real_face_crops(4).numpy()})[1].shape == (4,)


@pytest.mark.parametrize("args, message", [
    (("--weights", "random", "--output", "model.txt"), "name the ONNX file .onnx"),
    (("--weights", "/nope.pth", "--output", "model.onnx"), "/nope.pth"),
    (("--weights", "random", "--output", "/dev/null/model.onnx"), "/dev/null"),
])
def test_bad_input_is_one_line_and_nothing_is_written(args, message, tmp_path):
    run = subprocess.run([sys.executable, "-m", "emonet.apps.export", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
