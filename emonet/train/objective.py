"""The paper's objective (Toisoul et al. 2021, Methods): cross-entropy for the expression and, for valence and
arousal each, RMSE, 1 - PCC and 1 - CCC, these terms weighed by coefficients drawn uniformly from [0, 1] at every
step (shake-shake regularisation). A target a sample lacks (-1, nan) is left out of its terms."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _pcc(y: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    yc, pc = y - y.mean(), p - p.mean()
    return (yc * pc).sum() / (yc.norm() * pc.norm()).clamp_min(1e-8)


def _ccc(y: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """2 cov / (var_y + var_p + (mean_y - mean_p)^2), population statistics (as the evaluation's)."""
    yc, pc = y - y.mean(), p - p.mean()
    return 2 * (yc * pc).mean() / (yc.pow(2).mean() + pc.pow(2).mean() + (y.mean() - p.mean()) ** 2).clamp_min(1e-8)


def objective(out: dict, labels: torch.Tensor, valence: torch.Tensor, arousal: torch.Tensor,
              generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, dict]:
    """The loss of a batch's outputs (EmoNet's dict) against its targets, and its terms (floats) for the log.
    ``generator``: draws the shake-shake coefficients (None: every coefficient 1, as for validation)."""
    terms: dict[str, torch.Tensor] = {}
    known = labels >= 0
    if known.any():
        terms["ce"] = F.cross_entropy(out["expression"][known].float(), labels[known])
    for name, target in (("valence", valence), ("arousal", arousal)):
        keep = torch.isfinite(target)
        if keep.sum() < 2:  # correlation needs two samples
            continue
        y, p = target[keep].float(), out[name][keep].float()
        weights = torch.rand(3, generator=generator).tolist() if generator is not None else [1.0, 1.0, 1.0]
        rmse = (y - p).pow(2).mean().add(1e-12).sqrt()
        terms[f"{name}_rmse"] = weights[0] * rmse
        terms[f"{name}_pcc"] = weights[1] * (1 - _pcc(y, p))
        terms[f"{name}_ccc"] = weights[2] * (1 - _ccc(y, p))
    if not terms:
        zero = out["valence"].sum() * 0.0  # a batch with nothing to learn from: no gradient, no error
        return zero, {}
    loss = sum(terms.values())
    return loss, {k: float(v.detach()) for k, v in terms.items()}
