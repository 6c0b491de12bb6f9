import numpy as np
import pytest
import torch

from emonet.geometry import (apply, box_to_matrix, center_scale_from_box, crop_matrix, decode_heatmaps, invert,
                             landmarks_box, landmarks_to_image, warp_crops)


def test_training_crop_convention():
    center, scale = center_scale_from_box([100, 50, 200, 170])
    assert np.allclose(center, [150, 110]) and scale == pytest.approx((100 + 120) / 220)
    m = crop_matrix(center, scale)
    # The square of side 200*scale around the centre fills the 256x256 crop exactly.
    half = 100 * scale
    corners = apply(m, np.array([[150 - half, 110 - half], [150 + half, 110 + half], [150, 110]]))
    assert np.allclose(corners, [[0, 0], [256, 256], [128, 128]])


def test_detector_convention_shifts_the_centre_up():
    center, scale = center_scale_from_box([0, 0, 100, 100], reference_scale=195, shift=0.12)
    assert np.allclose(center, [50, 50 - 12]) and scale == pytest.approx(200 / 195)


def test_inverse_round_trip():
    m = box_to_matrix([12.5, 40, 230, 300])
    pts = np.random.default_rng(0).uniform(0, 500, (68, 2))
    assert np.allclose(apply(invert(m), apply(m, pts)), pts)


def test_known_warp_moves_a_marked_pixel_where_the_matrix_says():
    image = np.zeros((300, 400, 3), np.uint8)
    image[150, 220] = 255  # one bright pixel
    m = box_to_matrix([150, 100, 290, 210])
    crop = warp_crops(image, [m])[0]
    y, x = np.unravel_index(crop[..., 0].argmax(), crop.shape[:2])
    assert np.allclose([x, y], apply(m, [220, 150]), atol=1.0)


def test_faces_partly_outside_the_image_get_a_zero_border():
    image = np.full((100, 100, 3), 200, np.uint8)
    crop = warp_crops(image, [box_to_matrix([-60, -60, 40, 40])])[0]
    assert crop[0, 0].tolist() == [0, 0, 0] and crop[-1, -1].tolist() == [200, 200, 200]


def _heatmaps(points_64, n=68, sigma=1.0, skew=None):
    yy, xx = torch.meshgrid(torch.arange(64.0), torch.arange(64.0), indexing="ij")
    maps = torch.zeros(1, n, 64, 64)
    for i, (x, y) in enumerate(points_64):
        maps[0, i] = torch.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma ** 2))
    return maps


def test_landmark_decoding_moves_a_quarter_pixel_towards_the_larger_neighbour():
    # Peaks between grid points: the arg-max is the nearest cell, the larger neighbour gives the side.
    pts = [(10.3, 20.0), (30.0, 40.3), (50.0, 12.0), (20.7, 33.7)] + [(32.0, 32.0)] * 64
    got = decode_heatmaps(_heatmaps(pts))[0]
    assert np.allclose(got[0], [10.25 * 4, 20 * 4])
    assert np.allclose(got[1], [30 * 4, 40.25 * 4])
    assert np.allclose(got[2], [50 * 4, 12 * 4])        # exactly on a cell: no shift
    assert np.allclose(got[3], [20.75 * 4, 33.75 * 4])  # nearest cell (21, 34), shifted up-left


def test_landmarks_go_back_to_image_coordinates():
    m = box_to_matrix([100, 80, 260, 250])
    image_pts = np.array([[150.0, 120.0], [200.0, 200.0]])
    crop_pts = apply(m, image_pts) / 4.0  # heatmap cells
    maps = _heatmaps([tuple(p) for p in crop_pts] + [(32.0, 32.0)] * 66)
    back = landmarks_to_image(maps, [m])[0][:2]
    # Quantised to a quarter heatmap cell = 1 crop pixel, i.e. 200*scale/256 image pixels.
    assert np.abs(back - image_pts).max() < 1.5


def test_points_go_back_for_many_faces_at_once_with_the_bits_of_one_face_at_a_time():
    import cv2
    from emonet.geometry import crop_to_image
    rng = np.random.default_rng(4)
    singular = [np.array([[2.0, 4.0, 1.0], [1.0, 2.0, -3.0]]), np.array([[-1.0, 0.0, 5.0], [0.0, 0.0, 2.0]])]
    for crops, points_each, dtype in ((1, 68, np.float64), (3, 68, np.float32), (10, 5, np.float64), (20, 1, np.float64)):
        matrices = [box_to_matrix(np.r_[xy, xy + rng.uniform(5, 400, 2)]) for xy in rng.uniform(-50, 1900, (crops, 2))]
        matrices += [rng.normal(0, 3, (2, 3)) for _ in range(crops - 1)] + singular[:crops - 1]  # any affine
        points = rng.normal(128, 90, (len(matrices), points_each, 2)).astype(dtype)
        one_by_one = np.stack([apply(cv2.invertAffineTransform(m), p) for m, p in zip(matrices, points)])  # each alone
        got = crop_to_image(matrices, points)
        assert got.shape == points.shape and got.tobytes() == one_by_one.tobytes()  # singular ones' signed zeros too
    assert crop_to_image([], np.zeros((0, 68, 2))).shape == (0, 68, 2)
    with pytest.raises(ValueError, match="2 crop matrices for 3 faces"):
        crop_to_image(matrices[:2], np.zeros((3, 68, 2)))


def test_landmarks_box():
    assert landmarks_box(np.array([[3, 4], [10, 1], [5, 9]])).tolist() == [3, 1, 10, 9]


def test_landmarks_boxes_are_each_faces_box():
    from emonet.geometry import landmarks_boxes
    pts = np.random.default_rng(3).normal(500, 200, (9, 68, 2)).astype(np.float32)
    pts[2, 7, 1] = np.nan  # a NaN landmark makes its coordinate's bounds NaN, as numpy's min and max do
    got = landmarks_boxes(pts)
    want = [[p[:, 0].min(), p[:, 1].min(), p[:, 0].max(), p[:, 1].max()] for p in pts.astype(np.float64)]
    assert got.dtype == np.float64 and got.shape == (9, 4)
    np.testing.assert_array_equal(got, np.array(want))
    assert np.isnan(got[2, [1, 3]]).all() and not np.isnan(got[2, [0, 2]]).any()
    assert landmarks_boxes(np.zeros((0, 68, 2))).shape == (0, 4)


def test_device_warp_equals_opencv_warp():
    from emonet.geometry import to_tensor, warp_crops_torch
    image = (np.random.default_rng(1).random((200, 300, 3)) * 255).astype(np.uint8)
    mats = [box_to_matrix([50, 40, 150, 160]), box_to_matrix([-30, 100, 90, 260])]  # one partly outside
    ref = to_tensor(warp_crops(image, mats)).int()
    got = warp_crops_torch(torch.from_numpy(image).permute(2, 0, 1), mats).int()
    assert (ref - got).abs().max() <= 1  # rounding only


def test_crop_faces_takes_the_frame_as_an_array_or_a_tensor():
    from emonet.geometry import crop_faces
    image = (np.random.default_rng(2).random((120, 160, 3)) * 255).astype(np.uint8)
    mats = [box_to_matrix([20, 10, 90, 100])]
    a = crop_faces(image, mats, torch.device("cpu"))
    b = crop_faces(torch.from_numpy(image), mats, torch.device("cpu"))
    assert a.shape == (1, 3, 256, 256) and a.dtype == torch.uint8 and torch.equal(a, b)


def test_crops_from_a_stack_of_frames_equal_crops_frame_by_frame():
    from emonet.geometry import crop_frames, warp_crops_torch
    rng = np.random.default_rng(3)
    frames = [(rng.random((120, 160, 3)) * 255).astype(np.uint8) for _ in range(3)]
    wanted = [(2, box_to_matrix([20, 10, 90, 100])), (0, box_to_matrix([40, 30, 120, 110])),
              (2, box_to_matrix([-10, 0, 60, 70]))]
    stack = torch.stack([torch.from_numpy(f) for f in frames]).permute(0, 3, 1, 2)
    together = warp_crops_torch(stack, [m for _, m in wanted], frame_index=[i for i, _ in wanted])
    for k, (i, m) in enumerate(wanted):
        alone = warp_crops_torch(torch.from_numpy(frames[i]).permute(2, 0, 1), [m])[0]
        assert torch.equal(together[k], alone)
    one_each = [box_to_matrix([20 + 5 * i, 10, 90, 100]) for i in range(3)]  # frame i's crop: no gather
    two_each = [(i, box_to_matrix([10 + 7 * i + 3 * j, 5 * j, 100 - j, 110])) for i in range(3) for j in range(2)]
    in_order = warp_crops_torch(stack, one_each, frame_index=[0, 1, 2])
    for i, m in enumerate(one_each):
        assert torch.equal(in_order[i], warp_crops_torch(torch.from_numpy(frames[i]).permute(2, 0, 1), [m])[0])
    crowded = [(1, box_to_matrix([5 * j, 3 * j, 80 + j, 90])) for j in range(6)] + [(0, one_each[0])]
    # Frame by frame and in any order (each frame's crops side by side, on these frames), a frame short, or one
    # frame holding most (a copy of the frame for each crop): the same bits either way.
    for wanted_here in (two_each, two_each[::-1], two_each[1:], crowded):
        together_here = warp_crops_torch(stack, [m for _, m in wanted_here], frame_index=[i for i, _ in wanted_here])
        assert together_here.shape == (len(wanted_here), 3, 256, 256)
        for k, (i, m) in enumerate(wanted_here):
            assert torch.equal(together_here[k], warp_crops_torch(torch.from_numpy(frames[i]).permute(2, 0, 1), [m])[0])
    on_cpu = crop_frames(frames, wanted, torch.device("cpu"))  # the CPU path: OpenCV, frame by frame
    assert on_cpu.shape == (3, 3, 256, 256) and (on_cpu.int() - together.int()).abs().max() <= 1
    assert crop_frames(frames, [], torch.device("cpu")).shape == (0, 3, 256, 256)
