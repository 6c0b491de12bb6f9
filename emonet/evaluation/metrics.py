"""Evaluation metrics (spec §7): ACC, RMSE, SAGR, PCC, CCC, plus macro-F1, per-class accuracy, confusion.

Valence and arousal predictions are clipped to [-1, 1] before any metric, as the protocol does.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def _pair(y, p) -> tuple[np.ndarray, np.ndarray]:
    y, p = np.asarray(y, dtype=np.float64), np.clip(np.asarray(p, dtype=np.float64), -1.0, 1.0)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"labels and predictions must be 1-D of one length, got {y.shape} and {p.shape}")
    if y.size == 0:
        raise ValueError("no samples to score")
    return y, p


def rmse(y, p) -> float:
    """Root mean squared error."""
    y, p = _pair(y, p)
    return float(np.sqrt(np.mean((y - p) ** 2)))


def sagr(y, p) -> float:
    """Sign agreement: the fraction of samples whose prediction has the label's sign."""
    y, p = _pair(y, p)
    return float(np.mean(np.sign(y) == np.sign(p)))


def pcc(y, p) -> float:
    """Pearson correlation coefficient (nan when either side is constant)."""
    y, p = _pair(y, p)
    sy, sp = y.std(), p.std()
    if sy == 0 or sp == 0:
        return float("nan")
    return float(np.mean((y - y.mean()) * (p - p.mean())) / (sy * sp))


def ccc(y, p) -> float:
    """Concordance correlation: 2 rho sy sp / (sy^2 + sp^2 + (my - mp)^2), population deviations."""
    y, p = _pair(y, p)
    sy, sp = y.std(), p.std()
    denom = sy ** 2 + sp ** 2 + (y.mean() - p.mean()) ** 2
    if denom == 0:
        return float("nan")
    return float(2 * np.mean((y - y.mean()) * (p - p.mean())) / denom)


def regression_metrics(y, p) -> dict:
    """RMSE, SAGR, PCC and CCC of one continuous dimension."""
    return {"RMSE": rmse(y, p), "SAGR": sagr(y, p), "PCC": pcc(y, p), "CCC": ccc(y, p)}


def confusion_matrix(labels, predictions, n_classes: int) -> np.ndarray:
    """Rows: true class; columns: predicted class."""
    labels, predictions = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)
    cm = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(cm, (labels, predictions), 1)
    return cm


def classification_metrics(labels, predictions, class_names: Sequence[str]) -> dict:
    """ACC, macro-F1 (over classes present in the labels or predictions), per-class accuracy, confusion matrix."""
    labels, predictions = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)
    if labels.size == 0:
        raise ValueError("no samples to score")
    n = len(class_names)
    cm = confusion_matrix(labels, predictions, n)
    tp = np.diag(cm).astype(np.float64)
    support, predicted = cm.sum(axis=1), cm.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, tp / predicted, 0.0)
        recall = np.where(support > 0, tp / support, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    present = (support > 0) | (predicted > 0)
    return {
        "ACC": float(np.mean(labels == predictions)),
        "macro_F1": float(f1[present].mean()) if present.any() else float("nan"),
        "per_class_accuracy": {name: (float(recall[i]) if support[i] else None) for i, name in enumerate(class_names)},
        "support": {name: int(support[i]) for i, name in enumerate(class_names)},
        "confusion_matrix": cm.tolist(),
    }


def evaluate_predictions(class_names: Sequence[str], labels=None, predictions=None, valence=None,
                         valence_pred=None, arousal=None, arousal_pred=None) -> dict:
    """All metrics for whatever labels are present (None or all-nan columns are skipped)."""
    out: dict = {}

    def present(v) -> Optional[np.ndarray]:
        if v is None:
            return None
        v = np.asarray(v, dtype=np.float64)
        return v if np.isfinite(v).any() else None

    lab = present(labels)
    if lab is not None:
        keep = np.isfinite(lab) & (lab >= 0)
        out["expression"] = classification_metrics(lab[keep].astype(int), np.asarray(predictions)[keep], class_names)
        out["expression"]["n"] = int(keep.sum())
    for key, y, p in (("valence", valence, valence_pred), ("arousal", arousal, arousal_pred)):
        y = present(y)
        if y is not None:
            keep = np.isfinite(y)
            out[key] = regression_metrics(y[keep], np.asarray(p, dtype=np.float64)[keep])
            out[key]["n"] = int(keep.sum())
    return out
