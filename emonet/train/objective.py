"""The paper's objective (Toisoul et al. 2021, Methods): cross-entropy for the expression and, for valence and
arousal each, RMSE, 1 - PCC and 1 - CCC, these terms weighed by coefficients drawn uniformly from [0, 1] at every
step (shake-shake regularisation). A target a sample lacks (-1, nan) is left out of its terms.

Every term is a masked sum over the whole batch rather than a selection of the samples that have the target: the
loss is then made without reading anything back from the GPU, so the host queues the next step's work while this
one runs (a step's single synchronisation point would otherwise idle the GPU once per step)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _regression(y: torch.Tensor, p: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """RMSE, PCC and CCC (population statistics, as the evaluation's) of ``p`` against ``y`` over the samples
    ``keep`` marks, and whether there are two of them (correlation needs two)."""
    w = keep.float()
    n = w.sum().clamp_min(1.0)
    y = torch.where(keep, y.float(), 0.0)
    p = torch.where(keep, p.float(), 0.0)
    my, mp = y.sum() / n, p.sum() / n
    yc, pc = (y - my) * w, (p - mp) * w
    rmse = (((y - p) * w).pow(2).sum() / n).add(1e-12).sqrt()
    pcc = (yc * pc).sum() / (yc.pow(2).sum() * pc.pow(2).sum()).add(1e-16).sqrt().clamp_min(1e-8)
    ccc = 2 * (yc * pc).sum() / n / ((yc.pow(2).sum() + pc.pow(2).sum()) / n + (my - mp) ** 2).clamp_min(1e-8)
    return rmse, pcc, ccc, (keep.sum() >= 2).float()


def objective(out: dict, labels: torch.Tensor, valence: torch.Tensor, arousal: torch.Tensor,
              generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, dict]:
    """The loss of a batch's outputs (EmoNet's dict) against its targets, and its terms (tensors on the outputs'
    device: zero where the batch lacks the target). ``generator``: draws the shake-shake coefficients (None:
    every coefficient 1, as for validation)."""
    known = labels >= 0
    ce = F.cross_entropy(out["expression"].float(), labels.clamp_min(0), reduction="none")
    terms = {"ce": (ce * known).sum() / known.sum().clamp_min(1)}
    for name, target in (("valence", valence), ("arousal", arousal)):
        weights = torch.rand(3, generator=generator).tolist() if generator is not None else [1.0, 1.0, 1.0]
        rmse, pcc, ccc, enough = _regression(target, out[name], torch.isfinite(target))
        terms[f"{name}_rmse"] = weights[0] * rmse * enough
        terms[f"{name}_pcc"] = weights[1] * (1 - pcc) * enough
        terms[f"{name}_ccc"] = weights[2] * (1 - ccc) * enough
    return sum(terms.values()), terms
