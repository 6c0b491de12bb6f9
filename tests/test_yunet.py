"""YuNet, the one-pass detector: the conversion against OpenCV's own FaceDetectorYN, faces found (small, cut by the
frame's edge), non-faces not, the same boxes however images are given, and crops where BlazeFace's are."""
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from emonet.detection import create_detector
from emonet.detection.blazeface import BlazeFaceDetector
from emonet.detection.yunet import DEFAULT_MIN_SCORE, YuNetDetector
from emonet.engine.check import SAMPLE_PHOTO
from emonet.io.images import read_image

from tests.conftest import small_faces_scene
from tests.test_detection import NON_FACES, _sample, _sklearn, iou

DATA = Path(__file__).parent / "data"
PHOTOS = [SAMPLE_PHOTO, *sorted((DATA / "portraits").glob("*.jpg"))]


@pytest.fixture(scope="module")
def detector():
    return YuNetDetector("cpu")


def _hopper() -> np.ndarray:
    import matplotlib.cbook

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as fh:
        return cv2.cvtColor(cv2.imdecode(np.frombuffer(fh.read(), np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


@pytest.mark.skipif(not hasattr(cv2, "FaceDetectorYN"), reason="OpenCV has FaceDetectorYN from 4.5.4")
@pytest.mark.parametrize("path", PHOTOS, ids=lambda p: p.name)
def test_the_network_finds_what_opencvs_facedetectoryn_finds_with_the_original_onnx(path):
    # The shipped weights (converted from the training checkpoint) against the repository's own ONNX export run by
    # OpenCV's implementation (its padding, decoding and NMS): the same faces, boxes and scores (the network alone:
    # without the frame mirrored past its sides).
    bgr = cv2.imread(str(path))
    h, w = bgr.shape[:2]
    theirs = cv2.FaceDetectorYN.create(str(DATA / "yunet_n_dynamic.onnx"), "", (w, h), 0.5, 0.3, 5000)
    _, faces = theirs.detect(bgr)
    ours = YuNetDetector("cpu", max_side=10_000, min_score=0.5, verify=False, mirror=False).detect([bgr[..., ::-1].copy()])[0]
    assert faces is not None and len(ours) == len(faces)
    faces = faces[np.argsort(-faces[:, 14], kind="stable")]
    np.testing.assert_allclose(ours[:, :4], np.c_[faces[:, :2], faces[:, :2] + faces[:, 2:4]], atol=0.01)
    np.testing.assert_allclose(ours[:, 4], faces[:, 14], atol=1e-4)


def test_real_faces_are_found_well_above_the_threshold(detector):
    for image in (_sample("astronaut"), _sample("camera"), _hopper(), *(read_image(p) for p in PHOTOS[1:])):
        faces = detector.detect([image])[0]
        assert len(faces) >= 1 and faces[0, 4] >= DEFAULT_MIN_SCORE + 0.05


def test_no_non_face_comes_within_a_tenth_of_the_threshold():
    # A cat's face scores 0.39 by YuNet alone; a galaxy field 0.58. The close look keeps both far under.
    lenient = YuNetDetector("cpu", min_score=DEFAULT_MIN_SCORE - 0.1)
    photos = [_sample(n) for n in NON_FACES] + [_sklearn("flower.jpg"), _sklearn("china.jpg")]
    assert [i for i, faces in enumerate(lenient.detect(photos)) if len(faces)] == []


def test_faces_40_to_90_px_wide_in_a_1080p_photo_are_found_in_one_pass(detector):
    scene, truth = small_faces_scene()
    found = detector.detect([scene])[0]
    assert len(found) == 3, found
    for box in truth:
        assert any(iou(f, box) > 0.4 for f in found), (box, found)


@pytest.mark.parametrize("side", ["left", "right", "top", "bottom"])
def test_a_face_the_frames_edge_cuts_in_half_is_found(detector, side):
    image = _hopper()
    x1, y1, x2, y2 = detector.detect([image])[0][0, :4].astype(int)
    half_w, half_h = (x2 - x1) * 45 // 100, (y2 - y1) * 45 // 100  # 45 % of the face outside the frame
    left, top = {"left": (x1 + half_w, 0), "top": (0, y1 + half_h)}.get(side, (0, 0))
    cut = {"left": image[:, left:], "right": image[:, :x2 - half_w],
           "top": image[top:], "bottom": image[:y2 - half_h]}[side]
    (face,) = detector.detect([np.ascontiguousarray(cut)])[0]
    h, w = cut.shape[:2]
    visible = np.clip(np.array([x1 - left, y1 - top, x2 - left, y2 - top], float), 0, [w, h, w, h])
    assert iou(face, visible) > 0.5, (face, visible)
    # BlazeFace (`--detector blazeface`) misses most such faces (see docs/PERFORMANCE.md)


@pytest.mark.parametrize("path", sorted((DATA / "portraits").glob("*.jpg")), ids=lambda p: p.name)
def test_a_face_the_frames_side_cuts_through_its_middle_is_found(detector, path):
    # Half a face: YuNet scores it lower (0.75 for obama2's left half, under the threshold); the close look sees
    # the frame mirrored at that side, a whole face again, and their mean passes it.
    image = read_image(path)
    x1, y1, x2, y2 = detector.detect([image])[0][0, :4]
    mid = int((x1 + x2) / 2)
    for cut, left in ((image[:, mid:], mid), (image[:, :mid], 0)):
        (face,) = detector.detect([np.ascontiguousarray(cut)])[0]
        h, w = cut.shape[:2]
        visible = np.clip(np.array([x1 - left, y1, x2 - left, y2]), 0, [w, h, w, h])
        assert iou(face, visible) > 0.5 and face[4] >= DEFAULT_MIN_SCORE, (face, visible)


@pytest.mark.parametrize("name, side", [("biden.jpg", "right"), ("obama.jpg", "left")])
def test_a_face_mostly_outside_the_frame_is_proposed_from_the_frame_mirrored_past_its_side(detector, name, side):
    # 58 % of the face outside: the network alone proposes nothing; seeing the frame mirrored past that side
    # (SIDE_PAD), it proposes the face, and the close look (mirrored there too) passes it.
    image = read_image(DATA / "portraits" / name)
    x1, y1, x2, y2 = detector.detect([image])[0][0, :4]
    cut_at = int(round(x1 + 0.58 * (x2 - x1))) if side == "left" else int(round(x2 - 0.58 * (x2 - x1)))
    cut = np.ascontiguousarray(image[:, cut_at:] if side == "left" else image[:, :cut_at])
    assert len(YuNetDetector("cpu", mirror=False).detect([cut])[0]) == 0
    (face,) = detector.detect([cut])[0]
    left = cut_at if side == "left" else 0
    visible = np.clip(np.array([x1 - left, y1, x2 - left, y2]), 0, [cut.shape[1], cut.shape[0]] * 2)
    assert iou(face, visible) > 0.3 and face[4] >= DEFAULT_MIN_SCORE + 0.03, (face, visible)


def test_the_mirrored_sides_leave_faces_inside_the_frame_where_they_were_and_propose_no_mirror_image():
    # The pad is one cell of the coarsest level: a face away from the sides gets the network's own box.
    mirrored, alone = YuNetDetector("cpu", verify=False), YuNetDetector("cpu", verify=False, mirror=False)
    for image in (_sample("astronaut"), *(read_image(p) for p in PHOTOS[1:])):
        ours, theirs = mirrored.detect([image])[0], alone.detect([image])[0]
        inside = lambda boxes: boxes[np.minimum(boxes[:, 0], image.shape[1] - boxes[:, 2]) > 64]
        assert len(inside(ours)) == len(inside(theirs)) >= 1
        np.testing.assert_allclose(inside(ours)[:, :4], inside(theirs)[:, :4], atol=0.25)
    # A face just inside the right side: its mirror image past the side is dropped, even from 0.3.
    image = read_image(DATA / "portraits" / "biden.jpg")
    x2 = int(alone.detect([image])[0][0, 2])
    cut = np.ascontiguousarray(image[:, :x2 + 4])
    boxes = YuNetDetector("cpu", verify=False, min_score=0.3).detect([cut])[0]
    centre, quarter = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 2] - boxes[:, 0]) / 4
    assert len(boxes) and np.all((centre >= -quarter) & (centre <= cut.shape[1] + quarter)), boxes


def test_things_that_are_not_faces_cut_by_the_frames_edge_are_not_reported():
    # A box the frame's edge cuts keeps YuNet's own score (the close look cannot judge it): non-faces cut at each
    # side still stay 0.1 under the threshold.
    lenient = YuNetDetector("cpu", min_score=DEFAULT_MIN_SCORE - 0.1)
    for name in NON_FACES:
        photo = _sample(name)
        h, w = photo.shape[:2]
        cuts = [photo[:, w // 3:], photo[:, :2 * w // 3], photo[h // 3:], photo[:2 * h // 3]]
        found = lenient.detect([np.ascontiguousarray(c) for c in cuts])
        assert [len(f) for f in found] == [0] * 4, name


@pytest.mark.parametrize("name", ["dog.4244.jpg", "dog.4617.jpg"])
def test_a_dogs_face_the_frames_top_or_bottom_barely_cuts_is_looked_at_close_up_and_turned_down(detector, name):
    # Its box reaches the frame's top or bottom with a whole face's proportions: not scored as a cut face (YuNet's
    # own score, 0.83-0.84 here), but as any other, by the close look too.
    from emonet.detection.yunet import END_WHOLE

    dog = read_image(DATA / "animals" / name)
    looking = detector.advance(detector.launch([dog]))
    (candidate,) = looking.candidates[0]
    assert candidate[4] >= DEFAULT_MIN_SCORE and candidate[5] == END_WHOLE
    assert len(detector.detect([dog])[0]) == 0


def test_a_dogs_face_the_frames_top_cuts_scores_no_more_than_its_close_look_allows(detector):
    # Cut at the top, the dog's box is an END_CUT one: YuNet scores it as a face (0.89), the close look does not
    # (0.22); END_SLACK over the close look's score puts it under the tracker's hold.
    from emonet.detection.yunet import END_CUT, END_SLACK, HOLD_MARGIN, edge_rule

    dog = read_image(DATA / "animals" / "dog.4126.jpg")
    cut = np.ascontiguousarray(dog[dog.shape[0] // 3:])
    looking = detector.advance(detector.launch([cut]))
    assert len(detector.collect(looking, min_score=DEFAULT_MIN_SCORE - HOLD_MARGIN)[0]) == 0
    candidates = looking.candidates[0]
    best = int(np.argmax(candidates[:, 4]))
    yunet, close = candidates[best, 4], looking.verdicts[0][best].close
    assert candidates[best, 5] == END_CUT and yunet >= DEFAULT_MIN_SCORE and close + END_SLACK < yunet
    scored = edge_rule(candidates[best:best + 1, 5], candidates[best:best + 1, 4], np.array([close]))
    assert scored[0] == close + END_SLACK


def test_a_face_whose_box_stops_just_short_of_the_frames_top_is_at_it(detector):
    # Cut 23 % into the face at the top, the portrait's box stops 4 px under the frame's top (over AT_EDGE's band
    # of this 358-px-wide image, within NEAR_END of its height): an END_CUT box, scored by YuNet and the close
    # look. Looked at as uncut, MMOD's look (black past the edge) turned it down.
    import emonet.detection.yunet as yunet

    image = read_image(DATA / "portraits" / "obama2.jpg")
    x1, y1, x2, y2 = detector.detect([image])[0][0, :4]
    cut = np.ascontiguousarray(image[int(y1 + 0.23 * (y2 - y1)):])
    (candidate,) = detector._candidates(detector.launch([cut]), 0.5, edge=True)[0]
    assert yunet.AT_EDGE * max(cut.shape[:2]) < candidate[1] < yunet.NEAR_END * (candidate[3] - candidate[1])
    assert candidate[5] == yunet.END_CUT
    faces = detector.detect([cut])[0]
    assert len(faces) == 1 and faces[0, 4] >= DEFAULT_MIN_SCORE, faces


@pytest.mark.parametrize("path", sorted((DATA / "portraits").glob("*.jpg")), ids=lambda p: p.name)
@pytest.mark.parametrize("end", ["top", "bottom"])
def test_a_face_whose_forehead_or_mouth_the_frames_top_or_bottom_cuts_is_found(detector, path, end):
    # A fifth of the face cut at the top, a third at the bottom: an END_CUT box, whose close look, black past the
    # frame, scores a person's face high enough for END_SLACK (the eyes still inside).
    from emonet.detection.yunet import END_CUT

    image = read_image(path)
    x1, y1, x2, y2 = detector.detect([image])[0][0, :4]
    at = int(y1 + 0.2 * (y2 - y1)) if end == "top" else int(y2 - 0.35 * (y2 - y1))
    cut = np.ascontiguousarray(image[at:] if end == "top" else image[:at])
    looking = detector.advance(detector.launch([cut]))
    candidates = looking.candidates[0]
    best = int(np.argmax(candidates[:, 4]))
    assert candidates[best, 5] == END_CUT
    faces = detector.collect(looking)[0]
    assert len(faces) == 1 and faces[0, 4] >= DEFAULT_MIN_SCORE, faces
    np.testing.assert_allclose(faces[0, :4], candidates[best, :4])


@pytest.mark.parametrize("path", sorted((DATA / "portraits").glob("*.jpg")), ids=lambda p: p.name)
@pytest.mark.parametrize("end", ["top", "bottom"])
def test_a_whole_face_whose_forehead_or_chin_the_frame_cuts_is_found(detector, path, end):
    # Such a box has a whole face's proportions too: the close look passes it (MMOD would not: a cut chin).
    image = read_image(path)
    x1, y1, x2, y2 = detector.detect([image])[0][0, :4]
    at = int(y1 + 0.08 * (y2 - y1)) if end == "top" else int(y2 - 0.08 * (y2 - y1))
    cut = image[at:] if end == "top" else image[:at]
    faces = detector.detect([np.ascontiguousarray(cut)])[0]
    assert len(faces) == 1 and faces[0, 4] >= DEFAULT_MIN_SCORE, faces


def test_images_alone_together_or_as_tensors_give_the_same_faces(detector):
    photo = read_image(SAMPLE_PHOTO)
    images = [photo, np.full((300, 500, 3), 127, np.uint8), photo[::2, ::2].copy(), photo]
    together = detector.detect(images)
    for image, faces in zip(images, together):
        np.testing.assert_array_equal(detector.detect([image])[0], faces)
    as_tensors = detector.detect([torch.from_numpy(image) for image in images])
    for a, b in zip(as_tensors, together):
        np.testing.assert_array_equal(a, b)
    assert [len(f) for f in together] == [1, 0, 1, 1]


def test_an_advanced_detection_and_a_lower_hold_score_give_the_detections_of_detect(detector):
    photo = read_image(SAMPLE_PHOTO)
    scene, _ = small_faces_scene(widths=(30, 40, 50))  # the 30-px face scores under the threshold, over 0.7
    images = [photo, photo[::2, ::2].copy(), scene]
    advanced = detector.advance(detector.launch(images))
    assert detector.advance(advanced) is advanced
    for a, b in zip(detector.collect(advanced), detector.detect(images)):
        np.testing.assert_array_equal(a, b)
    held = detector.collect(detector.launch(images), min_score=0.7)
    for a, b in zip(held, YuNetDetector("cpu", min_score=0.7).detect(images)):
        np.testing.assert_array_equal(a, b)
    assert [len(f) for f in held] == [1, 1, 3] and len(detector.detect([scene])[0]) == 2


def test_a_face_is_cropped_where_blazefaces_crop_puts_it(detector):
    # YuNet's boxes are narrower and reach higher than BlazeFace's; its own crop constants (medians over many faces)
    # put the crop in the same place: on these photos, sizes within 6 % in the median and 15 % each, centres within
    # 6 % of the crop (a face in three-quarter view: its boxes differ most).
    blaze = BlazeFaceDetector("cpu")
    ratios = []
    for image in (_sample("astronaut"), _sample("camera"), _hopper(), *(read_image(p) for p in PHOTOS[1:])):
        a, b = detector.detect([image])[0][0], blaze.detect([image])[0][0]
        ma, mb = detector.crop_matrix(a, image.shape), blaze.crop_matrix(b, image.shape)
        ratios.append(ma[0, 0] / mb[0, 0])
        face = np.array([(b[0] + b[2]) / 2, (b[1] + b[3]) / 2, 1.0])
        assert np.abs(ma @ face - mb @ face).max() < 0.06 * 256, (ma @ face, mb @ face)
    assert abs(np.median(ratios) - 1) < 0.06 and max(abs(np.array(ratios) - 1)) < 0.15, ratios


def test_yunet_is_a_detector_every_tool_can_choose(tmp_path):
    import json
    import subprocess
    import sys

    assert isinstance(create_detector("yunet"), YuNetDetector)
    out = tmp_path / "faces.json"
    run = subprocess.run([sys.executable, "-m", "emonet.apps.photo", "--image", str(SAMPLE_PHOTO), "--weights", "random",
                          "--device", "cpu", "--detector", "yunet", "--json", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["detector"] == "yunet"
    (face,) = report["images"][0]["faces"]
    assert face["score"] >= DEFAULT_MIN_SCORE


def test_missing_weights_are_one_clear_error(tmp_path):
    from emonet.detection import DetectorError

    with pytest.raises(DetectorError, match="YuNet weights not found"):
        YuNetDetector("cpu", weights=tmp_path / "nope.pth")


def test_the_network_with_its_batchnorms_folded_gives_the_same_points():
    # The GPU runs the folded network: no BatchNorm left, the points of the network up to fp32 rounding (its boxes
    # are in input pixels, up to some 500 here), the network it was folded from untouched.
    from emonet.detection.yunet_net import folded

    net = YuNetDetector("cpu", verify=False).net
    photo = read_image(SAMPLE_PHOTO)[:480, :480]
    x = torch.from_numpy(np.ascontiguousarray(photo[..., ::-1])).permute(2, 0, 1)[None].float()
    fused = folded(net)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules()) == 18
    with torch.inference_mode():
        a, b = net(x), fused(x)
    np.testing.assert_allclose(b[..., 0], a[..., 0], atol=1e-5)      # scores
    np.testing.assert_allclose(b[..., 1:], a[..., 1:], atol=1e-3)    # boxes and landmarks, px
    assert a[..., 0].max() > 0.9                                     # the photo's face is among the points


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_gpu_finds_what_the_cpu_finds_eagerly_as_graphs_and_from_tensors_there():
    photo = read_image(SAMPLE_PHOTO)
    scene, _ = small_faces_scene()
    images = [photo] * 20 + [scene, photo[::2, ::2].copy()]  # more than a batch of one size, and other sizes
    cpu = YuNetDetector("cpu").detect(images)
    gpu = YuNetDetector("cuda")
    for _ in range(3):  # the graphs of a size from its second time
        for found in (gpu.detect(images), gpu.detect([torch.from_numpy(i).cuda() for i in images])):
            for a, b in zip(found, cpu):
                assert a.shape == b.shape
                np.testing.assert_allclose(a, b, atol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_photos_of_many_sizes_keep_a_few_sizes_of_graphs():
    from emonet.detection.views import FINE_SIZES_KEPT

    gpu = YuNetDetector("cuda")
    photo = read_image(SAMPLE_PHOTO)
    for side in range(200, 200 + 40 * 32, 32):
        for _ in range(2):
            gpu.detect([np.ascontiguousarray(np.resize(photo, (side, side, 3)))])
    assert len({key[1:] for key in gpu._graphs._ready}) <= FINE_SIZES_KEPT


def _moving_face(count: int) -> list:
    from emonet.io.video import Frame

    frames = []
    for k in range(count):
        image, _ = small_faces_scene(widths=(120,), places=((600 + 6 * k, 300),))
        frames.append(Frame(index=k, timestamp=k / 30, host=image))
    return frames


def _video_rows(pipeline, frames, chunks, memory=True):
    """Per frame, (face id, box, detected, score) of each face, the frames stepped in chunks of these sizes."""
    from emonet.session import VideoPipeline

    session = VideoPipeline(pipeline, detect_every=2, smooth=False, standby=False)
    if not memory:
        session.look_memory = None
    out, start = [], 0
    for size in chunks:
        chunk = frames[start:start + size]
        start += size
        flags, queued = session.detect(chunk)
        out += session.finish(session.launch(chunk, flags, queued))
    assert start == len(frames)
    return [[(f.face_id, f.box.tolist(), f.detected, f.score) for f in faces] for faces in out]


def _counting_looks(detector) -> list:
    looked = []
    launch = detector.close_look.launch
    detector.close_look.launch = lambda images, candidates, mirrored=None: (
        looked.append(sum(len(c) for c in candidates)) or launch(images, candidates, mirrored))
    return looked


def test_a_video_looks_close_up_once_at_a_face_it_follows_with_the_faces_and_ids_of_looking_every_time(
        reference_model):
    from emonet.engine import Engine, EngineConfig
    from emonet.pipeline import Pipeline

    detector = YuNetDetector("cpu")
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), detector)
    looked = _counting_looks(detector)
    frames = _moving_face(10)
    every = _video_rows(pipeline, frames, [2] * 5, memory=False)
    looks_every, looked[:] = list(looked), []
    once = _video_rows(pipeline, frames, [2] * 5)
    assert looks_every[0] >= 1 and looks_every == [looks_every[0]] * 5
    assert looked == [looks_every[0], 0, 0, 0, 0]  # the first detection's candidates, then their verdicts carried
    assert [len(faces) for faces in once] == [1] * 10
    for a, b in zip(once, every):  # the same faces, ids and boxes; a carried look's score is the first one's
        assert [(i, box, d) for i, box, d, _ in a] == [(i, box, d) for i, box, d, _ in b]
    assert all(score >= DEFAULT_MIN_SCORE for faces in once for _, _, d, score in faces if d)
    # Which candidates are looked at depends on the frames only, not on how they were chunked: the periodic
    # detection frames are the same at any chunk size (frames between are cropped from the chunk before's
    # landmarks, and a look again after a loss comes when the loss is known).
    for chunks in ([1] * 10, [3, 7], [10]):
        rows = _video_rows(pipeline, frames, chunks)
        assert rows[::2] == once[::2]


def test_a_dogs_face_turned_down_is_looked_at_again_at_every_detection_never_carried(reference_model):
    # A turned-down verdict is not carried to a later call: the dog stays turned down, and a face first seen in
    # profile would be looked at again as it turns.
    from emonet.engine import Engine, EngineConfig
    from emonet.io.video import Frame
    from emonet.pipeline import Pipeline

    detector = YuNetDetector("cpu")
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), detector)
    looked = _counting_looks(detector)
    dog = read_image(DATA / "animals" / "dog.4244.jpg")
    frames = [Frame(index=k, timestamp=k / 30, host=dog) for k in range(6)]
    rows = _video_rows(pipeline, frames, [2] * 3)
    assert looked == [1, 1, 1] and rows == [[]] * 6


def test_streams_stepped_together_and_looks_again_after_a_loss_give_each_streams_own_rows(reference_model):
    # Two streams of different faces in one scheduler, stepped together in chunks of one frame, with a look again
    # at every chunk's first frame (as after a loss, in standby or on its own): each stream's periodic detections
    # are those of its video alone in chunks of two, and the looks again leave the memory as they found it.
    from emonet.engine import Engine, EngineConfig
    from emonet.io.video import Frame
    from emonet.pipeline import Pipeline
    from emonet.scheduler import Scheduler
    from emonet.session import VideoPipeline

    detector = YuNetDetector("cpu")
    pipeline = Pipeline(Engine(reference_model, "cpu", EngineConfig(warmup=False)), detector)
    first = _moving_face(6)
    second = []
    for k in range(6):
        image, _ = small_faces_scene(widths=(90,), places=((1400 - 8 * k, 600),))
        second.append(Frame(index=k, timestamp=k / 30, host=image))
    alone = [_video_rows(pipeline, frames, [2] * 3) for frames in (first, second)]
    for standby in (False, True):
        scheduler = Scheduler(pipeline)
        sessions = [VideoPipeline(pipeline, detect_every=2, smooth=False, standby=standby, scheduler=scheduler)
                    for _ in range(2)]
        rows = [[], []]
        for k in range(6):
            for session in sessions:
                session.need_detection, session.losing = True, True  # a loss known now, or one in standby
            before = [(s.look_memory.boxes.copy(), list(s.look_memory.verdicts)) for s in sessions]
            step = scheduler.detect([(sessions[0], [first[k]]), (sessions[1], [second[k]])])
            if k % 2:  # no periodic frame: the look again changed neither memory
                for s, (boxes, verdicts) in zip(sessions, before):
                    np.testing.assert_array_equal(s.look_memory.boxes, boxes)
                    assert s.look_memory.verdicts == verdicts
            for session, settled, out in zip(sessions, scheduler.settle(scheduler.launch(step)), rows):
                out += [[(f.face_id, f.box.tolist(), f.detected, f.score) for f in faces]
                        for faces in session.results(settled)]
        for out, own in zip(rows, alone):
            assert out[::2] == own[::2], standby


def test_a_carried_look_needs_the_same_place_and_is_looked_at_again_after_look_again_detections():
    from emonet.detection.close_look import LOOK_AGAIN, LookMemory, Verdict

    box, uncut, shape = np.array([[100.0, 100, 200, 220]]), np.zeros(1), (720, 1280)
    verdict = Verdict(0.9, 0.95, face=True)
    memory = LookMemory()
    memory.hold(box, uncut, [verdict], np.zeros(1, np.int64), shape)
    carried, ages = memory.carry(box + 5, uncut, shape, set())
    assert carried == [verdict] and ages.tolist() == [1]
    assert memory.carry(box, np.array([2.0]), shape, set())[0] == [None]  # the frame's side cuts it now
    assert memory.carry(box + [90, 0, 90, 0], uncut, shape, set())[0] == [verdict]   # moved most of its size
    assert memory.carry(box + [130, 0, 130, 0], uncut, shape, set())[0] == [None]    # elsewhere
    assert memory.carry(box * [1, 1, 1.5, 1.5], uncut, shape, set())[0] == [None]    # another size
    assert memory.carry(box, uncut, (1080, 1920), set())[0] == [None]               # a frame of another size
    two = np.concatenate([box, box + [60, 0, 60, 0]])
    assert memory.carry(two, np.zeros(2), shape, set())[0] == [None, None]  # which one is it: both looked at
    tiny = np.array([[100.0, 100, 126, 126]])  # MMOD does not look under MMOD_MIN_SIDE: no verdict across it
    memory.hold(tiny, uncut, [verdict], np.zeros(1, np.int64), shape)
    assert memory.carry(tiny + 3, uncut, shape, set())[0] == [verdict]
    assert memory.carry(np.array([[100.0, 100, 130, 130]]), uncut, shape, set())[0] == [None]
    memory.hold(box, uncut, [verdict], np.array([LOOK_AGAIN - 1]), shape)
    assert memory.carry(box, uncut, shape, set())[0] == [None]              # carried long enough: looked at again
    memory.hold(box, uncut, [Verdict(0.3, 0.2, face=False)], np.zeros(1, np.int64), shape)
    assert memory.carry(box, uncut, shape, set())[0] == [None]              # turned down: looked at again
    unread = Verdict()
    memory.hold(box, uncut, [unread], np.zeros(1, np.int64), shape)
    assert memory.carry(box, uncut, shape, set())[0] == [None]              # an earlier call's look never read
    assert memory.carry(box, uncut, shape, {id(unread)})[0] == [unread]     # this call's, read with it
