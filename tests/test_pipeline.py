"""The pipeline: planned faces -> crops -> engine -> results, for photos and for ready-made dataset crops."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from emonet.detection.blazeface import DEFAULT_MIN_SCORE, BlazeFaceDetector
from emonet.engine import Engine, EngineConfig
from emonet.geometry import box_to_matrix
from emonet.io.video import Frame
from emonet.pipeline import Pipeline, PlannedFace, VideoPipeline
from emonet.tracking import iou
from tests.conftest import small_faces_scene


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


def _video(pipeline: Pipeline, frames: list, chunk: int = 3, **kwargs) -> list[list]:
    """Run ``frames`` through a VideoPipeline in chunks, as the video tool does; per frame, its results."""
    video = VideoPipeline(pipeline, **kwargs)
    out = []
    for start in range(0, len(frames), chunk):
        part = frames[start:start + chunk]
        flags, handle = video.detect(part)
        out += video.finish(video.launch(part, flags, handle))
    return out


def test_small_faces_are_found_and_followed_in_video(reference_model):
    # Faces 40 and 60 px wide in a 1080p frame: the detector's fine view finds them on every detection frame
    # (0, 5, 10), the same ids throughout; between detections they are followed (detected=False).
    scene, truth = small_faces_scene(widths=(40, 60), places=((300, 700), (1000, 200)))
    frames = [Frame(index=i, timestamp=i / 30, host=scene) for i in range(11)]
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))
    results = _video(pipeline, frames, chunk=6, detect_every=5)
    for frame in (0, 5, 10):
        assert sorted((f.face_id, f.detected) for f in results[frame]) == [(0, True), (1, True)], frame
        assert all(any(iou(f.box, box) > 0.4 for f in results[frame]) for box in truth)
    assert sorted((f.face_id, f.detected) for f in results[3]) == [(0, False), (1, False)]
    capped = Pipeline(pipeline.engine, pipeline.detector, max_faces=1)
    assert all(len(faces) == 1 for faces in _video(capped, frames[:6], chunk=6, detect_every=5))


def test_a_video_of_no_face_reports_none_with_the_close_look(reference_model):
    # The video detector looks at every candidate close up, as the photo tool does: a flower is no face, even
    # 0.1 under the threshold.
    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn holds the photo")
    flower = np.ascontiguousarray(datasets.load_sample_image("flower.jpg"))
    frames = [Frame(index=i, timestamp=i / 30, host=flower) for i in range(6)]
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)),
                        BlazeFaceDetector("cpu", min_score=DEFAULT_MIN_SCORE - 0.1))
    assert all(faces == [] for faces in _video(pipeline, frames, detect_every=5))
