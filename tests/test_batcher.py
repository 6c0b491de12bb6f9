"""The service's dynamic batcher (emonet.serve.batcher), driven directly: images from several clients in one
batch, each its own faces; a stream's faces keep their ids; one client's failure is its own."""
import threading

import numpy as np
import pytest

from emonet.build import ModelOptions, build_detector, build_engine
from emonet.engine.check import SAMPLE_PHOTO
from emonet.io.images import read_image
from emonet.pipeline import Pipeline
from emonet.serve.batcher import Batcher, StreamState


@pytest.fixture(scope="module")
def pipeline():
    options = ModelOptions(weights="random", device="cpu")
    engine = build_engine(options, log=lambda message: None)
    return Pipeline(engine, build_detector(options, engine))


def test_images_waiting_together_go_through_in_one_batch_each_with_its_own_faces(pipeline):
    photo = read_image(SAMPLE_PHOTO)
    batches = []
    batcher = Batcher(pipeline, max_batch=8, max_delay=0.5, on_batch=lambda n, faces, s: batches.append((n, faces)))
    try:
        futures = [batcher.submit(image) for image in (photo, np.zeros_like(photo), photo[:, ::-1].copy())]
        results = [f.result(timeout=300) for f in futures]
    finally:
        batcher.close()
    assert [len(r) for r in results] == [1, 0, 1] and batches == [(3, 2)]
    alone = pipeline([photo])[0][0]
    np.testing.assert_allclose(results[0][0].box, alone.box, atol=1e-3)
    assert abs(results[0][0].valence - alone.valence) < 1e-4  # batched with others: the same reading


def test_a_stream_keeps_its_face_ids_and_streams_do_not_share_them(pipeline):
    photo = read_image(SAMPLE_PHOTO)
    batcher = Batcher(pipeline, max_batch=4, max_delay=0.01)
    streams = [StreamState(), StreamState()]
    got: dict = {0: [], 1: []}

    def client(k: int) -> None:
        for shift in range(3):
            frame = np.roll(photo, 4 * shift, axis=1)  # the face moves a little
            got[k].append(batcher.submit(frame, streams[k]).result(timeout=300))

    threads = [threading.Thread(target=client, args=(k,)) for k in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        batcher.close()
    for k in (0, 1):
        assert [[f.face_id for f in faces] for faces in got[k]] == [[0], [0], [0]]
        assert [faces[0].frame for faces in got[k]] == [0, 1, 2] and streams[k].frames == 3


def test_a_failing_batch_fails_its_clients_and_the_batcher_goes_on(pipeline):
    batcher = Batcher(pipeline, max_batch=1, max_delay=0.0)
    try:
        bad = batcher.submit(np.zeros((10, 10), np.uint8))  # not an RGB image
        with pytest.raises(Exception):
            bad.result(timeout=60)
        assert batcher.submit(read_image(SAMPLE_PHOTO)).result(timeout=300)
    finally:
        batcher.close()


def test_a_stream_holds_a_followed_face_under_the_threshold_a_new_face_or_lone_image_needs(pipeline):
    photo = read_image(SAMPLE_PHOTO)
    detector = pipeline.detector
    batcher = Batcher(pipeline, max_batch=4, max_delay=0.2)
    followed, late = StreamState(), StreamState()
    saved = detector.min_score
    try:
        (first,) = batcher.submit(photo, followed).result(timeout=300)
        # The threshold now above the face's score, by less than the margin (as a face dips from frame to frame).
        detector.min_score = first.score + 0.05
        futures = [batcher.submit(photo, followed), batcher.submit(photo, late), batcher.submit(photo)]
        held, new, lone = (f.result(timeout=300) for f in futures)
    finally:
        detector.min_score = saved
        batcher.close()
    assert [f.face_id for f in held] == [first.face_id] and abs(held[0].score - first.score) < 1e-4  # held
    assert new == [] and lone == [] and late.tracker.tracks == []  # a new face, and a lone image, need the threshold
