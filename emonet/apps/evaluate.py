"""The evaluation tool (``emonet-eval``, ``test.py``): arguments around :func:`emonet.evaluation.loop.run`."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from ..cli import ToolParser
from .common import add_model_arguments, model_options, run_tool

EXAMPLES = """examples:
  %(prog)s --dataset affectnet --root /data/AffectNet --subset test --nclasses 8 --report report.json
  %(prog)s --dataset csv --csv labels.csv --predictions predictions.csv
  torchrun --nproc-per-node 4 %(prog)s --dataset affectnet --root /data/AffectNet   # several GPUs
"""


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The evaluation tool's command line."""
    workers = min(4, os.cpu_count() or 1)
    parser = ToolParser(
        prog=prog, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Evaluate EmoNet: ACC, macro-F1, per-class accuracy and confusion matrix for expression; "
                    "RMSE, SAGR, PCC and CCC for valence and arousal. Runs under torchrun to use several GPUs.")
    parser.add_argument("--dataset", required=True, choices=["affectnet", "csv"],
                        help="affectnet: the authors' protocol on <root>/<subset>_fullpath.pkl; csv: any "
                             "labelled images")
    parser.add_argument("--root", help="AffectNet: the folder with <subset>_fullpath.pkl and <subset>/; "
                                       "CSV: the folder image paths are relative to (default: the CSV's)")
    parser.add_argument("--subset", default="test", choices=["test", "val"], help="AffectNet subset (default: test)")
    parser.add_argument("--csv", help="CSV with an image path column and any of expression (name or index), "
                                      "valence, arousal; optional x1,y1,x2,y2 box or landmarks columns")
    parser.add_argument("--no-flip", action="store_true", help="skip horizontal-flip test-time augmentation")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="crops per engine call (default: 64; the flipped crops are a second call)")
    parser.add_argument("--workers", type=int, default=workers,
                        help=f"DataLoader processes that decode and warp (default: {workers}, the cores up to 4)")
    parser.add_argument("--skip-missing", action="store_true",
                        help="evaluate without missing or unreadable images (or, for CSV, images with no face found)")
    parser.add_argument("--face", choices=("score", "largest", "central"), default="score",
                        help="where the detector finds several faces in an image (CSV rows without a box): "
                             "evaluate the one it scores highest (default), the largest, or the one nearest "
                             "the centre; the console says how many images had several")
    parser.add_argument("--report", metavar="FILE", help="all metrics and counts as JSON")
    parser.add_argument("--predictions", metavar="FILE", help="one CSV row per sample (a CSV without labels: "
                                                              "predictions only)")
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.workers < 0:
        parser.error(f"--workers must be 0 or more, not {args.workers}")
    return args


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """``emonet-eval`` / ``test.py``."""
    args = parse_args(argv, prog)

    def evaluate() -> int:
        from ..evaluation.loop import run  # (torch is imported here, not for --help)

        return run(args, model_options(args))

    return run_tool(evaluate)


if __name__ == "__main__":
    sys.exit(main())
