"""Evaluation: run EmoNet over a labelled dataset (one or several processes) and score it by the protocol.

Under ``torchrun`` each process evaluates its shard (PyTorch's DistributedSampler); predictions are
gathered with their sample indices and de-duplicated, so the sampler's padding is never counted twice,
and rank 0 scores and reports. The metrics equal a single-process run's.
"""
from __future__ import annotations

import csv
import io
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from .datasets import FaceDataset
from ..distributed import Distributed
from ..pipeline import Pipeline, PlannedFace
from ..results import FaceResult
from ..errors import InputError
from ..io.images import read_image
from ..log import progress_bar
from .metrics import evaluate_predictions

PUBLISHED = {  # spec §8, cleaned AffectNet test set
    8: {"ACC": 0.75, "valence": {"CCC": 0.82, "PCC": 0.82, "RMSE": 0.29, "SAGR": 0.84},
        "arousal": {"CCC": 0.75, "PCC": 0.75, "RMSE": 0.27, "SAGR": 0.80}},
    5: {"ACC": 0.82, "valence": {"CCC": 0.90, "PCC": 0.90, "RMSE": 0.24, "SAGR": 0.85},
        "arousal": {"CCC": 0.80, "PCC": 0.80, "RMSE": 0.24, "SAGR": 0.79}},
}


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
    for crops, _, _, _, index in progress_bar(loader, desc="evaluating", unit="batch", disable=not progress,
                                              file=sys.stderr):
        faces = [sample_face(dataset, int(i), k) for k, i in enumerate(index)]
        results += pipeline.collect(pipeline.launch([], faces, crops=crops, flip=flip))
    local = {"index": np.array([r.frame for r in results], dtype=np.int64),
             "probabilities": np.array([r.probabilities for r in results]).reshape(len(results), -1),
             "valence": np.array([r.valence for r in results]), "arousal": np.array([r.arousal for r in results])}
    if ddp.world > 1:
        gathered = ddp.gather(local)
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


# Read back by the CSV reader (datasets.csv_dataset): its path and label columns, then the predictions.
PREDICTION_COLUMNS = ("image", "expression", "valence", "arousal", "pred_expression", "pred_valence", "pred_arousal")


def predictions_csv(dataset: FaceDataset, preds: Predictions, folder: Optional[Path] = None) -> str:
    """One row per sample, a CSV the evaluation reads back as ``--csv``: the image (relative to ``folder``,
    the file's own, where a relative path reaches it; else absolute), the true labels, the predictions and
    probabilities by class, the crop the dataset gave (box or landmarks), and the face the detector chose."""
    names = dataset.class_names
    probs = preds.probabilities
    buf = io.StringIO()
    writer = csv.writer(buf)
    # The face evaluated where the detector placed the crop: how many it found and its box, in the detector's
    # own convention; named apart from x1..y2, which the reader would take as a box to crop by S3FD's.
    writer.writerow([*PREDICTION_COLUMNS, *[f"p_{n}" for n in names], "x1", "y1", "x2", "y2", "landmarks",
                     "faces_found", "detected_x1", "detected_y1", "detected_x2", "detected_y2"])
    for k, i in enumerate(preds.index):
        s = dataset.samples[i]
        detected = s.faces_found is not None
        given_box = [_exact(v) for v in s.box] if s.box is not None and not detected else [""] * 4
        landmarks = " ".join(map(_exact, s.landmarks.ravel())) if s.landmarks is not None else ""
        found = [s.faces_found, *np.round(s.box, 2).tolist()] if detected else [""] * 5
        writer.writerow([path_from(folder, s.path), names[s.label] if s.label >= 0 else "",
                         _exact(s.valence), _exact(s.arousal), names[int(probs[k].argmax())],
                         f"{preds.valence[k]:.6f}", f"{preds.arousal[k]:.6f}", *[f"{p:.6f}" for p in probs[k]],
                         *given_box, landmarks, *found])
    return buf.getvalue()


def _exact(value: float) -> str:
    """A label as it was read (repr round-trips a float), empty where there is none."""
    return "" if np.isnan(value) else repr(float(value))


def path_from(folder: Optional[Path], path: Path) -> str:
    """``path`` as a file in ``folder`` names it: relative where that reaches the same file, else absolute."""
    target = os.path.abspath(path)
    if folder is None:
        return target
    try:
        relative = os.path.relpath(target, os.path.abspath(folder))
    except ValueError:  # another drive (Windows): no relative path exists
        return target
    # ".." climbs the folder's real parent, which a symbolic link on the way may put elsewhere.
    if os.path.realpath(os.path.join(folder, relative)) != os.path.realpath(target):
        return target
    return relative


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
    for s in progress_bar(todo, desc="detecting faces", unit="image", disable=not progress or not todo,
                          file=sys.stderr):
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
