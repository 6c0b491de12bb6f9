#!/usr/bin/env python
"""Evaluate EmoNet on AffectNet by the authors' protocol, or on any labelled face dataset (CSV).

    python test.py --dataset affectnet --root /data/AffectNet --subset test --nclasses 8
    python test.py --dataset csv --csv labels.csv --report report.json --predictions preds.csv
    torchrun --nproc-per-node 4 test.py --dataset affectnet --root /data/AffectNet
"""
import argparse
import sys

from emonet import cli, evaluation


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Evaluate EmoNet: ACC, macro-F1, per-class accuracy and confusion matrix for expression; "
                    "RMSE, SAGR, PCC and CCC for valence and arousal. Runs under torchrun to use several GPUs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=["affectnet", "csv"])
    parser.add_argument("--root", help="AffectNet: the folder with <subset>_fullpath.pkl and <subset>/; "
                                       "CSV: the folder image paths are relative to (default: the CSV's)")
    parser.add_argument("--subset", default="test", choices=["test", "val"], help="AffectNet subset")
    parser.add_argument("--csv", help="CSV with an image path column and any of expression (name or index), "
                                      "valence, arousal; optional x1,y1,x2,y2 box or landmarks columns")
    parser.add_argument("--no-flip", action="store_true", help="skip horizontal-flip test-time augmentation")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4, help="DataLoader processes that decode and warp")
    parser.add_argument("--skip-missing", action="store_true",
                        help="evaluate without missing images (or, for CSV, images with no face found)")
    parser.add_argument("--report", metavar="FILE", help="all metrics and counts as JSON")
    parser.add_argument("--predictions", metavar="FILE", help="one CSV row per sample")
    cli.add_model_arguments(parser)
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.workers < 0:
        parser.error("--batch-size must be at least 1 and --workers at least 0")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(cli.run(lambda: evaluation.run(arguments)))
