"""``emonet-export``: EmoNet as an ONNX model for other runtimes, checked against PyTorch before it is written."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from ..cli import ToolParser
from ..errors import EXIT_CODES, InputError
from ..io.images import check_writable_dir
from .common import run_tool

EXAMPLES = """examples:
  %(prog)s --weights pretrained --output emonet8.onnx            # dynamic batch
  %(prog)s --weights my_finetuned.pth --output emonet.onnx --batch 16
  python -c "import onnxruntime as ort; print([o.name for o in ort.InferenceSession('emonet8.onnx').get_outputs()])"
  trtexec --onnx=emonet8.onnx --fp16 --saveEngine=emonet8.plan  # a TensorRT engine, on the GPU that runs it

the model: input "crops", (N, 3, 256, 256) uint8 RGB face crops cut as the tools cut them (spec section 5);
outputs "expression" (logits), "valence", "arousal" (not clamped), "landmarks" (N, 68, 2 in crop pixels),
"heatmap" (N, 68, 64, 64); fp32. The file's metadata says which weights (SHA-256), version and classes.
"""


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The export tool's command line."""
    parser = ToolParser(prog=prog, epilog=EXAMPLES + "\n" + EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Export EmoNet to ONNX (ONNX Runtime, TensorRT, OpenVINO), checked against "
                                    "PyTorch fp32 on real face crops before it is written. Needs pip install "
                                    "\"emonet[export]\".")
    parser.add_argument("--weights", default="pretrained",
                        help="'pretrained' (the authors' weights; default), a checkpoint path, or 'random'")
    parser.add_argument("--nclasses", type=int, choices=[8, 5], default=None,
                        help="expression classes (default: the checkpoint's)")
    parser.add_argument("--format", choices=["onnx"], default="onnx", help="onnx (default; the only one yet)")
    parser.add_argument("--output", required=True, metavar="FILE", help="the model file to write (.onnx)")
    parser.add_argument("--batch", type=int, default=None, metavar="N",
                        help="a fixed batch size (default: dynamic, 1 to 4096)")
    args = parser.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch must be at least 1, not {args.batch}")
    return args


def run(args: argparse.Namespace) -> int:
    """Load the weights, export, check, write; one line of report."""
    from .. import __version__
    from ..classes import class_names
    from ..export import ExportError, export_onnx
    from ..models.weights import load_model
    from ..provenance import weights_record

    output = Path(args.output)
    if output.suffix.lower() != ".onnx":
        raise InputError(f"{args.output}: name the ONNX file .onnx")
    check_writable_dir(output.parent if str(output.parent) else Path("."))
    model = load_model(args.weights, n_expression=args.nclasses, device="cpu")
    weights = weights_record(model.weights_source)
    names = class_names(model.n_expression)
    metadata = {"emonet_version": __version__, "weights": weights["source"], "weights_sha256": weights["sha256"] or "",
                "untrained": str(weights["untrained"]).lower(), "precision": "fp32", "classes": ",".join(names),
                "input": "crops: (N, 3, 256, 256) uint8 RGB face crops, cut as emonet cuts them (spec section 5)",
                "batch": str(args.batch or "dynamic")}
    try:
        check = export_onnx(model, output, batch=args.batch, metadata=metadata)
    except ExportError as exc:
        raise InputError(str(exc)) from None
    print(check.format(), file=sys.stderr)
    print(f"written: {output} (batch {args.batch or 'dynamic'}, {len(names)} classes, weights "
          f"{weights['sha256'] or weights['source']})", file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """``emonet-export``."""
    args = parse_args(argv, prog)
    return run_tool(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
