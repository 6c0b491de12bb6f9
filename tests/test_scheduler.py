"""The scheduler's step over many sessions (emonet.scheduler), driven directly on the CPU."""
import numpy as np

from emonet.detection.blazeface import BlazeFaceDetector
from emonet.engine import Engine, EngineConfig
from emonet.io.video import Frame
from emonet.pipeline import Pipeline
from emonet.scheduler import Scheduler
from emonet.session import VideoPipeline
from tests.conftest import small_faces_scene


def test_a_losing_streams_standby_rides_with_another_streams_detection(reference_model):
    # Two streams stepped together, a frame each. Stream A's frame is no detection frame, but A lost a face in the
    # chunk before: its look again rides, in standby, with stream B's detection, so the loss found when A's last
    # chunk settles costs no detector call of its own.
    scene, _ = small_faces_scene(widths=(300,), places=((900, 300),))
    detector = BlazeFaceDetector("cpu")
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), detector)
    launches = []
    launch = detector.launch
    detector.launch = lambda images, small=None, memory=None: launches.append(len(images)) or launch(images, small, memory)
    scheduler = Scheduler(pipeline)
    a, b = (VideoPipeline(pipeline, detect_every=3, standby=True, scheduler=scheduler) for _ in range(2))
    frame = lambda i: Frame(index=i, timestamp=i / 30, host=scene)  # noqa: E731
    first = scheduler.launch(scheduler.detect([(a, [frame(0)])]))  # A's frame 0: detected
    b.seen = 3  # B's next frame is one of its detection frames; A's (frame 1) is not
    a.losing = True
    launches.clear()
    queued = scheduler.detect([(a, [frame(1)]), (b, [frame(3)])])
    assert launches == [2] and queued.entries[0].standby  # one call: A's standby and B's frame together
    scheduler.settle(first)
    a.need_detection = True  # as if A's frame 0 had lost its face
    (settled_a, settled_b) = scheduler.settle(scheduler.launch(queued))
    assert launches == [2]  # the look again came from the standby: no call of its own
    assert [f.detected for f in a.results(settled_a)[0]] == [True]
    assert np.isfinite([f.score for f in b.results(settled_b)[0]]).all()


def test_a_face_between_detections_is_held_to_the_detection_before_it_not_a_later_one(reference_model):
    # A face moving fast; frames 0 and 5 are detected. Frames 1-4 are cropped from frame 0's detection, and their
    # boxes are held to it: the same boxes whether frame 5 is in their chunk (detected before the chunk settles)
    # or in the next one.
    frames = []
    for k in range(6):
        image, _ = small_faces_scene(widths=(300,), places=((500 + 30 * k, 300),))
        frames.append(Frame(index=k, timestamp=k / 30, host=image))
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))

    def boxes(chunks):
        session = VideoPipeline(pipeline, detect_every=5, smooth=False, standby=False)
        out = []
        for chunk in chunks:
            flags, queued = session.detect(chunk)
            out += session.finish(session.launch(chunk, flags, queued))
        assert [len(faces) for faces in out] == [1] * len(out)
        return [faces[0].box for faces in out]

    together, apart = boxes([frames]), boxes([frames[:5], frames[5:]])
    assert not np.allclose(together[0], together[5], atol=50)  # the face moved
    np.testing.assert_allclose(np.array(together[1:5]), np.array(apart[1:5]), atol=1e-3)  # px


def test_a_steps_frames_are_freed_when_it_is_done_with_not_left_to_the_garbage_collector(reference_model):
    # A live stream's frames are its decoded images (on a GPU, its memory): once a step is done with, nothing holds
    # its frames, not even a reference cycle only the garbage collector would free.
    import gc
    import weakref

    scene, _ = small_faces_scene(widths=(300,), places=((900, 300),))
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))
    scheduler = Scheduler(pipeline)
    sessions = [VideoPipeline(pipeline, detect_every=2, scheduler=scheduler) for _ in range(2)]
    gc.disable()
    try:
        frames = []
        for i in range(4):
            chunk = [Frame(index=i, timestamp=i / 30, host=scene) for _ in sessions]
            frames += [weakref.ref(f) for f in chunk]
            step = scheduler.launch(scheduler.detect([(s, [f]) for s, f in zip(sessions, chunk)]))
            for session, settled in zip(sessions, scheduler.settle(step)):
                assert len(session.results(settled)[0]) == 1
        del step, settled, chunk
        assert [f() for f in frames] == [None] * len(frames)
    finally:
        gc.enable()


def test_a_detection_only_queued_in_detect_gives_the_same_faces_in_launch(reference_model):
    # The live loop answers the step before between queueing a step's detection and reading its candidates
    # (detect(advance=False)); launch() then takes the detector on: the same boxes and scores as advanced at once.
    from emonet.detection.yunet import YuNetDetector

    scene, _ = small_faces_scene(widths=(60, 200), places=((300, 300), (900, 300)))
    for detector in (BlazeFaceDetector("cpu"), YuNetDetector("cpu")):
        pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), detector)
        found = []
        for advance in (True, False):
            scheduler = Scheduler(pipeline)
            session = VideoPipeline(pipeline, detect_every=5, smooth=False, standby=False, scheduler=scheduler)
            queued = scheduler.detect([(session, [Frame(index=0, timestamp=0.0, host=scene)])], advance=advance)
            (settled,) = scheduler.settle(scheduler.launch(queued))
            faces = session.results(settled)[0]
            found.append([(*np.round(f.box, 4), round(f.score, 6)) for f in faces])
        assert len(found[0]) == 2 and found[0] == found[1], detector.name
