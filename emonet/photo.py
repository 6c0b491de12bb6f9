"""The photo tool behind ``demo.py``: images in; faces, readings, JSON and annotated images out."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from . import __version__
from .checkpoints import UNTRAINED_LABEL
from .cli import build_detector, build_engine
from .drawing import annotate
from .images import IMAGE_EXTENSIONS, InputError, check_writable_dir, collect_images, read_image, \
    write_image, write_text
from .pipeline import Face, Pipeline
from .timing import LatencyTimer


def face_record(index: int, face: Face, class_names) -> dict:
    """One face as JSON: index, box, score, expression, probabilities by class name, valence, arousal, landmarks."""
    return {
        "face_index": index,
        "box": [round(float(v), 2) for v in face.box],
        "score": round(face.score, 4),
        "expression": class_names[face.expression],
        "expression_index": face.expression,
        "probabilities": {name: round(float(p), 5) for name, p in zip(class_names, face.probabilities)},
        "valence": round(face.valence, 5),
        "arousal": round(face.arousal, 5),
        "landmarks": [[round(float(x), 2), round(float(y), 2)] for x, y in face.landmarks],
    }


def _output_plan(output: Optional[str], n_images: int) -> tuple[Optional[Path], Optional[Path]]:
    """(single output file, output folder): a file only for one input image and an image extension."""
    if not output:
        return None, None
    out = Path(output)
    if n_images == 1 and out.suffix.lower() in IMAGE_EXTENSIONS and not out.is_dir():
        check_writable_dir(out.parent if str(out.parent) else Path("."))
        return out, None
    return None, check_writable_dir(out)


def _annotated_name(path: Path, folder: Path, used: set) -> Path:
    suffix = ".jpg" if path.suffix.lower() in (".jpg", ".jpeg") else ".png"
    name, k = f"{path.stem}_emonet{suffix}", 1
    while name in used:
        name, k = f"{path.stem}_emonet_{k}{suffix}", k + 1
    used.add(name)
    return folder / name


def run(args: argparse.Namespace) -> int:
    """Process every image; return the exit code (1 when some image could not be read)."""
    paths = collect_images(args.image)
    out_file, out_dir = _output_plan(args.output, len(paths))
    if args.json and args.json != "-":
        check_writable_dir(Path(args.json).parent if str(Path(args.json).parent) else Path("."))

    # A lone image that cannot be read is bad input: say so before paying the engine's load and warm-up
    # (a compiled engine's first start takes minutes). Among several, it is one warning and exit code 1.
    first = read_image(paths[0]) if len(paths) == 1 else None

    engine = build_engine(args)
    detector = build_detector(args, engine)
    pipeline = Pipeline(engine, detector, refine=args.refine)
    pipeline.warmup()
    names = engine.class_names
    banner = f"EmoNet: {UNTRAINED_LABEL}" if engine.untrained else None

    image_timer, face_timer = LatencyTimer(engine.device), LatencyTimer(engine.device)
    records, failures, used = [], 0, set()
    bar = tqdm(paths, unit="image", disable=len(paths) < 4, file=sys.stderr)
    for path in bar:
        try:
            image = first if first is not None else read_image(path)
        except InputError as exc:
            failures += 1
            tqdm.write(f"warning: {exc}", file=sys.stderr)
            records.append({"image": str(path), "error": str(exc), "faces": []})
            continue
        with image_timer.measure(1):
            detections = detector.detect([image])
            n = len(detections[0])
            with face_timer.measure(max(n, 1)):
                faces = pipeline([image], boxes=detections)[0]
        records.append({"image": str(path), "width": image.shape[1], "height": image.shape[0],
                        "error": None, "faces": [face_record(i, f, names) for i, f in enumerate(faces)]})
        _report(path, faces, names, engine.untrained)
        if out_file or out_dir:
            target = out_file or _annotated_name(path, out_dir, used)
            write_image(target, annotate(image, faces, names, banner))

    latency = {"per_image": image_timer.summary().as_dict(), "emonet_per_image": face_timer.summary().as_dict(),
               "engine_warmup_ms": engine.warmup_ms}
    if args.json:
        doc = {"emonet_version": __version__, "weights": engine.weights_source, "untrained": engine.untrained,
               "classes": list(names), "detector": detector.name, "refine": args.refine,
               "device": str(engine.device), "images": records, "latency": latency}
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            write_text(args.json, text + "\n")
    n_faces = sum(len(r["faces"]) for r in records)
    print(f"\n{len(paths)} image(s), {n_faces} face(s), {failures} unreadable", file=sys.stderr)
    print(image_timer.summary().format("whole pipeline (detect + crop + EmoNet) per image", "image"),
          file=sys.stderr)
    print(face_timer.summary().format("crop + EmoNet per image", "face"), file=sys.stderr)
    return 1 if failures else 0


def _report(path: Path, faces: list[Face], names, untrained: bool) -> None:
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
