import pytest
import torch

import emonet
from emonet.runtime import DeviceError, RuntimeConfig, configure, prepare_input, prepare_model, select_device


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
        model = prepare_model(emonet.EmoNet(8), config, device)  # random init drawn from the seed
        x = torch.rand(2, 3, 256, 256)  # so is the input
        with torch.no_grad():
            return model(prepare_input(x, config, device))
    a, b = run(), run()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("precision, channels_last, tol", [
    ("fp32", True, 1e-5), ("tf32", False, 1e-5), ("bf16", False, 0.1), ("bf16", True, 0.1),
])
def test_precision_and_memory_format_switches_work(reference_dir, precision, channels_last, tol):
    config = RuntimeConfig(device="cpu", precision=precision, channels_last=channels_last)
    device = configure(config)
    model = prepare_model(emonet.load_model(reference_dir / "emonet8_reference.pth", device="cpu"),
                          config, device)
    io = torch.load(reference_dir / "emonet8_reference_io.pt", weights_only=True)
    x = prepare_input(io["input"], config, device)
    assert x.dtype == config.dtype
    assert x.is_contiguous(memory_format=torch.channels_last) == channels_last
    with torch.no_grad():
        out = model(x)
    assert out["expression"].dtype == config.dtype
    rel = (out["expression"].float() - io["expression"]).norm() / io["expression"].norm()
    assert rel < tol


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of"):
        RuntimeConfig(precision="int4")
