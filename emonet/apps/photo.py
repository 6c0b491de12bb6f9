"""The photo tool (``emonet-photo``, ``demo.py``): images in; faces, readings, JSON and annotated images out."""
from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np
from tqdm import tqdm

from ..drawing import annotate
from ..io.atomic import write_text
from ..log import progress_bar
from ..errors import InputError
from ..io.images import (IMAGE_EXTENSIONS, STDOUT, check_distinct_outputs, check_output_file, check_writable_dir,
                         collect_images, read_image, read_images, write_image)
from ..results import FaceResult, face_record, photo_fields, photo_row
from ..cli import ToolParser, plural
# (the model's modules, which import torch, are imported where the tool runs: --help is quick)
from .common import add_model_arguments, exit_tool, model_options, run_tool


def _output_plan(output: Optional[str], inputs: list[Path]) -> tuple[Optional[Path], Optional[Path]]:
    """(single output file, output folder): a file only for one input image and an image extension (never one
    of the ``inputs``)."""
    n_images = len(inputs)
    if not output:
        return None, None
    if output == STDOUT:
        raise InputError("--output -: annotated images cannot go to standard output; give an image file or a folder "
                         "(--json - and --csv - write the results there)")
    out = Path(output)
    if out.suffix and not out.is_dir():
        if out.suffix.lower() not in IMAGE_EXTENSIONS:
            raise InputError(f"{output}: not an image name ({', '.join(sorted(IMAGE_EXTENSIONS)[:6])}, ...); "
                             f"--output takes an image file for one image, or a folder")
        if n_images > 1:
            raise InputError(f"{output}: {n_images} images need a folder for --output, not one image file")
        return check_output_file(out, inputs), None
    return None, check_writable_dir(out)


def _annotated_name(path: Path, folder: Path, used: set, inputs: frozenset) -> Path:
    """``path``'s annotated image in ``folder``: a name not in ``used`` (the names given so far) nor one of the
    ``inputs`` (resolved: an input already named ``x_emonet.jpg`` is never replaced)."""
    suffix = ".jpg" if path.suffix.lower() in (".jpg", ".jpeg") else ".png"
    name, k = f"{path.stem}_emonet{suffix}", 1
    while name in used or (folder / name).resolve() in inputs:
        name, k = f"{path.stem}_emonet_{k}{suffix}", k + 1
    used.add(name)
    return folder / name


def run(args: argparse.Namespace) -> int:
    """Process every image; return the exit code (1 when some image could not be read)."""
    from ..engine.check import SAMPLE_PHOTO
    from ..timing import StartupClock

    startup = StartupClock()
    # Before anything is read or made: outputs that would overwrite each other are refused.
    check_distinct_outputs([("--output", args.output), ("--json", args.json), ("--csv", args.csv)])
    # "sample": the photo that ships with the package (scikit-image's astronaut), from any folder.
    paths = collect_images([str(SAMPLE_PHOTO) if p == "sample" else p for p in args.image])
    out_file, out_dir = _output_plan(args.output, paths)
    for path in (args.json, args.csv):
        if path and path != STDOUT:
            check_output_file(path, paths)

    # A lone image that cannot be read is bad input: say so before paying the engine's load and warm-up
    # (a compiled engine's first start takes minutes). Among several, it is one warning and exit code 1.
    if len(paths) == 1:
        return _analyse(args, [(paths[0], read_image(paths[0]))], paths, startup, out_file, out_dir)
    images = read_images(paths)  # decoded from now on, while the model loads
    try:
        return _analyse(args, images, paths, startup, out_file, out_dir)
    finally:
        images.close()


def _analyse(args: argparse.Namespace, images: Iterable[tuple[Path, Union[np.ndarray, InputError]]],
             paths: list[Path], startup: "StartupClock", out_file: Optional[Path], out_dir: Optional[Path]) -> int:
    from ..build import build_pipeline_beside
    from ..detection import FaceDetector
    from ..models.weights import UNTRAINED_LABEL
    from ..provenance import provenance
    from ..timing import LatencyTimer

    images = iter(images)
    first: list[tuple[Path, Union[np.ndarray, InputError]]] = []  # the first image, where detect_first took it

    def detect_first(detector: "FaceDetector") -> Optional[tuple[list[np.ndarray], float]]:
        # The first image's faces, found while the weights load (its detection's first calls take about as long),
        # and the seconds it took: the first image's latency counts them. Taken here, so that a folder's first
        # image is decoded while the model loads too.
        item = next(images, None)
        if item is None:
            return None
        first.append(item)
        if isinstance(item[1], InputError):
            return None
        t0 = time.perf_counter()
        found = detector.detect([item[1]])  # (boxes on the host: the device's work is done)
        return found, time.perf_counter() - t0

    pipeline, detected = build_pipeline_beside(model_options(args), detect_first, refine=args.refine)
    engine, detector = pipeline.engine, pipeline.detector
    startup.mark("model, engine, detector and the first detection" if detected else "model, engine and detector")
    if engine.config.warmup and not engine.config.background:
        # The explicit modes warm up before the first image; the default prepares in the background, and a
        # blank image's pass would only delay the first real one, which pays its own first kernels.
        pipeline.warmup()
        startup.mark("warm-up")
    names = engine.class_names
    banner = f"EmoNet: {UNTRAINED_LABEL}" if engine.untrained else None

    image_timer, face_timer = LatencyTimer(engine.device), LatencyTimer(engine.device)
    records, rows, failures, used = [], [], 0, set()
    count, inputs = len(paths), frozenset(p.resolve() for p in paths)
    bar = progress_bar(itertools.chain(first, images), total=count, unit="image", disable=count < 4, file=sys.stderr)

    def _finish(path: Path, image: np.ndarray, faces: list[FaceResult]) -> None:
        startup.mark("first image")
        records.append({"image": str(path), "width": image.shape[1], "height": image.shape[0],
                        "error": None, "faces": [face_record(f, names) for f in faces]})
        rows.extend([photo_row(str(path), f, names) for f in faces] or [photo_row(str(path), None, names)])
        _report(path, faces, names, engine.untrained)
        if out_file or out_dir:
            target = out_file or _annotated_name(path, out_dir, used, inputs)
            write_image(target, annotate(image, faces, names, banner))

    for path, image in bar:
        if detected is not None:  # the first image, its faces found while the model loaded
            (detections, seconds), detected = detected, None
            t0 = time.perf_counter()
            with face_timer.measure(max(len(detections[0]), 1)):
                faces = pipeline([image], boxes=detections)[0]  # (results on the host: the device's work is done)
            image_timer.record((seconds + time.perf_counter() - t0) * 1e3)
            _finish(path, image, faces)
            continue
        if isinstance(image, InputError):
            exc = image
            failures += 1
            tqdm.write(f"warning: {exc}", file=sys.stderr)
            records.append({"image": str(path), "error": str(exc), "faces": []})
            rows.append(photo_row(str(path), None, names, error=str(exc)))
            continue
        with image_timer.measure(1):
            detections = detector.detect([image])
            n = len(detections[0])
            with face_timer.measure(max(n, 1)):
                faces = pipeline([image], boxes=detections)[0]
        _finish(path, image, faces)

    latency = {"per_image": image_timer.summary().as_dict(), "emonet_per_image": face_timer.summary().as_dict(),
               "engine_warmup_ms": engine.warmup_ms, "startup": startup.as_dict()}
    if args.json:
        doc = {**provenance(engine), "untrained": engine.untrained, "detector": detector.name,
               "refine": args.refine, "images": records, "latency": latency}
        _write(args.json, json.dumps(doc, indent=2) + "\n")
    if args.csv:
        fields = photo_fields(names) + (["untrained"] if engine.untrained else [])
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, **({"untrained": 1} if engine.untrained else {})})
        _write(args.csv, buffer.getvalue())
    n_faces = sum(len(r["faces"]) for r in records)
    print(f"\n{plural(count, 'image')}, {plural(n_faces, 'face')}, {failures} unreadable", file=sys.stderr)
    print(image_timer.summary().format("whole pipeline (detect + crop + EmoNet) per image", "image"),
          file=sys.stderr)
    print(face_timer.summary().format("crop + EmoNet per image", "face"), file=sys.stderr)
    print(startup.format(), file=sys.stderr)
    if engine.background_note:
        print(f"engine: {engine.background_note}", file=sys.stderr)
    return 1 if failures else 0


def _write(path: str, text: str) -> None:
    """A whole output: to standard output for ``-``, else to the file, whole or not at all."""
    if path == STDOUT:
        sys.stdout.write(text)
    else:
        write_text(path, text)


def _report(path: Path, faces: list[FaceResult], names, untrained: bool) -> None:
    from ..models.weights import UNTRAINED_LABEL

    out = sys.stderr
    if not faces:
        tqdm.write(f"{path}: no face found", file=out)
        return
    note = f"  [{UNTRAINED_LABEL}]" if untrained else ""
    for i, f in enumerate(faces):
        x1, y1, x2, y2 = (int(round(v)) for v in f.box)
        top = ", ".join(f"{n} {p:.2f}" for n, p in f.top(names, 3))
        tqdm.write(f"{path} face {i}: box ({x1},{y1})-({x2},{y2}) score {f.score:.2f} | "
                   f"{names[f.expression]} {f.probabilities[f.expression]:.2f} (top 3: {top}) | "
                   f"valence {f.valence:+.3f} arousal {f.arousal:+.3f}{note}", file=out)


# Not the shared text of emonet.errors: that one speaks of video frames and helper processes.
EXIT_CODES = """exit codes: 0 done; 1 done, but some image could not be read (said on the way, and in the JSON and CSV);
  2 bad input or options; 3 an output could not be written; 130 interrupted (Ctrl-C: the annotated images
  made so far are kept, no JSON or CSV is written)
"""

EXAMPLES = """examples:
  %(prog)s --image sample --weights random             # the photo that ships with the package, untrained weights
  %(prog)s --image photo.jpg --weights random          # try it without the released weights
  %(prog)s --image photo.jpg --output annotated.jpg --json faces.json
  %(prog)s --image photos/ "more/*.png" --output annotated/ --json -
"""


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The photo tool's command line."""
    parser = ToolParser(
        prog=prog, epilog=EXAMPLES + "\n" + EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Find every face in photos and report its expression, valence, arousal and 68 landmarks "
                    "(EmoNet). Text goes to stderr; --json - or --csv - (one of them) writes that output to "
                    "stdout.")
    parser.add_argument("--image", nargs="+", action="extend", required=True, metavar="PATH",
                        help="image files, folders (searched recursively) or glob patterns, one or more (--image "
                             "may be repeated); 'sample' is the photo that ships with the package")
    parser.add_argument("--json", metavar="FILE", help="write results as JSON to FILE ('-' for stdout)")
    parser.add_argument("--csv", metavar="FILE",
                        help="write one row per face per image to FILE ('-' for stdout; an image with no face: a "
                             "row of empty values; an unreadable one: its error)")
    parser.add_argument("--output", metavar="FILE|DIR",
                        help="annotated images: an image file for one input image, else a folder")
    parser.add_argument("--refine", action="store_true",
                        help="second pass: re-crop each face from EmoNet's own landmarks, as in training")
    add_model_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """``emonet-photo`` / ``demo.py``."""
    args = parse_args(argv, prog)
    return run_tool(lambda: run(args))


def cli() -> None:
    """``emonet-photo``: :func:`main`, then the process ends at once (:func:`~emonet.apps.common.exit_tool`)."""
    exit_tool(main())


if __name__ == "__main__":
    cli()
