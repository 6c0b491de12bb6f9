"""The pipeline: planned faces -> crops -> engine -> results, for photos and for ready-made dataset crops."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from emonet.detection.blazeface import DEFAULT_MIN_SCORE, BlazeFaceDetector
from emonet.engine import Engine, EngineConfig
from emonet.geometry import box_to_matrix
from emonet.io.video import Frame
from emonet.pipeline import Pipeline, PlannedFace
from emonet.session import VideoPipeline
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
    # Faces 40 and 60 px wide in a 1080p frame, and one of 300 px; the detector on every second frame. It looks
    # for small faces (its fine view) on every third detection frame (0, 6): the small ones are detected there
    # and followed between with the same ids, through the whole-frame-only detections of frames 2 and 4, which
    # re-detect the large one.
    scene, truth = small_faces_scene(widths=(40, 60, 300), places=((300, 700), (1000, 200), (1220, 330)))
    frames = [Frame(index=i, timestamp=i / 30, host=scene) for i in range(7)]
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))
    results = _video(pipeline, frames, chunk=7, detect_every=2)  # one chunk: no re-detection of lost faces
    ids = {}
    for frame in (0, 6):
        assert len(results[frame]) == 3 and all(f.detected for f in results[frame]), frame
        for box in truth:
            match = [f for f in results[frame] if iou(f.box, box) > 0.4]
            assert len(match) == 1, (frame, box)
            assert ids.setdefault(tuple(box), match[0].face_id) == match[0].face_id
    large = ids[tuple(truth[2])]
    for frame in (1, 2, 3, 4, 5):
        detected = sorted((f.face_id, f.detected) for f in results[frame])
        assert detected == sorted((i, i == large and frame in (2, 4)) for i in ids.values()), frame
    capped = Pipeline(pipeline.engine, pipeline.detector, max_faces=1)
    assert all(len(faces) == 1 for faces in _video(capped, frames[:3], chunk=3, detect_every=2))


@pytest.mark.parametrize("lost", [False, True])
def test_a_face_lost_after_the_next_chunk_was_queued_is_looked_for_again_small_ones_too(reference_model, lost):
    # The video tool queues chunk n's detection before it reads chunk n - 1's results. Frame 4 (detector on every
    # second frame) does not look for small faces; when chunk n - 1 lost a face while small faces are followed, it
    # is looked at again, small faces too: the 40- and 60-px faces are detected there, not only followed.
    scene, _ = small_faces_scene(widths=(40, 60), places=((300, 700), (1000, 200)))
    frames = [Frame(index=i, timestamp=i / 30, host=scene) for i in range(6)]
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))
    video = VideoPipeline(pipeline, detect_every=2)
    flags, handle = video.detect(frames[:4])
    pending = video.launch(frames[:4], flags, handle)
    flags, handle = video.detect(frames[4:])  # queued before the last chunk's results are read, as the tool does
    video.finish(pending)
    video.need_detection = lost  # what finish() decides when a face was lost or broke its bounds
    results = video.finish(video.launch(frames[4:], flags, handle))
    assert sorted((f.face_id, f.detected) for f in results[0]) == [(0, lost), (1, lost)]


@pytest.mark.parametrize("widths", [(300,), (60, 300)])
def test_a_lost_face_is_looked_for_in_standby_with_the_same_boxes(reference_model, widths):
    # Frame 4 starts a chunk and is no periodic detection frame (every third: 3 and 6 are). With standby it is
    # detected beside frame 6 anyway, and used when the chunk before lost a face: the same rows as a look of its
    # own once the loss is known, and the detector launched once a chunk. The look sees the whole frame only
    # where no small face is followed.
    scene, truth = small_faces_scene(widths=widths, places=((900, 300), (300, 700))[:len(widths)][::-1])
    frames = [Frame(index=i, timestamp=i / 30, host=scene) for i in range(8)]
    detector = BlazeFaceDetector("cpu")
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), detector)
    launches = []
    launch = detector.launch
    detector.launch = lambda images, small=None, memory=None: launches.append(list(small)) or launch(images, small, memory)
    runs = {}
    for standby in (False, True):
        launches.clear()
        video = VideoPipeline(pipeline, detect_every=3, standby=standby)
        flags, handle = video.detect(frames[:4])
        pending = video.launch(frames[:4], flags, handle)
        flags, handle = video.detect(frames[4:])
        first = video.finish(pending)
        video.need_detection = True  # as if chunk 0's landmarks had broken their bounds
        runs[standby] = (first + video.finish(video.launch(frames[4:], flags, handle)), list(launches))
    (alone, launched_alone), (ahead, launched_ahead) = runs[False], runs[True]
    small = len(widths) > 1
    # Frames 0 and 3 (3 whole-only); then 6 (whole-only), frame 4 in standby or on its own.
    assert launched_alone == [[True, False], [False], [small]]
    assert launched_ahead == [[True, False], [small, False]]
    for frame, (a, b) in enumerate(zip(alone, ahead)):
        assert [(f.face_id, f.detected) for f in a] == [(f.face_id, f.detected) for f in b], frame
        assert all(np.allclose(f.box, g.box, atol=1e-3) for f, g in zip(a, b)), frame
    assert [f.detected for f in ahead[4]] == [True] * len(widths)
    assert all(max(iou(f.box, box) for f in ahead[4]) > 0.5 for box in truth)
    assert [f.detected for f in ahead[5]] == [False] * len(widths)


@pytest.mark.parametrize("lost", [False, True])
@pytest.mark.parametrize("losing", [False, True])
def test_the_standby_look_is_queued_only_while_faces_are_being_lost(reference_model, losing, lost):
    # Landmarks that follow their faces seldom break their bounds: a standby look queued every chunk would be work
    # thrown away nearly every time. It rides with a chunk's detections only while the last chunk read lost a face;
    # a loss is looked at again either way (from the standby, or on its own after a quiet chunk).
    scene, _ = small_faces_scene(widths=(300,), places=((900, 300),))
    frames = [Frame(index=i, timestamp=i / 30, host=scene) for i in range(8)]
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))
    video = VideoPipeline(pipeline, detect_every=3, standby=True)
    flags, queued = video.detect(frames[:4])
    pending = video.launch(frames[:4], flags, queued)
    video.losing = losing  # as finish() of a chunk read before would have said: it lost a face, or not
    flags, queued = video.detect(frames[4:])  # frame 4 is no periodic detection frame, frame 6 is
    assert flags == [False, False, True, False]
    assert queued.standby is losing
    video.finish(pending)
    assert video.losing == video.need_detection  # finish() says whether the chunk it read lost a face
    video.need_detection = lost  # whether it did
    results = video.finish(video.launch(frames[4:], flags, queued))
    assert [f.detected for f in results[0]] == [lost]  # frame 4 looked at again after a loss, only then


def test_at_most_max_faces_a_frame_while_a_small_face_is_followed_unseen(reference_model):
    # max_faces=1: the best small face is followed from frame 0; on frame 2 (the whole frame only) a large face
    # appears and starts a track while the small one is followed on unseen: still one face a frame, the newest.
    scene, _ = small_faces_scene(widths=(40, 60), places=((300, 700), (1000, 200)))
    crowded, truth = small_faces_scene(widths=(40, 60, 300), places=((300, 700), (1000, 200), (1220, 330)))
    frames = [Frame(index=i, timestamp=i / 30, host=scene if i < 2 else crowded) for i in range(5)]
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"),
                        max_faces=1)
    results = _video(pipeline, frames, chunk=5, detect_every=2)
    assert [len(faces) for faces in results] == [1] * 5
    large = results[2][0]
    assert large.detected and iou(large.box, truth[2]) > 0.5
    assert [faces[0].face_id for faces in results[2:]] == [large.face_id] * 3


def test_a_video_of_no_face_reports_none_with_the_close_look(reference_model):
    # The video detector looks at every candidate close up, as the photo tool does: a flower is no face, even
    # 0.1 under the threshold.
    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn holds the photo")
    flower = np.ascontiguousarray(datasets.load_sample_image("flower.jpg"))
    frames = [Frame(index=i, timestamp=i / 30, host=flower) for i in range(6)]
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)),
                        BlazeFaceDetector("cpu", min_score=DEFAULT_MIN_SCORE - 0.1))
    assert all(faces == [] for faces in _video(pipeline, frames, detect_every=5))
