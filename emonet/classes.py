"""Expression classes of the released models (spec §4)."""
from __future__ import annotations

EXPRESSIONS_8 = ("Neutral", "Happy", "Sad", "Surprise", "Fear", "Disgust", "Anger", "Contempt")
# The authors' names for the 5-class model. Their AffectNet 5-class evaluation *protocol* keeps labels
# {0, 1, 2, 3, 6} and maps Anger (6) to index 4, where these names say Fear. Evaluation follows the
# protocol (emonet.datasets); display follows these names. The inconsistency is the authors'.
EXPRESSIONS_5 = ("Neutral", "Happy", "Sad", "Surprise", "Fear")


def class_names(n_expression: int) -> tuple[str, ...]:
    """Display names of the expression classes for an ``n_expression``-class model."""
    if n_expression == 8:
        return EXPRESSIONS_8
    if n_expression == 5:
        return EXPRESSIONS_5
    return tuple(f"class_{i}" for i in range(n_expression))
