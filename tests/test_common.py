"""What the tools share (emonet.apps.common): how ``--engine auto`` picks an engine for the device and the job."""
from __future__ import annotations

import argparse

import pytest
import torch

from emonet.apps import common
from emonet.apps.common import GRAPHS_PAY_FROM, add_model_arguments, build_engine


@pytest.fixture(autouse=True)
def torch_flags():
    """build_engine sets PyTorch's global flags, as a tool's process should; tests after these need them back."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             torch.backends.cudnn.deterministic)
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[1:]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    return parser.parse_args(["--weights", "random", *argv])


def test_auto_on_a_cpu_without_hardware_bf16_is_the_exact_fp32_network(monkeypatch, capsys):
    monkeypatch.setattr(common, "native_bf16", lambda: False)
    engine = build_engine(_args("--device", "cpu"))
    assert engine.config.precision == "fp32" and engine.config.fold_bn and not engine.config.cuda_graphs
    assert "engine fp32+cl+fold" in capsys.readouterr().err


def test_auto_on_a_cpu_with_hardware_bf16_checks_agreement_and_takes_bf16(monkeypatch, capsys):
    # The branch a CPU with AMX or AVX-512 BF16 takes; the agreement check itself runs for real.
    monkeypatch.setattr(common, "native_bf16", lambda: True)
    engine = build_engine(_args("--device", "cpu"))
    assert engine.config.precision == "bf16"
    assert "agrees with fp32 on real faces" in capsys.readouterr().err


def test_deterministic_keeps_fp32_whatever_the_cpu(monkeypatch):
    monkeypatch.setattr(common, "native_bf16", lambda: True)
    assert build_engine(_args("--device", "cpu", "--deterministic")).config.precision == "fp32"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("job, graphs", [(1, False), (GRAPHS_PAY_FROM, True), (None, True)])
def test_on_a_gpu_a_small_job_gets_no_graphs_and_no_warm_up(job, graphs, capsys):
    engine = build_engine(_args("--device", "cuda:0"), job=job)
    assert engine.config.cuda_graphs is graphs and engine.config.warmup is graphs
    assert torch.backends.cudnn.benchmark is graphs
    assert ("no CUDA graphs, warm-up or cuDNN autotuning" in capsys.readouterr().err) is not graphs
