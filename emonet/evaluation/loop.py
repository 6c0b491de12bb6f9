"""Evaluation: run EmoNet over a labelled dataset (one or several processes) and score it by the protocol.

Under ``torchrun`` each process evaluates its shard (PyTorch's DistributedSampler); predictions are
gathered with their sample indices and de-duplicated, so the sampler's padding is never counted twice,
and rank 0 scores and reports. The metrics equal a single-process run's.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from .datasets import DatasetError, FaceDataset, affectnet, csv_dataset
from ..pipeline import Pipeline, PlannedFace
from ..results import FaceResult
from ..build import ModelOptions, build_detector, build_engine
from ..cli import plural
from ..io.atomic import write_text
from ..provenance import provenance
from ..errors import InputError
from ..io.images import check_writable_dir, read_image
from .metrics import evaluate_predictions

PUBLISHED = {  # spec §8, cleaned AffectNet test set
    8: {"ACC": 0.75, "valence": {"CCC": 0.82, "PCC": 0.82, "RMSE": 0.29, "SAGR": 0.84},
        "arousal": {"CCC": 0.75, "PCC": 0.75, "RMSE": 0.27, "SAGR": 0.80}},
    5: {"ACC": 0.82, "valence": {"CCC": 0.90, "PCC": 0.90, "RMSE": 0.24, "SAGR": 0.85},
        "arousal": {"CCC": 0.80, "PCC": 0.80, "RMSE": 0.24, "SAGR": 0.79}},
}


@dataclass
class Distributed:
    """This process's place in a torchrun job (world 1 when run plainly)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """True on the process that reports."""
        return self.rank == 0


def init_distributed(prefer_cuda: bool) -> Distributed:
    """Join the torchrun job if there is one: NCCL on GPUs, gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    backend = "nccl" if prefer_cuda and torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    return Distributed(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


@dataclass
class Predictions:
    """Per-sample outputs, in dataset order."""

    index: np.ndarray
    probabilities: np.ndarray
    valence: np.ndarray   # clamped to [-1, 1] (after the flip's mean)
    arousal: np.ndarray


def sample_face(dataset: FaceDataset, index: int, image: int) -> PlannedFace:
    """A dataset sample as a planned face: its crop matrix, and the detector's box where one placed it."""
    s = dataset.samples[index]
    # The detector's score is not kept with the sample: nan.
    return PlannedFace(image=image, frame=index, face_id=0, box=s.box, score=float("nan"),
                       detected=s.faces_found is not None, matrix=s.matrix)


def predict(pipeline: Pipeline, dataset: FaceDataset, flip: bool = True, batch_size: int = 64, workers: int = 2,
            ddp: Distributed = Distributed(), progress: bool = True) -> tuple[Predictions, float]:
    """Run the pipeline over ``dataset``'s crops (this process's shard); the gathered predictions and images/s.

    The crops are warped in the DataLoader's workers; the pipeline turns the network's outputs into results
    as for photos and video, with the protocol's test-time flip (spec §7) when ``flip``.
    """
    sampler = DistributedSampler(dataset, num_replicas=ddp.world, rank=ddp.rank, shuffle=False) \
        if ddp.world > 1 else None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False, num_workers=workers,
                        pin_memory=pipeline.engine.device.type == "cuda", drop_last=False)
    results: list[FaceResult] = []
    start = time.perf_counter()
    for crops, _, _, _, index in tqdm(loader, desc="evaluating", unit="batch", disable=not progress,
                                      file=sys.stderr):
        faces = [sample_face(dataset, int(i), k) for k, i in enumerate(index)]
        results += pipeline.collect(pipeline.launch([], faces, crops=crops, flip=flip))
    local = {"index": np.array([r.frame for r in results], dtype=np.int64),
             "probabilities": np.array([r.probabilities for r in results]).reshape(len(results), -1),
             "valence": np.array([r.valence for r in results]), "arousal": np.array([r.arousal for r in results])}
    if ddp.world > 1:
        gathered: list = [None] * ddp.world
        dist.all_gather_object(gathered, local)
        local = {k: np.concatenate([g[k] for g in gathered if len(g[k])]) for k in local}
    elapsed = time.perf_counter() - start
    # The sampler pads the last shard by repeating samples: keep each index exactly once.
    _, first = np.unique(local["index"], return_index=True)
    order = first[np.argsort(local["index"][first])]
    preds = Predictions(local["index"][order], local["probabilities"][order], local["valence"][order],
                        local["arousal"][order])
    return preds, len(preds.index) / max(elapsed, 1e-9)


def score(dataset: FaceDataset, preds: Predictions) -> dict:
    """Metrics for the labels the dataset has."""
    samples = [dataset.samples[i] for i in preds.index]
    return evaluate_predictions(
        dataset.class_names,
        labels=[s.label if s.label >= 0 else np.nan for s in samples], predictions=preds.probabilities.argmax(1),
        valence=[s.valence for s in samples], valence_pred=preds.valence,
        arousal=[s.arousal for s in samples], arousal_pred=preds.arousal)


def published_table(metrics: dict, n_classes: Optional[int]) -> str:
    """The published layout: ACC, then valence and arousal CCC, PCC, RMSE, SAGR; published row beside ours."""
    def row(name: str, m: dict) -> str:
        # Every cell 6 wide: a negative CCC or PCC keeps the columns aligned.
        cells = [f"{name:<22}", f"{m['ACC']:6.3f}" if m.get("ACC") is not None else f"{'–':^6}"]
        for dim in ("valence", "arousal"):
            d = m.get(dim) or {}
            cells += [f"{d[k]:6.3f}" if d.get(k) is not None else f"{'–':^6}" for k in ("CCC", "PCC", "RMSE", "SAGR")]
        return " | ".join(cells)
    ours = {"ACC": (metrics.get("expression") or {}).get("ACC"), "valence": metrics.get("valence"),
            "arousal": metrics.get("arousal")}
    head = " | ".join([f"{'':<22}", *(f"{c:<6}" for c in ("ACC", "V CCC", "V PCC", "V RMSE", "V SAGR", "A CCC",
                                                          "A PCC", "A RMSE", "A SAGR"))])
    lines = [head, "-" * len(head)]
    if n_classes in PUBLISHED:
        lines.append(row(f"published ({n_classes} classes)", PUBLISHED[n_classes]))
    lines.append(row("this run", ours))
    return "\n".join(lines)


def predictions_csv(dataset: FaceDataset, preds: Predictions) -> str:
    """One row per sample: path, label, prediction, probabilities by class, valence, arousal."""
    names = dataset.class_names
    probs = preds.probabilities
    buf = io.StringIO()
    writer = csv.writer(buf)
    # Which face was evaluated where the detector placed the crop: its box, and how many it found
    # (the best-scoring one is taken); empty where the dataset gave the box or landmarks.
    writer.writerow(["path", "label", "prediction", *[f"p_{n}" for n in names], "valence", "arousal",
                     "faces_found", "x1", "y1", "x2", "y2"])
    for k, i in enumerate(preds.index):
        s = dataset.samples[i]
        found = [s.faces_found, *np.round(s.box, 2).tolist()] if s.faces_found is not None else [""] * 5
        writer.writerow([str(s.path), names[s.label] if s.label >= 0 else "", names[int(probs[k].argmax())],
                         *[f"{p:.6f}" for p in probs[k]], f"{preds.valence[k]:.6f}",
                         f"{preds.arousal[k]:.6f}", *found])
    return buf.getvalue()


FACE_CHOICES = ("score", "largest", "central")


def choose_face(detections: np.ndarray, shape: tuple, rule: str = "score") -> np.ndarray:
    """The one face of an image to evaluate, as a ``(1, 5)`` detection: the detector's best-scoring
    (``score``), the largest box (``largest``), or the one whose centre is nearest the image's (``central``)."""
    if len(detections) <= 1 or rule == "score":
        return detections[:1]
    boxes = detections[:, :4]
    if rule == "largest":
        key = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        return detections[[int(np.argmax(key))]]
    centre = np.array([shape[1] / 2, shape[0] / 2])
    distance = np.linalg.norm((boxes[:, :2] + boxes[:, 2:]) / 2 - centre, axis=1)
    return detections[[int(np.argmin(distance))]]


def locate_faces(dataset: FaceDataset, pipeline: Pipeline, progress: bool = True,
                 rule: str = "score") -> tuple[list, list]:
    """Give rows without a box or landmarks a crop from the pipeline's detector: one face per image, chosen
    by ``rule`` (:func:`choose_face`).

    Returns the images with no face found, and those that could not be read at all.
    """
    no_face, unreadable = [], []
    todo = [s for s in dataset.samples if s.matrix is None]
    for s in tqdm(todo, desc="detecting faces", unit="image", disable=not progress or not todo, file=sys.stderr):
        try:
            image = read_image(s.path)
        except InputError:
            unreadable.append(s.path)
            continue
        detections = pipeline.detector.detect([image])[0]
        planned = pipeline.plan([image], [choose_face(detections, image.shape, rule)])
        s.faces_found = len(detections)
        if planned:
            s.box, s.matrix = planned[0].box, planned[0].matrix
        else:
            no_face.append(s.path)
    return no_face, unreadable


def run(args: argparse.Namespace, model: ModelOptions) -> int:
    """Build the dataset, check it, predict, score and report; the exit code. ``args``: the evaluation's
    own options (dataset, outputs, ``--face``, ...); ``model``: weights, device, engine and detector."""
    from ..classes import class_names
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
            check_writable_dir(Path(out).parent if str(Path(out).parent) else Path("."))
    ddp = init_distributed(prefer_cuda=(model.device or "cuda").startswith("cuda"))
    try:
        if ddp.world > 1 and torch.cuda.is_available() and (model.device or "cuda").startswith("cuda"):
            model = replace(model, device=f"cuda:{ddp.local_rank}")
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
            write_text(args.report, json.dumps(report, indent=2) + "\n")
        if args.predictions:
            write_text(args.predictions, predictions_csv(dataset, preds))
        return 0
    finally:
        if ddp.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
