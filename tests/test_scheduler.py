"""The scheduler's step over many sessions (emonet.scheduler), driven directly on the CPU."""
import numpy as np

from emonet.detection.blazeface import BlazeFaceDetector
from emonet.engine import Engine, EngineConfig
from emonet.io.video import Frame
from emonet.pipeline import Pipeline
from emonet.scheduler import Scheduler, VideoPipeline
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
    detector.launch = lambda images, small=None: launches.append(len(images)) or launch(images, small)
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
