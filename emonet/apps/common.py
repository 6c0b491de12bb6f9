"""What the command-line tools share: the model options on the command line, turned into
:class:`emonet.build.ModelOptions`, and clean failures."""
from __future__ import annotations

import argparse
import atexit
import os
import sys
from typing import TYPE_CHECKING, Callable, NoReturn, Optional


# Only light modules here: a tool's --help is printed before torch is imported (the model's modules are
# imported where a tool runs).
from ..choices import DEFAULT_DETECTOR, DETECTORS, ENGINES, PRECISIONS
from ..errors import ToolError

if TYPE_CHECKING:
    from ..build import ModelOptions

ENGINE_HELP = ("how the network runs (default: auto: on a GPU fp16 with the same numbers for a crop in any "
               "batch or job, on a CPU exact fp32); the others trade that for speed: docs/PERFORMANCE.md")
PRECISION_HELP = ("the arithmetic whatever --engine says (default: auto, the engine's own); fp32: the released "
                  "model's numbers; bf16 moves valence and arousal by up to about 0.13: docs/PERFORMANCE.md")


def _score(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser, detector: bool = True,
                        compile_help: Optional[str] = None, video: bool = False) -> None:
    """--weights, --nclasses, --device, --engine, cuDNN and determinism switches (and --detector); with
    ``compile_help``, ``--compile/--no-compile`` (on by default) for a long-lived process; ``video``: the
    detector's help speaks of frames and of faces followed between them, as a video tool's should."""
    g = parser.add_argument_group("model")
    g.add_argument("--weights", default="pretrained",
                   help="'pretrained' (the authors' weights; default), a checkpoint path, or 'random' (untrained: "
                        "its readings are noise, for trying the tools)")
    g.add_argument("--nclasses", type=int, choices=[8, 5], default=None,
                   help="expression classes (default: the checkpoint's)")
    g.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda:0 if there is one)")
    g.add_argument("--engine", default="auto", choices=["auto", *ENGINES], help=ENGINE_HELP)
    g.add_argument("--precision", default="auto", choices=["auto", *PRECISIONS], help=PRECISION_HELP)
    g.add_argument("--no-cudnn-benchmark", action="store_true",
                   help="no cuDNN autotuning in the explicit --engine modes (the default never autotunes)")
    g.add_argument("--deterministic", action="store_true",
                   help="bit-reproducible results: deterministic algorithms, fp32, seeded")
    if compile_help is not None:
        g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help=compile_help)
    if detector:
        frame = "frame" if video else "image"
        g.add_argument("--detector", default=DEFAULT_DETECTOR, choices=DETECTORS,
                       help=f"yunet (default, offline; one pass: small faces and faces the {frame}'s edge cuts), "
                            "blazeface (offline; its fine view finds faces down to ~30 px of 1080p), sfd (the "
                            "released demo's; downloads its weights) or none (each "
                            f"{frame} is already a face crop)")
        g.add_argument("--min-score", type=_score, default=None, metavar="S",
                       help="the detector's threshold, 0 to 1 (default: 0.8 for yunet, 0.83 for blazeface, 0.5 "
                            "for sfd)" + ("; a face already followed from frame to frame is kept down to 0.1 under "
                                          "it" if video else ""))


def model_options(args: argparse.Namespace) -> "ModelOptions":
    """The model options the command line gave (:func:`add_model_arguments`)."""
    from ..build import ModelOptions

    return ModelOptions(weights=args.weights, nclasses=args.nclasses, device=args.device, engine=args.engine,
                        precision=args.precision, cudnn_benchmark=not args.no_cudnn_benchmark,
                        deterministic=args.deterministic, detector=getattr(args, "detector", DEFAULT_DETECTOR),
                        min_score=getattr(args, "min_score", None), compile=getattr(args, "compile", False))


def run_tool(main: Callable[[], int]) -> int:
    """Run a tool's main: known failures become one 'error: ...' line and their exit code (bad input and
    options 2, an output that could not be written 3, a helper process that died 4), never a traceback."""
    from ..detection import DetectorError
    from ..log import install
    from ..models.weights import CheckpointError
    from ..runtime import DeviceError

    install()  # the library's messages: one line each on standard error
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


def exit_tool(code: int) -> NoReturn:
    """End a one-shot tool's process once its main has returned ``code``: the exit handlers run and standard output
    and error are flushed, then the process ends without the interpreter's teardown.

    Its outputs are whole by then (each written to a temporary name and renamed, helper processes ended); what is
    left is tearing down the interpreter's modules and the CUDA context, which on a GPU costs about half a second of a
    photo's few, after its last line. A thread still capturing CUDA graphs in the background ends with the process.
    For the console commands and scripts only: a caller of ``main`` (a test, a notebook) keeps its process.
    """
    atexit._run_exitfuncs()  # multiprocessing's, logging's, whatever a library registered
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started without it
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (a closed pipe) or a stream closed: nothing more to say
            if code == 0:
                code = 120  # as Python's own exit says an unflushed standard output
    os._exit(code)
