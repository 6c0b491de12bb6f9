import numpy as np
import pytest

from emonet.geometry import box_to_matrix, landmarks_box
from emonet.tracking import SMOOTHING_WEIGHTS, Smoother, Tracker, iou


def test_smoothing_is_normalised_over_the_frames_seen():
    s = Smoother()
    a, b = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    assert np.allclose(s(a), a)  # the first frame is not dragged towards zero
    assert np.allclose(s(b), (0.25 * a + 0.4 * b) / 0.65)
    for _ in range(10):
        out = s(b)
    assert np.allclose(out, b)
    s2 = Smoother()
    seq = [np.array([float(i)]) for i in range(7)]
    for x in seq:
        out = s2(x)
    assert out[0] == pytest.approx(np.dot(SMOOTHING_WEIGHTS, [2, 3, 4, 5, 6]) / SMOOTHING_WEIGHTS.sum())


def test_ids_stay_with_moving_faces_and_are_never_reused():
    tracker = Tracker()
    ids = []
    for step in range(5):
        dets = np.array([[100 + 8 * step, 100, 160 + 8 * step, 170, 0.9],
                         [400 - 8 * step, 120, 450 - 8 * step, 180, 0.8]])
        ids.append([t.id for t in tracker.update(dets)])
    assert ids == [[0, 1]] * 5
    tracker.update(np.zeros((0, 5)))               # both missed once: remembered, not active
    assert tracker.active == [] and len(tracker.tracks) == 2
    tracker.update(np.zeros((0, 5)))               # missed twice: dropped
    assert tracker.tracks == []
    assert [t.id for t in tracker.update(np.array([[100, 100, 160, 170, 0.9]]))] == [2]


def test_a_one_frame_detector_miss_keeps_the_id():
    tracker = Tracker()
    face = np.array([[10, 10, 60, 70, 0.9]])
    assert tracker.update(face)[0].id == 0
    tracker.update(np.zeros((0, 5)))
    assert tracker.update(face + [3, 0, 3, 0, 0])[0].id == 0


def test_a_small_face_the_detector_did_not_look_for_is_followed_on_not_missed():
    # A whole-frame-only detection (a video's frames between two looks for small faces) cannot see faces under
    # its limit: those it did not find stay followed with their landmarks, and a small face it found that matches
    # none starts no track; a larger face it missed is a miss.
    tracker = Tracker(max_missed=0)
    small, large = np.array([10, 10, 40, 45, 0.9]), np.array([100, 100, 300, 320, 0.9])
    tracker.update(np.stack([small, large]))
    for track in tracker.tracks:
        track.set_landmarks(np.random.default_rng(track.id).uniform(track.box[0], track.box[2], (68, 2)), 0)
    moved = small + [60, 0, 60, 0, 0]  # found all the same, too far to match: it may be the followed face
    followed = tracker.update(moved[None], frame=5, unseen_below=100.0)
    assert [t.id for t in followed] == [0] and followed[0].crop_box is not None and followed[0].det_frame == 0
    assert tracker.update(np.zeros((0, 5)), frame=10) == []  # looked for and not found: missed


def test_a_small_face_missed_once_waits_through_frames_that_did_not_look_for_it():
    # Missed on a frame that looked for small faces (a one-frame miss keeps the id), then frames that did not
    # look: not counted against it; found on the next frame that looks, it keeps its id.
    tracker = Tracker()
    small = np.array([[10, 10, 40, 45, 0.9]])
    tracker.update(small, frame=0)
    assert tracker.update(np.zeros((0, 5)), frame=15) == []  # missed once: not followed, remembered
    for frame in (20, 25):
        assert tracker.update(np.zeros((0, 5)), frame=frame, unseen_below=100.0) == []
    assert [t.id for t in tracker.update(small + [2, 0, 2, 0, 0], frame=30)] == [0]


def test_iou():
    assert iou(np.array([0, 0, 10, 10]), np.array([5, 0, 15, 10])) == pytest.approx(50 / 150)
    assert iou(np.array([0, 0, 1, 1]), np.array([2, 2, 3, 3])) == 0.0


def test_crops_come_from_whichever_is_newer_the_landmarks_or_the_detector_box():
    tracker = Tracker()
    (track,) = tracker.update(np.array([[100.0, 100.0, 200.0, 220.0, 0.9]]))
    assert track.crop_matrix() is None  # nothing but the detector box yet
    landmarks = np.random.default_rng(0).uniform(110, 190, (68, 2))
    track.set_landmarks(landmarks)
    assert np.allclose(track.crop_matrix(), box_to_matrix(landmarks_box(landmarks)))
    tracker.update(np.array([[104.0, 100.0, 204.0, 220.0, 0.9]]))  # seen again: the box is newer now
    assert track.crop_matrix() is None
    track.set_landmarks(landmarks + 4)
    assert np.allclose(track.crop_matrix(), box_to_matrix(landmarks_box(landmarks + 4)))


def test_a_tracked_box_stays_bounded_when_the_landmarks_go_wrong():
    from emonet.tracking import MAX_SCALE, MAX_SPEED, bound_box

    tracker = Tracker()
    det = np.array([300.0, 200.0, 630.0, 560.0])  # a 330 x 360 face, detected at frame 10
    (track,) = tracker.update(np.array([[*det, 0.95]]), frame=10)
    rng = np.random.default_rng(1)
    size = ((det[2] - det[0]) + (det[3] - det[1])) / 2
    flagged = []
    for k in range(1, 40):
        # Landmarks that balloon (the box grows 15 % a frame) and wander off to one side.
        grow = 1.15 ** k
        centre = np.array([465.0 + 40 * k, 380.0])
        points = centre + rng.uniform(-1, 1, (68, 2)) * (size / 2) * grow
        flagged.append(not track.set_landmarks(points, frame=10 + k))
        box = track.crop_box
        w, h = box[2] - box[0], box[3] - box[1]
        assert (w + h) / 2 <= MAX_SCALE * size + 1e-6 and (w + h) / 2 >= size / MAX_SCALE - 1e-6
        shift = np.hypot(*((box[:2] + box[2:]) / 2 - (det[:2] + det[2:]) / 2))
        assert shift <= MAX_SPEED * size * k + 1e-6
        assert np.allclose(track.crop_matrix(), box_to_matrix(box))
    assert flagged[0] is False and all(flagged[5:])  # small drift passes; the balloon is caught: re-detect
    # Landmarks within the bounds are taken as they are.
    good = landmarks_box(np.array([[310.0, 210.0], [620.0, 550.0]]))
    kept, ok = bound_box(good, det, 1)
    assert ok and np.array_equal(kept, good)
    # The speed bound counts frames since the detection (at least one): 1.5 frames' worth of movement is too far
    # one frame later (or on the detection's own frame), within bounds two frames later.
    moved = det + [1.5 * MAX_SPEED * size, 0, 1.5 * MAX_SPEED * size, 0]
    assert [bound_box(moved, det, k)[1] for k in (0, 1, 2)] == [False, False, True]


def test_many_faces_held_at_once_are_each_held_as_alone():
    # The video tool hands a chunk's landmarks to its tracks in one call; each face must come out as it would
    # alone, whatever its neighbours: within bounds, too large, too small, too far, and the same track twice.
    from emonet.tracking import bound_box, set_many_landmarks

    rng = np.random.default_rng(3)
    tracker = Tracker()
    tracks = tracker.update(np.array([[100.0, 100.0, 200.0, 220.0, 0.9], [400.0, 50.0, 520.0, 160.0, 0.9]]), frame=4)
    base = rng.uniform(0, 1, (68, 2))
    base[:2] = [[0, 0], [1, 1]]  # each face's box: x, y, x + w, y + h
    faces = [(100, 100, 100, 120), (60, 60, 190, 220), (130, 140, 40, 40), (700, 50, 120, 110),
             (105, 102, 100, 120), (410, 60, 120, 110)]
    landmarks = np.stack([np.array([x, y]) + base * [w, h] for x, y, w, h in faces])
    owners = [tracks[0], tracks[0], tracks[0], tracks[1], tracks[0], tracks[1]]
    frames = [2, 5, 6, 6, None, 7]
    boxes, ok = set_many_landmarks(owners, landmarks, frames)
    alone = [bound_box(landmarks_box(points), t.det_box, 0 if f is None else f - t.det_frame)
             for t, points, f in zip(owners, landmarks, frames)]
    assert [bool(o) for o in ok] == [b for _, b in alone] == [True, False, False, False, True, True]
    assert all(np.array_equal(box, a) for box, (a, _) in zip(boxes, alone))
    # A track given twice keeps its last face's landmarks and box.
    assert tracks[0].landmarks is not None and np.array_equal(tracks[0].landmarks, landmarks[4])
    assert np.array_equal(tracks[0].crop_box, boxes[4]) and np.array_equal(tracks[1].crop_box, boxes[5])


def test_a_redetection_resets_the_bounds_to_the_new_box():
    tracker = Tracker()
    (track,) = tracker.update(np.array([[100.0, 100.0, 200.0, 200.0, 0.9]]), frame=0)
    far = np.array([[400.0, 100.0], [500.0, 200.0]])
    assert not track.set_landmarks(far, frame=1)  # 3 face sizes in one frame: implausible
    (moved,) = tracker.update(np.array([[380.0, 100.0, 480.0, 200.0, 0.9]]), frame=2)  # the detector finds it
    assert moved.set_landmarks(far, frame=3)  # near the new detection: within bounds


def test_a_followed_face_is_held_under_the_threshold_a_new_face_needs():
    tracker = Tracker()
    face = np.array([[10.0, 10.0, 60.0, 70.0, 0.75]])
    assert tracker.update(face, frame=0, start_score=0.81) == []  # too weak to start a track
    (track,) = tracker.update(face + [0, 0, 0, 0, 0.15], frame=5, start_score=0.81)
    # Later the face dips under the threshold (0.75) beside something new at 0.78: the face is held, nothing starts.
    dets = np.array([[12.0, 10.0, 62.0, 70.0, 0.75], [200.0, 200.0, 250.0, 260.0, 0.78]])
    (held,) = tracker.update(dets, frame=10, start_score=0.81)
    assert held.id == track.id and held.score == 0.75 and held.det_frame == 10 and len(tracker.tracks) == 1


def _scalar_iou(a, b):
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


class _PairByPair(Tracker):
    """The matching rule pair by pair, as Python scalars: what Tracker's matrix of affinities must reproduce."""

    def _affinities(self, detections):
        def one(track, det):
            boxes = [b for b in (track.det_box, track.box,
                                 landmarks_box(track.landmarks) if track.landmarks is not None else None)
                     if b is not None]
            overlap = max(_scalar_iou(b, det) for b in boxes)
            if overlap >= self.iou_threshold:
                return 1.0 + overlap
            ref = track.det_box if track.det_box is not None else track.box
            size = max(ref[2] - ref[0], ref[3] - ref[1], det[2] - det[0], det[3] - det[1], 1e-6)
            shift = np.hypot((ref[0] + ref[2] - det[0] - det[2]) / 2, (ref[1] + ref[3] - det[1] - det[3]) / 2) / size
            return max(0.0, 1.0 - shift / self.max_shift) if shift < self.max_shift else 0.0
        return np.array([[one(t, d[:4]) for d in detections] for t in self.tracks]).reshape(
            len(self.tracks), len(detections))


def test_the_affinities_and_matches_are_those_of_the_rule_pair_by_pair_bit_for_bit():
    # Faces moving, jumping, appearing and leaving; tracks whose box is their landmarks' (not their detection's),
    # some with no detection box, landmarks broken (NaN) or missing; detections degenerate, inverted or NaN. Every
    # frame: each affinity the same bits, and the tracks (ids, boxes, scores) the same.
    rng = np.random.default_rng(0)
    for _ in range(60):
        fast, slow = Tracker(), _PairByPair()
        faces = [np.r_[rng.uniform(0, 600, 2), 0, 0] for _ in range(rng.integers(1, 7))]
        for f in faces:
            f[2:] = f[:2] + rng.uniform(0.0 if rng.random() < 0.05 else 10, 150, 2)
        for frame in range(12):
            dets = [np.r_[f + rng.normal(0, rng.choice([1.0, 15.0, 60.0]), 4), rng.uniform(0.5, 1)]
                    for f in faces if rng.random() < 0.85]
            for f in faces[:2]:  # a box about as far off-centre but far larger: matched by nearness, not overlap
                centre, half = (f[:2] + f[2:]) / 2 + rng.normal(0, 10, 2), (f[2:] - f[:2]) * rng.uniform(1.5, 2.5) / 2
                dets.append(np.r_[centre - half, centre + half, rng.uniform(0.5, 1)])
            odd = rng.random()
            if odd < 0.1 and dets:
                dets[0][:4] = dets[0][[2, 3, 0, 1]]  # inverted
            elif odd < 0.15 and dets:
                dets[0][2] = np.nan
            dets = np.array(dets).reshape(-1, 5)
            assert fast._affinities(dets).tobytes() == slow._affinities(dets).tobytes()
            got, want = fast.update(dets, frame), slow.update(dets, frame)
            assert [(t.id, t.box.tolist(), t.score) for t in got] == [(t.id, t.box.tolist(), t.score) for t in want]
            for tracker in (fast, slow):  # the same changes to both
                marks = np.random.default_rng(frame)
                for t in tracker.tracks:
                    points = t.box[:2] + marks.uniform(0, 1, (68, 2)) * (t.box[2:] - t.box[:2] + 1)
                    if marks.random() < 0.05:
                        points[0, 0] = np.nan
                    t.landmarks = points.astype(np.float32) if marks.random() < 0.7 else None
                    if marks.random() < 0.5:  # followed from its landmarks: its box is theirs
                        t.box = t.box + marks.normal(0, 8, 4)
                    if marks.random() < 0.1:
                        t.det_box = None
