"""Building the engine and the face detector from explicit options (:class:`ModelOptions`): what every tool,
the Python API and the evaluation share. The command-line tools turn their arguments into these options."""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, TypeVar

import torch

from .choices import DEFAULT_DETECTOR
from .log import say
from .detection import FaceDetector, create_detector
from .engine import PRESETS, Engine, EngineConfig
from .engine.config import CPU_BF16, CPU_FP32
from .models.weights import UNTRAINED_LABEL, load_model
from .pipeline import Pipeline
from .runtime import DeviceError, RuntimeConfig, configure, describe, select_device

_T = TypeVar("_T")

# Seconds a wait for another thread or process lasts before it is taken up again: Python raises a Ctrl-C (or SIGTERM)
# the system gives another thread only in the main thread, once a wait there ends (here and in emonet-serve's loops).
SIGNAL_CHECK = 0.1


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
    detector: str = DEFAULT_DETECTOR       # yunet, blazeface, sfd or none
    min_score: Optional[float] = None      # None: the detector's default
    compile: bool = False                  # auto on a GPU compiles its one batch shape (a long-lived process)


# What bf16 does to the numbers, measured on a well-conditioned checkpoint over real face crops
# (docs/PERFORMANCE.md): said whenever it is asked for.
BF16_NOTE = ("bf16 keeps 8 bits of mantissa: on a well-conditioned checkpoint it moved valence and arousal by up to "
             "0.06 and 0.12 from fp32, and changed up to 9 % of expressions (docs/PERFORMANCE.md); "
             "--precision fp32 gives the released model's numbers")

# The GPU default (``--engine auto``): the fast network (fp16, channels_last, exact folding, CUDA graphs
# captured in the background while the first crops run eagerly), every crop in a batch of exactly
# AUTO_BATCH, with cuDNN's heuristic kernel choice rather than autotuning.
# Reduced-precision kernels round differently from one batch shape and one kernel to the next: with buckets
# of batch sizes, a crop's valence moved by up to 0.011 with the crops that came with it, and autotuning
# (a choice by timing) gave two processes different numbers; one shape and one deterministic choice give a
# crop the same numbers in any job, batch or process (docs/PERFORMANCE.md, *Agreement with true fp32*) --
# where that shape's kernels compute each crop apart from the others, which the engine checks on the device
# first (emonet.engine.invariance: AUTO_BATCH, halved until it holds).
AUTO_BATCH = 16
AUTO_LANES = 4  # the checked shape's graph replayed on 4 streams side by side: large batches 1.5x the crops/s
# ``auto`` compiled (ModelOptions.compile, the service's default): the same one checked shape, through
# torch.compile specialised to it (kept on disk, so a later start loads it). Its graph of 8 crops runs in about
# half the time of the uncompiled one (docs/PERFORMANCE.md), which is what a GPU loop of many streams waits
# for at every step; the first start compiles for tens of seconds. Its kernels are not the uncompiled ones, so
# a crop's numbers differ from the other tools' by their rounding. The check starts at 8, as 16 gave a crop
# other bits at other places in the batch with both engines on the GPU measured: checked first, it would cost
# a compilation for nothing.
AUTO_COMPILED_BATCH = 8


def build_engine(options: ModelOptions, batch_sizes: Sequence[int] = (1, 4, 16),
                 log: Optional[Callable[[str], None]] = None) -> Engine:
    """Configure the runtime, load the weights and build the engine the options ask for (``auto`` is ready at
    once: what makes it faster is prepared in the background); ``log`` takes its messages (default: standard
    error)."""
    log = log or say
    device, config, runtime = _configure(options, log)
    return _load_engine(options, device, config, runtime, batch_sizes, log)


def _configure(options: ModelOptions, log: Callable[[str], None]) -> tuple[torch.device, EngineConfig, RuntimeConfig]:
    """The device, the engine's configuration and the runtime's, the runtime configured (what the engine and the
    detector both run under)."""
    precision = options.precision
    if options.deterministic and precision not in ("auto", "fp32"):
        raise DeviceError(f"--deterministic computes in fp32: drop --precision {precision}")
    device = select_device(options.device, log=log)
    config = engine_config(options.engine, device, deterministic=options.deterministic, precision=precision,
                           compiled=options.compile)
    # One batch shape: cuDNN's heuristics choose its kernels (autotuning chose by timing, differently from
    # one process to the next, and ran no faster at that shape).
    autotune = options.cudnn_benchmark and not config.fixed_batch
    runtime = RuntimeConfig(device=str(device), cudnn_benchmark=autotune, deterministic=options.deterministic,
                            precision=config.precision)
    configure(runtime)
    if precision == "fp16" and device.type != "cuda":
        raise DeviceError("--precision fp16 needs a GPU; on a CPU use fp32 (exact) or bf16")
    return device, config, runtime


def _load_engine(options: ModelOptions, device: torch.device, config: EngineConfig, runtime: RuntimeConfig,
                 batch_sizes: Sequence[int], log: Callable[[str], None]) -> Engine:
    """The weights loaded and the engine built, the runtime configured (:func:`_configure`)."""
    precision = options.precision
    model = load_model(options.weights, n_expression=options.nclasses, device="cpu")
    engine = None
    if config.compile and options.compile and options.engine == "auto":
        # Asked for by default (the service), not by name: where compiling cannot be had or fails, the
        # uncompiled default runs, saying why, rather than the service not starting.
        try:
            from torch.utils._triton import has_triton

            if not has_triton():
                raise RuntimeError("Triton is not installed")
            engine = Engine(model, device, replace(config, batch_sizes=tuple(batch_sizes)), log=log)
        except Exception as exc:  # noqa: BLE001 - the compilers' errors have no common class; see _compiling_failed
            if not _compiling_failed(exc):
                raise
            log(f"warning: the engine could not be compiled ({type(exc).__name__}: "
                f"{(str(exc).splitlines() or [''])[0][:200]}); running it uncompiled (--no-compile)")
            config = engine_config(options.engine, device, deterministic=options.deterministic, precision=precision)
    if engine is None:
        engine = Engine(model, device, replace(config, batch_sizes=tuple(batch_sizes)), log=log)
    log(f"EmoNet ({model.n_expression} classes, {options.weights}) on {describe(runtime, device)}; "
        f"engine {engine.config.name}")
    if engine.config.precision == "bf16":
        log(f"note: {BF16_NOTE}")
    if engine.untrained:
        log(f"warning: {UNTRAINED_LABEL}")
    return engine


def _compiling_failed(exc: BaseException) -> bool:
    """Whether an error building the compiled engine is compiling's own, so that the uncompiled engine may run:
    not a GPU out of memory (the uncompiled one needs as much) or a CUDA error, which leaves the device unusable,
    wherever in the chain of causes they are."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, torch.cuda.OutOfMemoryError) or type(exc).__name__ == "AcceleratorError":
            return False
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return True


def build_pipeline(options: ModelOptions, batch_sizes: Sequence[int] = (1, 4, 16),
                   log: Optional[Callable[[str], None]] = None, refine: bool = False,
                   max_faces: Optional[int] = None) -> Pipeline:
    """The engine and the detector the options ask for, in one :class:`~emonet.pipeline.Pipeline` (not warmed
    up): what every tool runs. (Built one after the other: the detector built in a thread beside the weights
    started no sooner on a GPU, and a photo set's first result came later; a photo's first detection beside the
    load gains: :func:`build_pipeline_beside`.)"""
    engine = build_engine(options, batch_sizes, log)
    return Pipeline(engine, build_detector(options, engine), refine=refine, max_faces=max_faces)


def build_pipeline_beside(options: ModelOptions, work: Callable[[FaceDetector], _T],
                          batch_sizes: Sequence[int] = (1, 4, 16), log: Optional[Callable[[str], None]] = None,
                          refine: bool = False, max_faces: Optional[int] = None,
                          beside: Optional[bool] = None) -> tuple[Pipeline, Optional[_T]]:
    """:func:`build_pipeline`, with ``work(detector)`` done while the engine loads, where it can be: the pipeline
    and what ``work`` returned, or None where it was not run.

    It runs with the default, uncompiled engine on a GPU (or with ``beside=True``): the detector is built first, and ``work``
    runs on it in this thread while another thread loads the weights and builds the engine (a photo's first
    detection, whose networks' first calls at the image's size take about as long as the load). Elsewhere
    ``work`` is not run: on the CPU the two would share the cores, and an explicit engine captures its CUDA
    graphs as it loads, while no other thread may use the GPU. An error of the load is raised once ``work`` has
    ended (the work's own, if any, said on ``log``); the work's error once the load has ended; a Ctrl-C at once,
    the load's thread left to end with the process."""
    log = log or say
    device, config, runtime = _configure(options, log)
    if beside is None:
        # (The default engine captures its graphs in threads of their own, in a mode that lets other threads use
        # the GPU meanwhile; compiled, it warms up first.)
        beside = device.type == "cuda" and config.background and not config.compile
    if not beside:
        engine = _load_engine(options, device, config, runtime, batch_sizes, log)
        return Pipeline(engine, _detector(options, device, engine.config), refine=refine, max_faces=max_faces), None
    # The detector first, in this thread: it creates the CUDA context the load's thread then finds.
    detector = _detector(options, device, config)
    loaded: dict[str, object] = {}

    def load() -> None:
        try:
            loaded["engine"] = _load_engine(options, device, config, runtime, batch_sizes, log)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            loaded["error"] = exc

    # A daemon: a Ctrl-C during ``work`` is not held up by the load (a one-shot tool's process then ends).
    thread = threading.Thread(target=load, name="emonet-load", daemon=True)
    thread.start()
    failure = None
    try:
        result = work(detector)
    except Exception as exc:  # noqa: BLE001 - raised below, after the load's own error if it had one
        failure = exc
    # In short steps: a Ctrl-C the system gives another thread is raised here only once a wait ends.
    while thread.is_alive():
        thread.join(SIGNAL_CHECK)
    if "error" in loaded:
        if failure is not None:  # said, not lost: the load's error is the one raised
            log(f"warning: {failure}")
        raise loaded["error"]
    if failure is not None:
        raise failure
    return Pipeline(loaded["engine"], detector, refine=refine, max_faces=max_faces), result


def engine_config(preset: str, device: torch.device, deterministic: bool = False,
                  precision: str = "auto", compiled: bool = False) -> EngineConfig:
    """The engine configuration of an ``--engine`` preset (or ``auto``) and ``--precision`` on ``device``.

    ``auto`` is ``fast`` on a GPU with one batch shape (:data:`AUTO_BATCH`), so a crop's numbers do not
    depend on the job, and the exact fp32 network on a CPU, whatever the CPU (bf16 only when asked for), so a
    result never depends on the CPU's features or the process count. ``compiled``: ``auto`` on a GPU is
    compiled for its one shape (:data:`AUTO_COMPILED_BATCH`), for a process that lives long enough to pay for it.
    """
    gpu_auto = preset == "auto" and device.type == "cuda" and not deterministic
    if preset == "auto":
        preset = "fast" if gpu_auto else "eager"
    config = PRESETS[preset]
    if gpu_auto:
        config = replace(config, fixed_batch=AUTO_BATCH, check_batch=True, lanes=AUTO_LANES, background=True)
        if compiled:
            # One static graph for the one shape (no dynamic batch dimension, no side streams: the lanes are
            # its streams). Compiled code warms up before the first crop (Engine: a compiled engine is not
            # prepared in the background); the lanes' graphs are then captured behind it, as the default's are.
            config = replace(config, compile="default", dynamic_batch=False, streams=0,
                             fixed_batch=AUTO_COMPILED_BATCH)
    if device.type == "cpu" and preset in ("eager", "fast"):
        # eager: exact, and 1.3x faster on the CPU. No warm-up: the CPU has nothing to autotune, and a
        # batch-16 warm-up would cost seconds.
        config = CPU_BF16 if preset == "fast" else CPU_FP32
    if precision != "auto":
        config = replace(config, precision=precision)
    return config


def build_detector(options: ModelOptions, engine: Engine) -> FaceDetector:
    """The detector the options ask for, on the engine's device, the same for photos and video frames. BlazeFace
    also sees a large image in its fine view (small faces) and looks at each candidate again close up (no
    face-like thing passes); YuNet sees every face in one pass."""
    return _detector(options, engine.device, engine.config)


def _detector(options: ModelOptions, device: torch.device, config: EngineConfig) -> FaceDetector:
    """:func:`build_detector` for an engine of ``config`` on ``device`` (the engine itself may be still loading)."""
    min_score, name = options.min_score, options.detector
    kwargs = {"min_score": min_score} if min_score is not None and name != "none" else {}
    if name in ("blazeface", "yunet"):
        kwargs["cuda_graphs"] = config.cuda_graphs
        kwargs["background"] = config.background  # its graphs too, while the first frames run eagerly
    return create_detector(name, device, **kwargs)
