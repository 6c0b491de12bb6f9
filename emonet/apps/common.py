"""What the command-line tools share: model options, building the engine and detector, and clean failures."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Callable, Optional, Sequence

import torch

from ..models.weights import UNTRAINED_LABEL, CheckpointError, load_model
from ..detection import DETECTORS, DetectorError, create_detector
from ..engine import PRESETS, Engine, EngineConfig
from ..io.images import InputError
from ..runtime import PRECISIONS, DeviceError, RuntimeConfig, configure, describe


ENGINE_HELP = ("how the network runs (default: auto). auto: 'fast' on a GPU (without CUDA graphs for a job "
               "of a few images, which would not repay them); on a CPU, the exact fp32 network, whatever the "
               "CPU; fp32 with --deterministic. eager: the released model as it is, fp32, one call per batch. "
               "fast: fp16 on a GPU (bf16 on a CPU), channels_last, exact folding of BatchNorm and the 1x1 "
               "convolutions, CUDA graphs; on a GPU as close to fp32 as PyTorch's default TF32 arithmetic "
               "(docs/PERFORMANCE.md). compiled: fast + torch.compile and "
               "side CUDA streams up to batch 8 (minutes to compile once per machine, fastest after). tuned: "
               "compiled, with kernels tuned on the GPU (long runs at large batch; about 15 s more at every "
               "start). max: compiled with max-autotune (a very slow first start)")


def _score(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser, detector: bool = True) -> None:
    """--weights, --nclasses, --device, --engine, cuDNN and determinism switches (and --detector)."""
    g = parser.add_argument_group("model")
    g.add_argument("--weights", default="pretrained",
                   help="checkpoint path; 'pretrained' (the authors' emonet_N.pth from ./pretrained/ or "
                        "$EMONET_HOME, else downloaded; CC BY-NC-ND 4.0); or 'random' (untrained: to try "
                        "the tools and time them). Default: pretrained")
    g.add_argument("--nclasses", type=int, choices=[8, 5], default=None,
                   help="expression classes; read from the checkpoint when omitted (8 for pretrained)")
    g.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda:0 if present, else cpu)")
    g.add_argument("--engine", default="auto", choices=["auto", *PRESETS], help=ENGINE_HELP)
    g.add_argument("--precision", default="auto", choices=["auto", *PRECISIONS], help=PRECISION_HELP)
    g.add_argument("--no-cudnn-benchmark", action="store_true",
                   help="turn cuDNN autotuning off (faster start, slower steady state)")
    g.add_argument("--deterministic", action="store_true",
                   help="bit-reproducible results: deterministic algorithms, fp32, seeded")
    if detector:
        g.add_argument("--detector", default="blazeface", choices=DETECTORS,
                       help="blazeface (default; ships with the package, works offline; in photos larger than "
                            "512 px it also searches overlapping tiles for small faces), sfd (S3FD, the "
                            "released demo's; downloads its weights on first use) or none (each image is "
                            "already a tight face crop)")
        g.add_argument("--min-score", type=_score, default=None, metavar="S",
                       help="report faces the detector scores at least S, between 0 and 1 (default for "
                            "blazeface: 0.75 in photos, where each candidate is looked at again close up, chosen on "
                            "real photos so that no flower, animal, food or object comes within 0.1 of it; 0.7 in "
                            "video; 0.5 for sfd); lower it to find faint faces, raise it to drop doubtful ones")


PRECISION_HELP = ("the arithmetic, whatever --engine says (default: auto, the engine's own: fp16 on a GPU, fp32 "
                  "on a CPU). fp32: true fp32, TF32 off: the released model's numbers, slowest on a GPU (about "
                  "a third of fp16's speed). tf32: fp32 with TF32 convolutions, the released demo's own "
                  "arithmetic on a GPU. fp16: GPUs only. bf16: 8 bits of mantissa, fast on CPUs with bf16 in "
                  "hardware, but it moves valence and arousal by up to about 0.1: only when asked for")

# What bf16 does to the numbers, measured on a well-conditioned checkpoint over real face crops
# (docs/PERFORMANCE.md): said whenever it is asked for.
BF16_NOTE = ("bf16 keeps 8 bits of mantissa: on a well-conditioned checkpoint it moved valence by up to 0.03 and "
             "arousal by up to 0.12 from fp32, and changed 7 % of expressions (docs/PERFORMANCE.md); "
             "--precision fp32 gives the released model's numbers")

# Crops below which a job does not repay capturing CUDA graphs and warming up every batch size (about
# 1 s per batch size at start, against a few ms saved per call): such a job runs the same fast network
# eagerly, and cuDNN tunes only the shapes it meets.
GRAPHS_PAY_FROM = 500


def build_engine(args: argparse.Namespace, batch_sizes: Sequence[int] = (1, 4, 16),
                 job: Optional[int] = None) -> Engine:
    """Configure the runtime, load the weights and build the engine the arguments ask for; ``job``, where
    known, is how many images or frames the run will read, so that ``auto`` prepares only what pays."""
    # A small job under auto: cuDNN's autotuning (seconds for the first image's ~40 convolution shapes)
    # would not repay itself either; its heuristics pick the kernels.
    small = args.engine == "auto" and job is not None and job < GRAPHS_PAY_FROM
    precision = getattr(args, "precision", "auto")
    if args.deterministic and precision not in ("auto", "fp32"):
        raise DeviceError(f"--deterministic computes in fp32: drop --precision {precision}")
    runtime = RuntimeConfig(device=args.device, cudnn_benchmark=not args.no_cudnn_benchmark and not small,
                            deterministic=args.deterministic, precision=precision if precision != "auto" else "fp32")
    device = configure(runtime)
    if precision == "fp16" and device.type != "cuda":
        raise DeviceError("--precision fp16 needs a GPU; on a CPU use fp32 (exact) or bf16")
    model = load_model(args.weights, n_expression=args.nclasses, device="cpu")
    config = engine_config(args.engine, device, deterministic=args.deterministic, precision=precision)
    note = ""
    if small and config.cuda_graphs:
        config = replace(config, cuda_graphs=False, warmup=False)
        note = (f" (no CUDA graphs, warm-up or cuDNN autotuning for a job of {job}: they would cost more than "
                f"they save)")
    engine = Engine(model, device, replace(config, batch_sizes=tuple(batch_sizes)))
    print(f"EmoNet ({model.n_expression} classes, {args.weights}) on {describe(runtime, device)}; "
          f"engine {engine.config.name}{note}", file=sys.stderr)
    if engine.config.precision == "bf16":
        print(f"note: {BF16_NOTE}", file=sys.stderr)
    if engine.untrained:
        print(f"warning: {UNTRAINED_LABEL}", file=sys.stderr)
    return engine


CPU_FP32 = EngineConfig(channels_last=True, fold_bn=True, warmup=False)
CPU_BF16 = EngineConfig(precision="bf16", channels_last=True, fold_bn=True, warmup=False)


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


def build_detector(args: argparse.Namespace, engine: Engine, video: bool = False):
    """The detector the arguments ask for, on the engine's device. For photos, BlazeFace also searches
    overlapping tiles of a large image (small faces) and looks at each candidate again close up (no
    face-like thing passes); the video tool leaves both off for speed (docs/PERFORMANCE.md)."""
    min_score = getattr(args, "min_score", None)
    kwargs = {"min_score": min_score} if min_score is not None and args.detector != "none" else {}
    if args.detector == "blazeface":
        kwargs["cuda_graphs"] = engine.config.cuda_graphs  # a small job runs both networks eagerly
        kwargs["tiles"] = kwargs["verify"] = not video
    return create_detector(args.detector, engine.device, **kwargs)


def run_tool(main: Callable[[], int]) -> int:
    """Run a tool's main: known failures become one 'error: ...' line and exit code 2, never a traceback."""
    try:
        return main()
    except (CheckpointError, DetectorError, DeviceError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
