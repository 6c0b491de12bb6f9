"""The evaluation tool (``emonet-eval``, ``test.py``): its arguments, and the run around the library's
:mod:`emonet.evaluation` (datasets, prediction, metrics): checks, report lines, the report and predictions
files."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from ..cli import ToolParser
from ..errors import OutputError
from .common import add_model_arguments, exit_tool, model_options, run_tool

EXAMPLES = """examples:
  %(prog)s --dataset affectnet --root /data/AffectNet --subset test --nclasses 8 --report report.json
  %(prog)s --dataset csv --csv labels.csv --predictions predictions.csv
  %(prog)s --dataset csv --csv labels.csv --weights random --skip-missing  # try it without the released weights
  torchrun --nproc-per-node 4 -m emonet.apps.evaluate --dataset affectnet --root /data/AffectNet  # several GPUs
"""

# The other tools' codes speak of frames and of inputs read in part; an evaluation scores the whole dataset or stops.
EXIT_CODES = """exit codes: 0 done (images left out by --skip-missing are counted in the report);
  2 bad input or options (a dataset file, a label, a missing or unreadable image, an image with no face
  found); 3 the report or predictions could not be written; 130 interrupted (Ctrl-C: the report and
  predictions are written only once every image is scored, so none are left)
"""


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The evaluation tool's command line."""
    workers = min(4, os.cpu_count() or 1)
    parser = ToolParser(
        prog=prog, epilog=EXAMPLES + "\n" + EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
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
    parser.add_argument("--predictions", metavar="FILE",
                        help="one CSV row per sample: the image, its labels and the predictions (a CSV without "
                             "labels: predictions only); it reads back as --csv (its image paths are relative "
                             "to its own folder)")
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

    return run_tool(lambda: run(args, model_options(args)))  # (torch is imported in run, not for --help)


def run(args: argparse.Namespace, model) -> int:
    """Build the dataset, check it, predict, score and report; the exit code. ``args``: the evaluation's
    own options (dataset, outputs, ``--face``, ...); ``model``: weights, device, engine and detector."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from ..build import build_detector, build_engine
    from ..classes import class_names
    from ..cli import plural
    from ..evaluation.datasets import DatasetError, affectnet, csv_dataset
    from ..distributed import join
    from ..evaluation.loop import PUBLISHED, locate_faces, predict, predictions_csv, published_table, score
    from ..io.images import check_output_file
    from ..pipeline import Pipeline
    from ..provenance import provenance
    from ..timing import StartupClock

    startup = StartupClock()
    # The arguments are checked before the model loads (or downloads).
    if args.dataset == "affectnet" and not args.root:
        raise DatasetError("--dataset affectnet needs --root DIR (the folder with <subset>_fullpath.pkl)")
    if args.dataset == "csv" and not args.csv:
        raise DatasetError("--dataset csv needs --csv FILE")
    for given in (args.root, args.csv):
        if given and not Path(given).exists():
            raise DatasetError(f"{given}: no such file or folder")
    for out in (args.report, args.predictions):
        if out:
            # An output over the --csv would replace the labels being scored (a predictions file is itself one).
            check_output_file(out, inputs=[args.csv] if args.csv else [])
    ddp = join(model.device)
    try:
        model = replace(model, device=ddp.device(model.device))
        quiet = not ddp.main
        engine = build_engine(model, batch_sizes=(args.batch_size,))
        startup.mark("model and engine")
        n_classes = engine.n_expression  # the checkpoint's; load_model refused a disagreeing --nclasses
        if args.dataset == "affectnet":
            dataset, counts = affectnet(Path(args.root), args.subset, n_classes, class_names(n_classes))
        else:
            dataset, counts = csv_dataset(Path(args.csv), args.root and Path(args.root), class_names(n_classes)), {}
        missing = dataset.missing()
        if missing:
            listing = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            if not args.skip_missing:
                raise DatasetError(f"{len(missing)} of {len(dataset)} images are missing or empty: {listing}; "
                                   f"fix the paths or pass --skip-missing")
            if not quiet:
                print(f"warning: skipping {len(missing)} missing images: {listing}", file=sys.stderr)
            dataset.drop(missing)
        counts["missing"] = len(missing)

        pipeline = Pipeline(engine)
        if any(s.matrix is None for s in dataset.samples):
            pipeline = Pipeline(engine, build_detector(model, engine))
            no_face, unreadable = locate_faces(dataset, pipeline, progress=not quiet, rule=args.face)
            several = sum(1 for s in dataset.samples if (s.faces_found or 0) > 1)
            counts["several_faces"] = several
            if several and not quiet:
                which = {"score": "the one the detector scored highest", "largest": "the largest",
                         "central": "the one nearest the image's centre"}[args.face]
                print(f"note: {plural(several, 'image')} held several faces; {which} was scored in each "
                      f"(--face score|largest|central chooses; a box column names the face; --predictions lists "
                      f"each image's faces_found and box)", file=sys.stderr)
            if unreadable and not args.skip_missing:
                raise DatasetError(f"{len(unreadable)} images could not be read (corrupt or not an image: "
                                   f"{unreadable[0]}, ...); fix them or pass --skip-missing")
            if no_face and not args.skip_missing:
                raise DatasetError(f"no face found in {len(no_face)} images ({no_face[0]}, ...); "
                                   f"add box columns or pass --skip-missing")
            dataset.drop(no_face + unreadable)
            counts["no_face"], counts["unreadable"] = len(no_face), len(unreadable)
            startup.mark("finding the faces")
        if not len(dataset):
            raise DatasetError("no samples left to evaluate")
        if not dataset.labelled and not args.predictions:
            raise DatasetError(f"{dataset.name} has no labels to score against (no expression, valence or arousal "
                               f"values): add them, or give --predictions FILE to write predictions only")

        preds, rate = predict(pipeline, dataset, flip=not args.no_flip, batch_size=args.batch_size,
                              workers=args.workers, ddp=ddp, progress=not quiet)
        if not ddp.main:
            return 0
        startup.mark("reading every face")
        metrics = score(dataset, preds)
        table = published_table(metrics, n_classes if args.dataset == "affectnet" else None)
        if not dataset.labelled:
            table = "no labels: predictions only, nothing scored"
        print(f"\n{dataset.name}: {plural(len(preds.index), 'sample')}, {rate:.1f} images/s on "
              f"{plural(ddp.world, 'process', 'processes')}{' with flip' if not args.no_flip else ''}\n{table}",
              file=sys.stderr)
        if "expression" in metrics:
            print(f"macro-F1 {metrics['expression']['macro_F1']:.3f}", file=sys.stderr)
        dropped = {k: v for k, v in counts.items() if k not in ("in_index", "kept", "several_faces") and v}
        if dropped:  # nothing dropped passes for a whole dataset
            print(f"dropped {sum(dropped.values())} samples: "
                  + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in dropped.items())
                  + f"; scored {plural(len(preds.index), 'sample')}", file=sys.stderr)
        if engine.untrained:
            print("note: untrained weights — these metrics are meaningless", file=sys.stderr)
        print(startup.format("scores"), file=sys.stderr)
        if args.report:
            report = {"dataset": dataset.name, "counts": counts, "n": int(len(preds.index)),
                      "flip": not args.no_flip, **provenance(engine), "untrained": engine.untrained,
                      "processes": ddp.world,
                      "images_per_s": rate, "metrics": metrics,
                      "published": PUBLISHED.get(n_classes) if args.dataset == "affectnet" else None}
            write_output(args.report, json.dumps(report, indent=2) + "\n")
        if args.predictions:
            write_output(args.predictions, predictions_csv(dataset, preds, Path(args.predictions).parent))
        return 0
    finally:
        ddp.close()


def write_output(path: str, text: str) -> None:
    """Write an output file whole or not at all; a failure is an :class:`~emonet.errors.OutputError` (exit 3)."""
    from ..io.atomic import write_text

    try:
        write_text(path, text)
    except OSError as exc:
        raise OutputError(f"{path}: could not be written ({exc.strerror or exc}); the metrics are on the console "
                          f"above: free some space or give another path, and run again") from None


def cli() -> None:
    """``emonet-eval``: :func:`main`, then the process ends at once (:func:`~emonet.apps.common.exit_tool`)."""
    exit_tool(main())


if __name__ == "__main__":
    cli()
