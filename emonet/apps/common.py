"""What the command-line tools share: the model options on the command line, turned into
:class:`emonet.build.ModelOptions`, and clean failures."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from ..build import ModelOptions
from ..detection import DETECTORS, DetectorError
from ..engine import PRESETS
from ..errors import ToolError
from ..models.weights import CheckpointError
from ..runtime import PRECISIONS, DeviceError


ENGINE_HELP = ("how the network runs (default: auto). auto: on a GPU, 'fast' with every crop in a batch of one "
               "size and cuDNN's heuristic kernels, so a face crop gets the same numbers in any job, batch or "
               "process (without CUDA graphs for a job of a few images, which would not repay them; the same numbers); "
               "on a CPU, the exact fp32 network, whatever the CPU; fp32 with --deterministic. eager: the "
               "released model as it is, fp32, one call per batch. fast: fp16 on a GPU (bf16 on a CPU), "
               "channels_last, exact folding of BatchNorm and the 1x1 convolutions, CUDA graphs per batch size "
               "(a crop's numbers then move with its batch by up to about 0.01). compiled: fast + torch.compile "
               "and side CUDA streams up to batch 8 (minutes to compile once per machine, fastest after). tuned: "
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
                   help="turn cuDNN autotuning off for the explicit --engine modes (faster start, slower steady "
                        "state); the GPU default never autotunes (its kernels are chosen the same way in every "
                        "process)")
    g.add_argument("--deterministic", action="store_true",
                   help="bit-reproducible results: deterministic algorithms, fp32, seeded")
    if detector:
        g.add_argument("--detector", default="blazeface", choices=DETECTORS,
                       help="blazeface (default; ships with the package, works offline; an image or frame over "
                            "768 px is also seen at 0.6 of its size, so faces from about 40 px wide in 1080p are "
                            "found), sfd (S3FD, the "
                            "released demo's; downloads its weights on first use) or none (each image is "
                            "already a tight face crop)")
        g.add_argument("--min-score", type=_score, default=None, metavar="S",
                       help="report faces the detector scores at least S, between 0 and 1 (default for "
                            "blazeface: 0.83, where each candidate is looked at again close up, chosen on real "
                            "photos so that flowers, animals, food and objects stay 0.1 or more under it; 0.5 for "
                            "sfd); in video and in a stream a face already followed is kept down to 0.1 under it; lower it to find "
                            "faint faces, raise it to drop doubtful ones")


PRECISION_HELP = ("the arithmetic, whatever --engine says (default: auto, the engine's own: fp16 on a GPU, fp32 "
                  "on a CPU). fp16 on a GPU: within the released demo's own TF32 arithmetic's difference from fp32 "
                  "on real faces (docs/PERFORMANCE.md). fp32: true fp32, TF32 off: the released model's numbers, "
                  "slowest on a GPU (about a fifth of fp16's speed). tf32: fp32 with TF32 convolutions, the "
                  "released demo's own arithmetic on a GPU (about 0.6 of fp16's speed). bf16: 8 bits of mantissa, "
                  "fast on CPUs with bf16 in hardware, but it moves valence and arousal by up to about 0.1: only "
                  "when asked for")


def model_options(args: argparse.Namespace) -> ModelOptions:
    """The model options the command line gave (:func:`add_model_arguments`)."""
    return ModelOptions(weights=args.weights, nclasses=args.nclasses, device=args.device, engine=args.engine,
                        precision=args.precision, cudnn_benchmark=not args.no_cudnn_benchmark,
                        deterministic=args.deterministic, detector=getattr(args, "detector", "blazeface"),
                        min_score=getattr(args, "min_score", None))


def run_tool(main: Callable[[], int]) -> int:
    """Run a tool's main: known failures become one 'error: ...' line and their exit code (bad input and
    options 2, an output that could not be written 3, a helper process that died 4), never a traceback."""
    try:
        return main()
    except (CheckpointError, DetectorError, DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
