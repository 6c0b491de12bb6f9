"""What a training run reports: the validation's predictions and metrics (as the photo tool reads a face), the
per-epoch log and learning curves, the best epoch's predictions."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np
import torch

from ..classes import class_names
from ..evaluation.metrics import evaluate_predictions
from ..io.atomic import write_bytes, write_text
from ..models.emonet import EmoNet
from .data import CropSet


def score_of(metrics: dict) -> float:
    """One number to choose the best epoch by: the mean of ACC and the valence and arousal CCCs present."""
    parts = [metrics["expression"]["ACC"]] if "expression" in metrics else []
    parts += [metrics[k]["CCC"] for k in ("valence", "arousal") if k in metrics and math.isfinite(metrics[k]["CCC"])]
    return float(np.mean(parts)) if parts else float("nan")


@torch.no_grad()
def predict(model: EmoNet, crops: np.ndarray, device: torch.device, batch: int = 64) -> dict:
    """EmoNet's outputs over cached crops, in fp32 and eval mode (as the photo tool reads a face): expression
    probabilities, class, valence, arousal."""
    was = model.training
    model.eval()
    probs, val, aro = [], [], []
    for start in range(0, len(crops), batch):
        x = torch.from_numpy(np.ascontiguousarray(crops[start:start + batch])).to(device)
        out = model(x.permute(0, 3, 1, 2).float().div(255.0))
        probs.append(torch.softmax(out["expression"].float(), 1).cpu())
        val.append(out["valence"].float().cpu())
        aro.append(out["arousal"].float().cpu())
    model.train(was)
    p = torch.cat(probs).numpy()
    # Clamped to the circumplex's range, as every tool reports them (the metrics clip the same way).
    return {"probabilities": p, "expression": p.argmax(1), "valence": np.clip(torch.cat(val).numpy(), -1.0, 1.0),
            "arousal": np.clip(torch.cat(aro).numpy(), -1.0, 1.0)}


def evaluate(model: EmoNet, data: CropSet, device: torch.device) -> tuple[dict, dict]:
    """The evaluation module's metrics on ``data`` (those of the targets it has), and the predictions."""
    pred = predict(model, data.crops, device)
    names = class_names(model.n_expression)
    has = data.targets()
    metrics = evaluate_predictions(
        names, labels=data.labels if has["expression"] else None, predictions=pred["expression"],
        valence=data.valence if has["valence"] else None, valence_pred=pred["valence"],
        arousal=data.arousal if has["arousal"] else None, arousal_pred=pred["arousal"])
    return metrics, pred


def predictions_csv(data: CropSet, pred: dict, names: tuple) -> str:
    """One row per validation face: image, labels, predictions."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["image", "expression", "valence", "arousal", "pred_expression", "pred_valence", "pred_arousal"])
    for i, path in enumerate(data.paths):
        label = names[data.labels[i]] if data.labels[i] >= 0 else ""
        w.writerow([path, label, "" if np.isnan(data.valence[i]) else f"{data.valence[i]:.6f}",
                    "" if np.isnan(data.arousal[i]) else f"{data.arousal[i]:.6f}", names[pred["expression"][i]],
                    f"{pred['valence'][i]:.6f}", f"{pred['arousal'][i]:.6f}"])
    return out.getvalue()


def flat_metrics(metrics: dict) -> dict:
    """The metrics as one flat row (ACC, valence_CCC, ...)."""
    row = {}
    if "expression" in metrics:
        row["ACC"] = metrics["expression"]["ACC"]
    for k in ("valence", "arousal"):
        for m in ("CCC", "PCC", "RMSE", "SAGR"):
            if k in metrics:
                row[f"{k}_{m}"] = metrics[k][m]
    return row


def plot_curves(rows: list[dict], path: Path) -> None:
    """The learning curves (training loss; validation metrics by epoch) as a PNG, written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r["epoch"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, [r["train_loss"] for r in rows], marker="o")
    left.set(title="training loss", xlabel="epoch")
    for key in ("ACC", "valence_CCC", "arousal_CCC"):
        if key in rows[-1]:
            right.plot(epochs, [r.get(key, np.nan) for r in rows], marker="o", label=key.replace("_", " "))
    right.set(title="validation", xlabel="epoch", ylim=(min(0, *[r.get("valence_CCC", 0) for r in rows]), 1))
    right.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_bytes(path, buf.getvalue())


def write_log(rows: list[dict], path: Path) -> None:
    """The per-epoch rows as ``log.csv`` (atomically)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    write_text(path, buf.getvalue())


def epoch_line(row: dict) -> str:
    """An epoch's one line on the console."""
    parts = [f"epoch {row['epoch']}: loss {row['train_loss']:.4f}"]
    if "ACC" in row:
        parts.append(f"ACC {row['ACC']:.3f}")
    for k in ("valence", "arousal"):
        if f"{k}_CCC" in row:
            parts.append(f"{k} CCC {row[f'{k}_CCC']:.3f} RMSE {row[f'{k}_RMSE']:.3f}")
    return ", ".join(parts)
