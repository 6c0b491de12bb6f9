import math

import numpy as np
import pytest

from emonet.evaluation.metrics import ccc, classification_metrics, evaluate_predictions, pcc, rmse, sagr

Y = [0.5, -0.2, 0.1, -0.8]
P = [0.4, 0.1, 0.3, -1.5]  # the last is clipped to -1 first


def test_values_against_hand_computations():
    p = [0.4, 0.1, 0.3, -1.0]
    assert rmse(Y, P) == pytest.approx(math.sqrt((0.01 + 0.09 + 0.04 + 0.04) / 4))
    assert sagr(Y, P) == pytest.approx(3 / 4)  # -0.2 vs +0.1 disagree
    my, mp = sum(Y) / 4, sum(p) / 4                    # -0.1, -0.05
    cov = sum((a - my) * (b - mp) for a, b in zip(Y, p)) / 4
    sy = math.sqrt(sum((a - my) ** 2 for a in Y) / 4)
    sp = math.sqrt(sum((b - mp) ** 2 for b in p) / 4)
    assert pcc(Y, P) == pytest.approx(cov / (sy * sp))
    assert ccc(Y, P) == pytest.approx(2 * cov / (sy ** 2 + sp ** 2 + (my - mp) ** 2))


def test_ccc_penalises_bias_where_pcc_does_not():
    y = np.linspace(-0.5, 0.5, 11)
    assert pcc(y, y + 0.3) == pytest.approx(1.0) and ccc(y, y + 0.3) < 0.8
    assert ccc(y, y) == pytest.approx(1.0)


def test_classification_metrics_by_hand():
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 0, 2]
    m = classification_metrics(labels, preds, ["a", "b", "c", "d"])
    assert m["ACC"] == pytest.approx(4 / 6)
    assert m["confusion_matrix"][0] == [1, 1, 0, 0] and m["confusion_matrix"][2] == [1, 0, 1, 0]
    assert m["per_class_accuracy"] == {"a": 0.5, "b": 1.0, "c": 0.5, "d": None}
    # F1: a: p 1/2 r 1/2 -> .5; b: p 2/3 r 1 -> .8; c: p 1 r 1/2 -> 2/3; d absent everywhere: not averaged.
    assert m["macro_F1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)


def test_only_present_labels_are_scored():
    out = evaluate_predictions(["a", "b"], labels=[0, 1], predictions=[0, 0],
                               valence=[np.nan, np.nan], valence_pred=[0.1, 0.2],
                               arousal=[0.2, np.nan], arousal_pred=[0.3, 0.1])
    assert set(out) == {"expression", "arousal"} and out["arousal"]["n"] == 1
