"""Agreement measured where it shows (emonet.engine.check): a checkpoint whose outputs spread over real faces,
reproducible from a seed, and the CPU's exact default against bf16 on it."""
from __future__ import annotations

import pytest
import torch

from emonet.engine import Engine, agreement, conditioned_model, true_fp32, varied_face_crops
from emonet.engine.config import CPU_BF16, CPU_FP32


@pytest.fixture(scope="module")
def faces() -> torch.Tensor:
    return varied_face_crops(16)


@pytest.fixture(scope="module")
def conditioned(faces):
    return conditioned_model(faces, batch=8)


@pytest.fixture(scope="module")
def reference(conditioned, faces):
    return true_fp32(conditioned, faces)


def test_the_conditioned_checkpoint_spreads_its_outputs_over_real_faces(conditioned, reference, faces):
    for key in ("valence", "arousal"):
        values = reference[key]
        assert values.abs().max() <= 1.0 and float(values.max() - values.min()) >= 1.0, key
    assert len(reference["expression"].argmax(1).unique()) >= 3  # several classes win
    again = conditioned_model(faces, batch=8)  # reproducible from the seed
    for (k, a), b in zip(conditioned.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    assert conditioned.weights_source.startswith("conditioned-")


def test_the_cpu_default_gives_fp32_numbers_whatever_the_thread_count(conditioned, reference, faces):
    engine = Engine(conditioned, "cpu", CPU_FP32)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(engine(faces))
    finally:
        torch.set_num_threads(threads)
    for key in ("expression", "valence", "arousal"):
        assert torch.allclose(outs[0][key], outs[1][key], atol=1e-4, rtol=0), key
    exact = agreement(outs[0], reference, tolerance=1e-4)
    assert exact.ok, exact.format()


def test_bf16_shows_its_error_on_the_conditioned_checkpoint(conditioned, reference, faces):
    # Near-constant random weights hid this (0.0003); a checkpoint whose outputs move shows it.
    bf16 = agreement(Engine(conditioned, "cpu", CPU_BF16)(faces), reference)
    assert max(bf16.max_valence_diff, bf16.max_arousal_diff) > 0.005, bf16.format()
