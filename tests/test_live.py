"""The live loop (emonet.video.live) driven directly: streams are sessions of the video runtime's scheduler, so a
stream gives a video's rows; many streams at once each keep their own ids and smoothing; an overloaded stream is
answered in order, its stale frames said dropped, and holds no more than a couple of frames."""
from pathlib import Path

import numpy as np
import pytest

from emonet.detection.blazeface import BlazeFaceDetector
from emonet.engine import Engine, EngineConfig
from emonet.engine.check import SAMPLE_PHOTO
from emonet.io.images import read_image
from emonet.io.video import VideoReader
from emonet.pipeline import Pipeline
from emonet.results import FrameFaces
from emonet.video import ArraySource, VideoConfig, VideoInput, run_videos
from emonet.video.live import DROPPED, LiveConfig, LiveLoop


@pytest.fixture(scope="module")
def pipeline(reference_model):
    return Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> list[np.ndarray]:
    """The frames of a real face moving over a filmed-like background, as the video tool reads them."""
    from emonet.bench.run import make_clip
    path = make_clip(tmp_path_factory.mktemp("live") / "clip.mp4", width=320, height=240, frames=12)
    reader = VideoReader(str(path))
    try:
        return [frame.image for frame in reader]
    finally:
        reader.close()


def video_rows(pipeline: Pipeline, frames: list[np.ndarray], detect_every: int = 3) -> list[list]:
    """Per frame, its faces as the video runtime gives them in chunks of one frame."""
    config = VideoConfig(batch_size=1, detect_every=detect_every)
    out = run_videos([VideoInput(ArraySource(frames), progress=False)], config, lambda shape: pipeline)
    return [item.faces for item in out if isinstance(item, FrameFaces)]


def assert_same(got: list, want: list) -> None:
    assert [[(f.face_id, f.detected) for f in faces] for faces in got] == \
        [[(f.face_id, f.detected) for f in faces] for faces in want]
    for a, b in zip((f for faces in got for f in faces), (f for faces in want for f in faces)):
        np.testing.assert_allclose(a.box, b.box, atol=0.5)
        np.testing.assert_allclose([a.valence, a.arousal, *a.probabilities], [b.valence, b.arousal, *b.probabilities],
                                   atol=1e-4)


def test_streams_stepped_together_each_give_their_own_videos_rows(pipeline, clip):
    # Three streams of different content, their frames stepped together (one detector call and one engine batch a
    # step): each stream's faces, ids and smoothing are those of its own video run, frame for frame.
    streams = [clip, clip[::-1], [np.ascontiguousarray(f[:, ::-1]) for f in clip]]
    want = [video_rows(pipeline, frames) for frames in streams]
    steps = []
    loop = LiveLoop(pipeline, LiveConfig(detect_every=3), on_step=lambda n, faces, s: steps.append(n))
    try:
        sessions = [loop.open() for _ in streams]
        got: list[list] = [[] for _ in streams]
        for k in range(len(clip)):  # each frame sent once the last is answered, as a paced camera's would be
            futures = [loop.submit(s, frames[k]) for s, frames in zip(sessions, streams)]
            for out, future in zip(got, futures):
                out.append(future.result(timeout=300).faces)
    finally:
        loop.close()
    for g, w in zip(got, want):
        assert sum(len(faces) for faces in w) >= len(clip) - 2  # the face is there in (nearly) every frame
        assert_same(g, w)
    assert max(steps) > 1  # streams shared steps


def test_an_overloaded_stream_is_answered_in_order_its_stale_frames_dropped_holding_two_at_most(pipeline, clip):
    loop = LiveLoop(pipeline, LiveConfig(max_waiting=2))
    try:
        session = loop.open()
        futures = []
        for k in range(24):  # far faster than a CPU reads them
            futures.append(loop.submit(session, clip[k % len(clip)]))
            assert len(session.waiting) <= 2
        results = [f.result(timeout=300) for f in futures]
    finally:
        loop.close()
    dropped = [r.faces == DROPPED for r in results]
    assert any(dropped) and not all(dropped)
    assert not dropped[-1]  # the newest frame is never pushed out
    read = [r for r in results if r.faces != DROPPED]
    assert all(r.shape == clip[0].shape for r in read)


def test_a_frame_older_than_max_age_when_its_turn_comes_is_answered_dropped_in_order(pipeline, clip):
    import time
    loop = LiveLoop(pipeline, LiveConfig(max_age=5.0, max_waiting=4))
    try:
        session = loop.open()
        now = time.perf_counter()
        # Frames 0 and 2 were read a minute ago (a client's frames stuck before the loop); 1 and 3 just now.
        ages = [60.0, 0.0, 60.0, 0.0]
        futures = [loop.submit(session, clip[k], timestamp=now - age) for k, age in enumerate(ages)]
        results = [f.result(timeout=300) for f in futures]
        one_shot = loop.open(one_shot=True)  # an image is never too old: it is no stream
        photo = loop.submit(one_shot, clip[0], timestamp=now - 60.0).result(timeout=300)
    finally:
        loop.close()
    assert [r.faces == DROPPED for r in results] == [True, False, True, False]
    assert all(len(r.faces) == 1 for r in results[1::2]) and photo.faces != DROPPED


def test_a_one_shot_session_reads_an_image_as_the_photo_tool_does(pipeline):
    photo = read_image(SAMPLE_PHOTO)
    loop = LiveLoop(pipeline)
    try:
        result = loop.submit(loop.open(one_shot=True), photo).result(timeout=300)
    finally:
        loop.close()
    (alone,) = pipeline([photo])[0]
    (face,) = result.faces
    assert face.face_id == alone.face_id == 0 and face.detected
    assert_same([[face]], [[alone]])


def test_a_closed_session_drops_its_waiting_frames_and_the_loop_goes_on(pipeline, clip):
    loop = LiveLoop(pipeline)
    try:
        gone, other = loop.open(), loop.open()
        futures = [loop.submit(gone, clip[k]) for k in range(3)]
        loop.close_session(gone)
        with pytest.raises(RuntimeError, match="closed"):
            loop.submit(gone, clip[0])
        assert loop.submit(other, clip[0]).result(timeout=300).faces != DROPPED
        assert all(f.done() for f in futures)
    finally:
        loop.close()


def test_bad_frames_and_a_second_image_of_a_one_shot_session_are_refused_at_once(pipeline, clip):
    loop = LiveLoop(pipeline)
    try:
        with pytest.raises(ValueError, match="RGB"):
            loop.submit(loop.open(), np.zeros((0, 5, 3), np.uint8))
        one = loop.open(one_shot=True)
        future = loop.submit(one, clip[0])
        with pytest.raises(RuntimeError, match="one image"):
            loop.submit(one, clip[1])
        assert future.result(timeout=300).shape == clip[0].shape
    finally:
        loop.close()


def test_every_stream_gets_its_turn_when_more_wait_than_a_step_holds(pipeline, clip):
    loop = LiveLoop(pipeline, LiveConfig(max_frames=2, chunk=1))
    try:
        sessions = [loop.open() for _ in range(5)]
        futures = [loop.submit(s, clip[0]) for s in sessions]
        served = [s for s, f in zip(sessions, futures) if f.result(timeout=300).faces != DROPPED]
    finally:
        loop.close()
    assert len(served) == 5  # each answered, none starved behind the others


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # its thread's traceback
def test_a_loop_that_stops_fails_every_frame_in_hand_and_refuses_more(pipeline, clip):
    def broken(images, faces, seconds):
        raise SystemExit("the step hook broke the loop")  # not an Exception: the loop cannot go on
    loop = LiveLoop(pipeline, on_step=broken)
    session = loop.open()
    first = loop.submit(session, clip[0])
    assert first.result(timeout=300).faces != DROPPED  # answered before the hook ran
    loop._thread.join(timeout=60)
    with pytest.raises(RuntimeError, match="stopped"):
        loop.submit(session, clip[1])


def test_encoded_frames_are_decoded_apart_and_give_the_rows_of_their_pixels_a_corrupt_one_said(pipeline, clip):
    import cv2
    import torch

    from emonet.video.live import FrameError

    def decode(data: list[bytes]) -> list[torch.Tensor]:  # stands where nvJPEG does on a GPU: a real decoder
        images = [cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR) for d in data]
        if any(image is None for image in images):
            raise ValueError("corrupt JPEG data")
        return [torch.from_numpy(cv2.cvtColor(image, cv2.COLOR_BGR2RGB)) for image in images]

    encoded = [cv2.imencode(".png", cv2.cvtColor(f, cv2.COLOR_RGB2BGR))[1].tobytes() for f in clip]  # lossless
    loop = LiveLoop(pipeline, LiveConfig(detect_every=3, chunk=1), decode_jpeg=decode)
    try:
        session, bad = loop.open(), loop.open()
        broken = loop.submit(bad, encoded[0][:200])
        futures = []
        for data in encoded:  # one at a time, as the video tool's chunks of one frame
            futures.append(loop.submit(session, data))
            futures[-1].result(timeout=300)
        with pytest.raises(FrameError, match="could not be decoded"):
            broken.result(timeout=300)
    finally:
        loop.close()
    plain = LiveLoop(pipeline)  # without a decoder: bytes refused at once
    try:
        with pytest.raises(ValueError, match="decoded frames only"):
            plain.submit(plain.open(), encoded[0])
    finally:
        plain.close()
    assert_same([f.result().faces for f in futures], video_rows(pipeline, clip))
