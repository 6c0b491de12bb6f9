import pytest
import torch

import emonet
from emonet.engine import Engine, EngineConfig
from emonet.runtime import DeviceError, RuntimeConfig, configure, select_device


@pytest.fixture(autouse=True)
def _restore_flags():
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.are_deterministic_algorithms_enabled())
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[:2]
    torch.use_deterministic_algorithms(saved[2])


def test_default_device_falls_back_to_cpu_with_one_warning(capsys):
    if torch.cuda.is_available():
        assert select_device() == torch.device("cuda:0")
    else:
        assert select_device() == torch.device("cpu")
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no CUDA GPU" in err


def test_explicit_devices():
    assert select_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceError, match="unknown device"):
        select_device("tpu:7")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA GPU is available"):
            select_device("cuda:0")


def test_cudnn_benchmark_is_on_by_default_with_a_switch():
    configure(RuntimeConfig(device="cpu"))
    assert torch.backends.cudnn.benchmark
    configure(RuntimeConfig(device="cpu", cudnn_benchmark=False))
    assert not torch.backends.cudnn.benchmark


def test_deterministic_mode_gives_bit_identical_outputs():
    def run():
        config = RuntimeConfig(device="cpu", deterministic=True, seed=123)
        device = configure(config)
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
        model = emonet.EmoNet(8).to(device).eval()  # random init drawn from the seed
        x = torch.rand(2, 3, 256, 256)  # so is the input
        with torch.no_grad():
            return model(x.to(device))
    a, b = run(), run()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("precision, channels_last, tol", [
    ("fp32", True, 1e-5), ("tf32", False, 1e-5), ("bf16", False, 0.1), ("bf16", True, 0.1),
])
def test_precision_and_memory_format_switches_work(parity, precision, channels_last, tol):
    configure(RuntimeConfig(device="cpu", precision=precision))
    model, inputs, expected = parity(8)
    engine = Engine(model, "cpu", EngineConfig(precision=precision, channels_last=channels_last, warmup=False))
    assert engine.model.conv1.weight.dtype == RuntimeConfig(precision=precision).dtype
    assert engine.model.conv1.weight.is_contiguous(memory_format=torch.channels_last) == channels_last
    out = engine(inputs)
    rel = (out["expression"] - expected["expression"]).norm() / expected["expression"].norm()
    assert rel < tol


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of"):
        RuntimeConfig(precision="int4")
