"""Building the engine and the face detector from explicit options (:class:`ModelOptions`): what every tool,
the Python API and the evaluation share. The command-line tools turn their arguments into these options."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch

from .detection import create_detector
from .engine import PRESETS, Engine, EngineConfig
from .engine.config import CPU_BF16, CPU_FP32
from .models.weights import UNTRAINED_LABEL, load_model
from .runtime import DeviceError, RuntimeConfig, configure, describe


@dataclass(frozen=True)
class ModelOptions:
    """Which weights, device, engine and detector: the tools' model options (``--weights``, ``--device``, ...)."""

    weights: str = "pretrained"            # a path, "pretrained" or "random"
    nclasses: Optional[int] = None         # None: read from the checkpoint
    device: Optional[str] = None           # None: cuda:0, else the CPU
    engine: str = "auto"                   # auto or a preset of emonet.engine.PRESETS
    precision: str = "auto"                # auto (the engine's own), fp32, tf32, fp16 or bf16
    cudnn_benchmark: bool = True
    deterministic: bool = False
    detector: str = "blazeface"            # blazeface, sfd or none
    min_score: Optional[float] = None      # None: the detector's default


# What bf16 does to the numbers, measured on a well-conditioned checkpoint over real face crops
# (docs/PERFORMANCE.md): said whenever it is asked for.
BF16_NOTE = ("bf16 keeps 8 bits of mantissa: on a well-conditioned checkpoint it moved valence and arousal by up to "
             "0.06 and 0.12 from fp32, and changed up to 9 % of expressions (docs/PERFORMANCE.md); "
             "--precision fp32 gives the released model's numbers")

# Crops below which a job does not repay capturing CUDA graphs and warming up every batch size (about
# 1 s per batch size at start, against a few ms saved per call): such a job runs the same fast network
# eagerly, and cuDNN tunes only the shapes it meets.
GRAPHS_PAY_FROM = 500


def build_engine(options: ModelOptions, batch_sizes: Sequence[int] = (1, 4, 16),
                 job: Optional[int] = None) -> Engine:
    """Configure the runtime, load the weights and build the engine the options ask for; ``job``, where
    known, is how many images or frames the run will read, so that ``auto`` prepares only what pays."""
    # A small job under auto: cuDNN's autotuning (seconds for the first image's ~40 convolution shapes)
    # would not repay itself either; its heuristics pick the kernels.
    small = options.engine == "auto" and job is not None and job < GRAPHS_PAY_FROM
    precision = options.precision
    if options.deterministic and precision not in ("auto", "fp32"):
        raise DeviceError(f"--deterministic computes in fp32: drop --precision {precision}")
    runtime = RuntimeConfig(device=options.device, cudnn_benchmark=options.cudnn_benchmark and not small,
                            deterministic=options.deterministic, precision=precision if precision != "auto" else "fp32")
    device = configure(runtime)
    if precision == "fp16" and device.type != "cuda":
        raise DeviceError("--precision fp16 needs a GPU; on a CPU use fp32 (exact) or bf16")
    model = load_model(options.weights, n_expression=options.nclasses, device="cpu")
    config = engine_config(options.engine, device, deterministic=options.deterministic, precision=precision)
    note = ""
    if small and config.cuda_graphs:
        config = replace(config, cuda_graphs=False, warmup=False)
        note = (f" (no CUDA graphs, warm-up or cuDNN autotuning for a job of {job}: they would cost more than "
                f"they save)")
    engine = Engine(model, device, replace(config, batch_sizes=tuple(batch_sizes)))
    print(f"EmoNet ({model.n_expression} classes, {options.weights}) on {describe(runtime, device)}; "
          f"engine {engine.config.name}{note}", file=sys.stderr)
    if engine.config.precision == "bf16":
        print(f"note: {BF16_NOTE}", file=sys.stderr)
    if engine.untrained:
        print(f"warning: {UNTRAINED_LABEL}", file=sys.stderr)
    return engine


def engine_config(preset: str, device: torch.device, deterministic: bool = False,
                  precision: str = "auto") -> EngineConfig:
    """The engine configuration of an ``--engine`` preset (or ``auto``) and ``--precision`` on ``device``.

    ``auto`` is ``fast`` on a GPU and the exact fp32 network on a CPU, whatever the CPU (bf16 only when
    asked for), so a result never depends on the CPU's features or the process count.
    """
    if preset == "auto":
        preset = "fast" if device.type == "cuda" and not deterministic else "eager"
    config = PRESETS[preset]
    if device.type == "cpu" and preset in ("eager", "fast"):
        # eager: exact, and 1.3x faster on the CPU. No warm-up: the CPU has nothing to autotune, and a
        # batch-16 warm-up would cost seconds.
        config = CPU_BF16 if preset == "fast" else CPU_FP32
    if precision != "auto":
        config = replace(config, precision=precision)
    return config


def build_detector(options: ModelOptions, engine: Engine, video: bool = False):
    """The detector the options ask for, on the engine's device. For photos, BlazeFace also searches
    overlapping tiles of a large image (small faces) and looks at each candidate again close up (no
    face-like thing passes); the video tool leaves both off for speed (docs/PERFORMANCE.md)."""
    min_score, name = options.min_score, options.detector
    kwargs = {"min_score": min_score} if min_score is not None and name != "none" else {}
    if name == "blazeface":
        kwargs["cuda_graphs"] = engine.config.cuda_graphs  # a small job runs both networks eagerly
        kwargs["tiles"] = kwargs["verify"] = not video
    return create_detector(name, engine.device, **kwargs)
