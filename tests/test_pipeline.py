"""The pipeline: planned faces -> crops -> engine -> results, for photos and for ready-made dataset crops."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from emonet.engine import Engine, EngineConfig
from emonet.geometry import box_to_matrix
from emonet.pipeline import Pipeline, PlannedFace


@pytest.fixture(scope="module")
def pipeline(reference_model):
    return Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)))


def _faces(n: int) -> list[PlannedFace]:
    matrix = box_to_matrix(np.array([10.0, 20.0, 110.0, 120.0]))
    return [PlannedFace(image=k, frame=100 + k, face_id=0, box=None, score=float("nan"), detected=False,
                        matrix=matrix) for k in range(n)]


def test_flip_averages_raw_valence_and_arousal_then_clamps(pipeline, parity):
    _, inputs, _ = parity(8)
    crops = inputs[:3]
    faces = _faces(len(crops))
    plain = pipeline.collect(pipeline.launch([], faces, crops=crops))
    flipped = pipeline.collect(pipeline.launch([], faces, crops=crops, flip=True))
    out, mirrored = pipeline.engine(crops), pipeline.engine(crops.flip(-1))
    for k, (p, f) in enumerate(zip(plain, flipped)):
        assert f.frame == 100 + k
        # The expression and landmarks come from the unflipped crop only.
        np.testing.assert_allclose(f.probabilities, p.probabilities)
        np.testing.assert_allclose(f.landmarks, p.landmarks)
        for name in ("valence", "arousal"):
            mean = (out[name][k].double() + mirrored[name][k].double()) / 2
            assert getattr(f, name) == pytest.approx(float(mean.clamp(-1, 1)), abs=1e-6)
    assert any(abs(f.valence - p.valence) > 1e-4 for f, p in zip(flipped, plain))


def test_results_match_the_engine_outputs(pipeline, parity):
    _, inputs, _ = parity(8)
    crops = inputs[:2]
    results = pipeline.collect(pipeline.launch([], _faces(2), crops=crops))
    out = pipeline.engine(crops)
    probs = torch.softmax(out["expression"].double(), 1).numpy()
    for k, r in enumerate(results):
        np.testing.assert_allclose(r.probabilities, probs[k], atol=1e-6)
        assert r.expression == int(probs[k].argmax())
        assert r.valence == pytest.approx(float(out["valence"][k].clamp(-1, 1)), abs=1e-6)
        # Landmarks in image pixels: the crop's mapped back through the face's matrix, and the box is theirs.
        assert r.landmarks.shape == (68, 2)
        np.testing.assert_allclose(r.box, [*r.landmarks.min(0), *r.landmarks.max(0)], atol=1e-6)


def test_without_a_detector_boxes_must_be_given(pipeline):
    with pytest.raises(ValueError, match="no detector"):
        pipeline([np.zeros((64, 64, 3), np.uint8)])
