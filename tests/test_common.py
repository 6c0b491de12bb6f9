"""What the tools share (emonet.apps.common): how ``--engine auto`` picks an engine for the device and the job."""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import os
import sys
import threading
import time

import pytest
import torch

from emonet.apps.common import add_model_arguments, model_options
from emonet.build import AUTO_BATCH, AUTO_COMPILED_BATCH, ModelOptions, build_engine, build_pipeline, engine_config
from emonet.runtime import DeviceError


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
    return model_options(parser.parse_args(["--weights", "random", *argv]))


def test_the_pipeline_holds_the_engine_and_the_detector_the_options_ask_for(capsys):
    from emonet.detection.yunet import YuNetDetector

    pipeline = build_pipeline(_args("--device", "cpu", "--min-score", "0.9"), max_faces=2)
    assert isinstance(pipeline.detector, YuNetDetector) and pipeline.detector.min_score == 0.9
    assert pipeline.max_faces == 2 and pipeline.engine.config.precision == "fp32"


@pytest.mark.parametrize("hardware_bf16", [False, True])
def test_auto_on_a_cpu_is_the_exact_fp32_network_whatever_the_cpu(monkeypatch, capsys, hardware_bf16):
    # A CPU with AMX or AVX-512 BF16 (CI's has neither) gets the same engine as any other.
    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: hardware_bf16, raising=False)
    engine = build_engine(_args("--device", "cpu"))
    assert engine.config.precision == "fp32" and engine.config.fold_bn and not engine.config.cuda_graphs
    err = capsys.readouterr().err
    assert "engine fp32+cl+fold" in err and "bf16" not in err


def test_bf16_only_when_asked_for_and_it_says_what_it_costs(capsys):
    engine = build_engine(_args("--device", "cpu", "--precision", "bf16"))
    assert engine.config.precision == "bf16"
    assert "--precision fp32 gives the released model's numbers" in capsys.readouterr().err
    assert build_engine(_args("--device", "cpu", "--engine", "fast")).config.precision == "bf16"


def test_precision_fp32_overrides_the_preset(capsys):
    assert build_engine(_args("--device", "cpu", "--engine", "fast", "--precision", "fp32")).config.precision == "fp32"


@pytest.mark.parametrize("argv, message", [
    (("--precision", "fp16"), "--precision fp16 needs a GPU"),
    (("--precision", "bf16", "--deterministic"), "--deterministic computes in fp32"),
])
def test_precision_that_cannot_run_is_one_clear_error(argv, message):
    with pytest.raises(DeviceError, match=message):
        build_engine(_args("--device", "cpu", *argv))


def test_deterministic_keeps_fp32():
    assert build_engine(_args("--device", "cpu", "--deterministic")).config.precision == "fp32"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_auto_starts_at_once_and_captures_its_graphs_in_the_background(capsys):
    engine = build_engine(_args("--device", "cuda:0"))
    assert engine.config.cuda_graphs and engine.config.background and engine.warmup_ms is None
    # AUTO_BATCH, or the largest half of it whose kernels give a crop the same bits anywhere in the batch
    assert engine.config.batch_sizes in [(AUTO_BATCH >> k,) for k in range(5)] and torch.backends.cudnn.benchmark is False
    assert "captured in the background" in capsys.readouterr().err
    engine(torch.zeros(3, 3, 256, 256, dtype=torch.uint8, device="cuda:0"))  # answers, graph or not
    engine.wait_for_graphs()
    assert engine.graphs_ready_s is not None


def test_the_gpu_default_runs_one_batch_shape_and_explicit_modes_keep_their_buckets():
    gpu = torch.device("cuda", 0)  # only the configuration is built: no GPU is touched
    auto = engine_config("auto", gpu)
    assert auto.fixed_batch == AUTO_BATCH and auto.check_batch and auto.precision == "fp16" and auto.cuda_graphs
    assert auto.background
    assert not engine_config("fast", gpu).background  # the explicit modes warm up before the first crop
    assert engine_config("auto", gpu, precision="tf32").fixed_batch == AUTO_BATCH
    assert engine_config("fast", gpu).fixed_batch == 0 and engine_config("compiled", gpu).fixed_batch == 0
    assert engine_config("auto", gpu, deterministic=True).precision == "fp32"
    assert engine_config("auto", torch.device("cpu")).fixed_batch == 0


def test_a_long_lived_process_compiles_the_gpu_defaults_one_shape_and_nothing_else():
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")  # only the configuration is built
    compiled = engine_config("auto", gpu, compiled=True)
    plain = engine_config("auto", gpu)
    assert compiled.compile == "default" and not compiled.dynamic_batch and compiled.streams == 0
    # Still one checked batch shape, on the same lanes: a crop's numbers do not depend on the batch.
    assert compiled.fixed_batch == AUTO_COMPILED_BATCH and compiled.check_batch and compiled.lanes == plain.lanes
    assert compiled.precision == plain.precision == "fp16" and compiled.cuda_graphs
    # Asked by name, the presets stay what they are; a CPU, or --deterministic, never compiles.
    assert engine_config("fast", gpu, compiled=True) == engine_config("fast", gpu)
    assert engine_config("auto", cpu, compiled=True) == engine_config("auto", cpu)
    assert engine_config("auto", gpu, deterministic=True, compiled=True).compile is None


def test_the_service_compiles_by_default_and_the_other_tools_never():
    from emonet.apps.photo import parse_args as photo_args
    from emonet.apps.serve import parse_args as serve_args

    assert model_options(serve_args([])).compile is True
    assert model_options(serve_args(["--no-compile"])).compile is False
    assert model_options(photo_args(["--image", "x.jpg"])).compile is False
    assert _args().compile is False
    # On a CPU the option changes nothing: the exact fp32 network, uncompiled.
    engine = build_engine(model_options(serve_args(["--weights", "random", "--device", "cpu"])), log=lambda _: None)
    assert engine.config.compile is None and engine.config.precision == "fp32"


@pytest.mark.parametrize("error, code", [("InputError", 2), ("OutputError", 3), ("HelperError", 4)])
def test_each_kind_of_failure_is_one_line_with_its_own_exit_code(error, code, capsys):
    from emonet import errors
    from emonet.apps.common import run_tool

    def fail():
        raise getattr(errors, error)("what went wrong, and what to do")

    assert run_tool(fail) == code
    assert capsys.readouterr().err == "error: what went wrong, and what to do\n"


def test_the_tools_print_help_without_importing_torch():
    # --help is a newcomer's first command: it answers at once, the model's modules imported only to run.
    import subprocess
    import sys
    code = ("import sys, contextlib, io\n"
            "for tool in ('photo', 'video', 'evaluate', 'serve', 'export', 'train'):\n"
            "    module = __import__(f'emonet.apps.{tool}', fromlist=['main'])\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        module.main(['--help'])\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("failure, falls_back", [
    (RuntimeError("BackendCompilerFailed: backend='inductor' raised an error"), True),
    (None, True),  # no Triton: not tried
    ("oom", False),  # a GPU out of memory, wrapped by the compiler: the uncompiled engine needs as much
    (KeyboardInterrupt(), False),
])
def test_where_compiling_fails_the_uncompiled_default_runs_saying_why_but_not_out_of_memory(
        monkeypatch, failure, falls_back):
    # No GPU here: the device, its set-up and the engine are stand-ins; what is tested is build_engine's choice.
    import torch.utils._triton as triton

    import emonet.build as build

    if failure == "oom":
        failure = RuntimeError("InductorError: compiling failed")
        failure.__cause__ = torch.cuda.OutOfMemoryError("CUDA out of memory")
    built, said = [], []

    class Engine:
        def __init__(self, model, device, config, log=None):
            built.append(config)
            if config.compile and failure is not None:
                raise failure
            self.config, self.untrained = config, False

    monkeypatch.setattr(build, "Engine", Engine)
    monkeypatch.setattr(build, "select_device", lambda *a, **k: torch.device("cuda", 0))
    monkeypatch.setattr(build, "configure", lambda runtime: None)
    monkeypatch.setattr(build, "describe", lambda runtime, device: "cuda:0")
    monkeypatch.setattr(triton, "has_triton", lambda: failure is not None)
    options = ModelOptions(weights="random", compile=True)
    if not falls_back:
        with pytest.raises(type(failure)):
            build.build_engine(options, log=said.append)
        return
    engine = build.build_engine(options, log=said.append)
    plain = build.engine_config("auto", torch.device("cuda", 0))  # the uncompiled default, asked for three sizes
    assert engine.config == dataclasses.replace(plain, batch_sizes=(1, 4, 16))
    assert engine.config.compile is None and engine.config.fixed_batch == AUTO_BATCH
    assert built[0].compile == "default" if failure is not None else len(built) == 1
    (warning,) = [line for line in said if line.startswith("warning: the engine could not be compiled")]
    assert ("Triton is not installed" if failure is None else "BackendCompilerFailed") in warning
    assert warning.endswith("running it uncompiled (--no-compile)")


def _buffered() -> dict:
    """The environment with standard output buffered, as a tool's is when it writes to a file or a pipe."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _ended_by_exit_tool(code: str) -> subprocess.CompletedProcess:
    prelude = "import atexit, sys\nfrom emonet.apps.common import exit_tool\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          env=_buffered())


def test_exit_tool_ends_with_the_code_after_the_exit_handlers_and_with_the_output_flushed():
    run = _ended_by_exit_tool("atexit.register(lambda: print('handler ran'))\n"
                              "sys.stdout.write('a line with no newline yet; ')\nsys.stderr.write('said')\n"
                              "exit_tool(3)\nprint('never')")
    assert run.returncode == 3
    assert run.stdout == "a line with no newline yet; handler ran\n"
    assert run.stderr == "said"


def test_exit_tool_says_an_output_that_could_not_be_flushed_in_its_code():
    # Standard output whose reader has gone, with text still buffered: the tool cannot claim success.
    reader, writer = os.pipe()
    os.close(reader)
    try:
        run = subprocess.run([sys.executable, "-c", "import sys\nfrom emonet.apps.common import exit_tool\n"
                              "sys.stdout.write('x' * 10)\nexit_tool(0)"], stdout=writer, stderr=subprocess.PIPE,
                             text=True, timeout=60, env=_buffered())
    finally:
        os.close(writer)
    assert run.returncode == 120, run.stderr


def _portrait():
    from pathlib import Path

    from emonet.io.images import read_image

    return read_image(Path(__file__).parent / "data" / "portraits" / "obama.jpg")


def test_work_runs_while_the_engine_loads_on_the_pipelines_own_detector(monkeypatch, capsys):
    # beside=True is the GPU default engine's way, here on the CPU: the load waits until the work has begun, so
    # the two run at once (one after the other, the load would wait in vain).
    from emonet import build

    image, begun, waited = _portrait(), threading.Event(), []
    load = build._load_engine

    def load_once_the_work_has_begun(*args, **kwargs):
        waited.append(begun.wait(timeout=30))
        return load(*args, **kwargs)

    def work(detector):
        begun.set()
        return detector, detector.detect([image])

    monkeypatch.setattr(build, "_load_engine", load_once_the_work_has_begun)
    options = _args("--device", "cpu")
    pipeline, (seen, found) = build.build_pipeline_beside(options, work, beside=True)
    assert waited == [True] and seen is pipeline.detector and len(found[0]) == 1
    faces, again = pipeline([image], boxes=found)[0], build_pipeline(options)([image])[0]
    assert len(faces) == len(again) == 1
    assert faces[0].valence == again[0].valence and (faces[0].landmarks == again[0].landmarks).all()


def test_on_the_cpu_the_work_is_left_to_the_caller(capsys):
    from emonet.build import build_pipeline_beside

    ran = []
    pipeline, result = build_pipeline_beside(_args("--device", "cpu"), lambda detector: ran.append(detector) or 1)
    assert result is None and ran == [] and pipeline.detector is not None


def test_errors_of_the_load_and_of_the_work_alike_are_raised(tmp_path, capsys):
    from emonet.build import build_pipeline_beside
    from emonet.models.weights import CheckpointError

    def fails(detector):
        raise ValueError("the work's own")

    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    options = dataclasses.replace(_args("--device", "cpu"), weights=str(bad))
    with pytest.raises(CheckpointError):
        build_pipeline_beside(options, lambda detector: 1, beside=True)
    said = []
    with pytest.raises(CheckpointError):  # both failed: the load's error raised, the work's said
        build_pipeline_beside(options, fails, beside=True, log=said.append)
    assert said[-1] == "warning: the work's own"
    with pytest.raises(ValueError, match="the work's own"):
        build_pipeline_beside(_args("--device", "cpu"), fails, beside=True)


def test_a_ctrl_c_during_the_work_is_raised_without_waiting_for_the_load(monkeypatch, capsys):
    from emonet import build

    release = threading.Event()
    load = build._load_engine

    def slow_load(*args, **kwargs):
        release.wait(timeout=60)
        return load(*args, **kwargs)

    def interrupted(detector):
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "_load_engine", slow_load)
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            build.build_pipeline_beside(_args("--device", "cpu"), interrupted, beside=True)
        assert time.perf_counter() - t0 < 30
    finally:
        release.set()
