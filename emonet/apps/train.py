"""``emonet-train``: fine-tune EmoNet on your own labelled faces; the best checkpoint loads in every tool."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from ..cli import ToolParser
from ..errors import EXIT_CODES
from .common import run_tool

EXAMPLES = """examples:
  %(prog)s --csv labels.csv --out runs/mine                      # image, expression, valence, arousal
  %(prog)s --csv train.csv --val val.csv --train all --epochs 20 --out runs/all
  %(prog)s --affectnet /data/AffectNet --out runs/affectnet        # <root>/train_fullpath.pkl and val_...
  %(prog)s --csv labels.csv --out runs/mine --resume               # after Ctrl-C, SIGTERM or a crash
  emonet-photo --image face.jpg --weights runs/mine/best.pth       # the result, in any tool
  torchrun --nproc-per-node 2 -m emonet.apps.train --csv labels.csv --out runs/ddp

the CSV: a header with an image column (image, path or file) and any of expression (a class name or index),
valence and arousal (in [-1, 1]); optional x1, y1, x2, y2 (a face box) or landmarks (136 numbers) say which face;
otherwise the tools' detector finds it. Faces are cropped once and cached in OUT/cache.
written in OUT: best.pth (the released format) with best.meta.json (base weights' SHA-256, data, seed, version,
metrics) and best.predictions.csv (the validation faces); log.csv and curves.png, every epoch; last.state
(to --resume).
"""


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The trainer's command line."""
    parser = ToolParser(prog=prog, epilog=EXAMPLES + "\n" + EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Fine-tune EmoNet on labelled faces: cross-entropy for the expression, RMSE, "
                                    "PCC and CCC terms for valence and arousal (the paper's objective), AdamW with "
                                    "a cosine schedule; the evaluation's metrics on a validation set each epoch.")
    data = parser.add_argument_group("data")
    data.add_argument("--csv", metavar="FILE", help="the training set as a CSV (see below)")
    data.add_argument("--affectnet", metavar="ROOT", help="or AffectNet by the authors' protocol (train subset)")
    data.add_argument("--root", metavar="DIR", help="the CSV's images' folder (default: the CSV's own)")
    data.add_argument("--val", metavar="FILE", help="a validation CSV (default: AffectNet's val subset, or a split)")
    data.add_argument("--val-fraction", type=float, default=0.1, metavar="F",
                      help="the share held out for validation without --val (default 0.1, seeded)")
    model = parser.add_argument_group("model")
    model.add_argument("--weights", default="pretrained", help="pretrained (default), a checkpoint path, or random")
    model.add_argument("--nclasses", type=int, choices=[8, 5], help="classes, with random weights (default 8)")
    model.add_argument("--train", choices=["head", "emotion", "all"], default="emotion",
                       help="what trains: the last layers, the emotion branch on the frozen landmark network "
                            "(default, the paper's way), or everything")
    run = parser.add_argument_group("training")
    run.add_argument("--out", required=True, metavar="DIR", help="where the checkpoint, log and cache go")
    run.add_argument("--epochs", type=int, default=10)
    run.add_argument("--batch-size", type=int, default=32,
                     help="crops a step at most (default 32): an epoch is cut into as few batches as hold it, "
                          "of near-equal sizes; under torchrun, the whole job's batch")
    run.add_argument("--lr", type=float, help="peak learning rate (default: 1e-3 head, 3e-4 emotion, 1e-4 all)")
    run.add_argument("--weight-decay", type=float, default=0.01)
    run.add_argument("--seed", type=int, default=0, help="the split, the order, the augmentation (default 0)")
    run.add_argument("--no-augment", action="store_true", help="no mirror, shift, scale or colour jitter")
    run.add_argument("--device", help="cuda:N or cpu (default: cuda:0 where there is one)")
    run.add_argument("--precision", choices=["auto", "fp32"], default="auto",
                     help="auto: bf16 (else fp16) autocast on a GPU, fp32 on the CPU; fp32 everywhere")
    run.add_argument("--cache", metavar="DIR", help="where the face crops are cached (default: OUT/cache); runs on "
                                                     "the same data may share one")
    run.add_argument("--resume", action="store_true", help="go on from OUT/last.state")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    """Train; a summary of the validation metrics before and after."""
    from ..evaluation.loop import published_table
    from ..train import TrainConfig, train

    config = TrainConfig(out_dir=args.out, csv=args.csv, affectnet=args.affectnet, root=args.root, val=args.val,
                         val_fraction=args.val_fraction, weights=args.weights, nclasses=args.nclasses,
                         train=args.train, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                         weight_decay=args.weight_decay, seed=args.seed, augment=not args.no_augment,
                         device=args.device, precision=args.precision, cache_dir=args.cache, resume=args.resume,
                         progress=not args.quiet)
    result = train(config)
    if not result.before and not result.after:
        return 0  # a worker of a torchrun job: the first process reports
    print(f"\nvalidation before training:\n{published_table(result.before, None)}", file=sys.stderr)
    if result.after:
        print(f"validation at the best epoch ({result.best_epoch}):\n{published_table(result.after, None)}",
              file=sys.stderr)
    # The rate leaves out the first steps and each batch shape's first (kernels chosen, memory allocated).
    rate = f"{result.throughput:.1f} crops/s" if result.throughput else "too few steps to time"
    from ..train.report import score_of
    if result.after and score_of(result.after) <= score_of(result.before):
        print(f"note: no epoch did better on the validation set than the weights it started from (score "
              f"{score_of(result.before):.3f} before, {score_of(result.after):.3f} at the best epoch; the mean of ACC "
              f"and the CCCs): best.pth is the best epoch's, and the starting weights may serve you better",
              file=sys.stderr)
    print(f"training: {rate}; written in {Path(args.out)}: {result.best.name} (loads with --weights), "
          f"best.meta.json, best.predictions.csv, {result.log.name}, {result.files['curves'].name}, "
          f"{result.files['state'].name}", file=sys.stderr)
    if result.interrupted:
        print("stopped: the state is saved; go on with the same command and --resume", file=sys.stderr)
        return 130
    return 0


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """``emonet-train``."""
    args = parse_args(argv, prog)
    return run_tool(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
