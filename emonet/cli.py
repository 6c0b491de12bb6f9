"""What the command-line tools share: model options, building the engine, and clean failures."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Callable, Sequence

from .checkpoints import UNTRAINED_LABEL, CheckpointError, load_model
from .detection import DETECTORS, DetectorError, create_detector
from .engine import PRESETS, Engine, EngineConfig
from .images import InputError
from .runtime import DeviceError, RuntimeConfig, configure, describe


def add_model_arguments(parser: argparse.ArgumentParser, detector: bool = True) -> None:
    """--weights, --nclasses, --device, --engine, cuDNN and determinism switches (and --detector)."""
    g = parser.add_argument_group("model")
    g.add_argument("--weights", default="pretrained",
                   help="checkpoint path, 'pretrained' (pretrained/emonet_N.pth, else downloaded; "
                        "CC BY-NC-ND 4.0) or 'random' (untrained: for timing only). Default: pretrained")
    g.add_argument("--nclasses", type=int, choices=[8, 5], default=None,
                   help="expression classes; read from the checkpoint when omitted (8 for pretrained)")
    g.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda:0 if present, else cpu)")
    g.add_argument("--engine", default="auto", choices=["auto", *PRESETS],
                   help="auto: fp16 + CUDA graphs on a GPU, fp32 on the CPU and in --deterministic mode; "
                        "compiled: torch.compile, and side CUDA streams up to batch 8 (slow first start, "
                        "fastest after); tuned: compiled, with kernels tuned on the GPU (long runs at "
                        "large batch; about 15 s more at every start); max: compiled with max-autotune "
                        "(very slow first start)")
    g.add_argument("--no-cudnn-benchmark", action="store_true",
                   help="turn cuDNN autotuning off (faster start, slower steady state)")
    g.add_argument("--deterministic", action="store_true",
                   help="bit-reproducible results: deterministic algorithms, fp32, seeded")
    if detector:
        g.add_argument("--detector", default="blazeface", choices=DETECTORS,
                       help="blazeface (default, offline), sfd (S3FD, downloads its weights on first use) "
                            "or none (each image is already a tight face crop)")


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
    return create_detector(args.detector, engine.device)


def run(main: Callable[[], int]) -> int:
    """Run a tool's main: known failures become one 'error: ...' line and exit code 2, never a traceback."""
    try:
        return main()
    except (CheckpointError, DetectorError, DeviceError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
