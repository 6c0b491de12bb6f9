"""What the command-line tools share: model options, building the engine and detector, and clean failures."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Callable, Sequence

from ..models.weights import UNTRAINED_LABEL, CheckpointError, load_model
from ..detection import DETECTORS, DetectorError, create_detector
from ..engine import PRESETS, Engine, EngineConfig
from ..io.images import InputError
from ..runtime import DeviceError, RuntimeConfig, configure, describe


ENGINE_HELP = ("how the network runs (default: auto). auto: 'fast' on a GPU, the exact fp32 network on the "
               "CPU and with --deterministic. eager: the released model as it is, fp32, one call per batch. "
               "fast: fp16 (bf16 on the CPU), channels_last, exact folding of BatchNorm and the 1x1 "
               "convolutions, CUDA graphs; outputs within 0.01 of fp32. compiled: fast + torch.compile and "
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
    g.add_argument("--no-cudnn-benchmark", action="store_true",
                   help="turn cuDNN autotuning off (faster start, slower steady state)")
    g.add_argument("--deterministic", action="store_true",
                   help="bit-reproducible results: deterministic algorithms, fp32, seeded")
    if detector:
        g.add_argument("--detector", default="blazeface", choices=DETECTORS,
                       help="blazeface (default; ships with the package, works offline), sfd (S3FD, the "
                            "released demo's; downloads its weights on first use) or none (each image is "
                            "already a tight face crop)")
        g.add_argument("--min-score", type=_score, default=None, metavar="S",
                       help="report faces the detector scores at least S, between 0 and 1 (default: 0.7 for "
                            "blazeface, chosen on real photos so that cups and logos are not faces; 0.5 for sfd); "
                            "lower it to find faint faces, raise it to drop doubtful ones")


def build_engine(args: argparse.Namespace, batch_sizes: Sequence[int] = (1, 4, 16)) -> Engine:
    """Configure the runtime, load the weights and build the engine the arguments ask for."""
    runtime = RuntimeConfig(device=args.device, cudnn_benchmark=not args.no_cudnn_benchmark,
                            deterministic=args.deterministic)
    device = configure(runtime)
    model = load_model(args.weights, n_expression=args.nclasses, device="cpu")
    preset = args.engine
    if preset == "auto":
        preset = "fast" if device.type == "cuda" and not args.deterministic else "eager"
    config = PRESETS[preset]
    if preset == "eager" and device.type == "cpu":
        # Exact, and 1.3x faster on the CPU. No warm-up: the CPU has nothing to autotune, and a
        # batch-16 warm-up would cost seconds.
        config = EngineConfig(channels_last=True, fold_bn=True, warmup=False)
    engine = Engine(model, device, replace(config, batch_sizes=tuple(batch_sizes)))
    print(f"EmoNet ({model.n_expression} classes, {args.weights}) on {describe(runtime, device)}; "
          f"engine {engine.config.name}", file=sys.stderr)
    if engine.untrained:
        print(f"warning: {UNTRAINED_LABEL}", file=sys.stderr)
    return engine


def build_detector(args: argparse.Namespace, engine: Engine):
    """The detector the arguments ask for, on the engine's device."""
    min_score = getattr(args, "min_score", None)
    kwargs = {"min_score": min_score} if min_score is not None and args.detector != "none" else {}
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
