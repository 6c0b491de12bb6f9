"""The video canvas: frames, marks and panel drawn with torch, handed out as I420."""
import cv2
import numpy as np
import torch

from emonet.drawing import PALETTE, VideoCanvas, coded_size, panel_width
from emonet.results import CROP_SIZE, FaceResult

NAMES = ["Neutral", "Happy", "Sad", "Surprise", "Fear", "Disgust", "Anger", "Contempt"]
H, W = 360, 640


def gradient(shift: int = 0) -> np.ndarray:
    """A smooth RGB test frame (no edge for chroma subsampling to blur)."""
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([(x * 255 // W + shift) % 256, y * 255 // H, np.full_like(x, 128)], -1).astype(np.uint8)


def face(box=(100.0, 60.0, 340.0, 300.0), face_id=0, expression=1) -> FaceResult:
    x1, y1, x2, y2 = box
    s = CROP_SIZE / (x2 - x1)
    matrix = np.array([[s, 0.0, -x1 * s], [0.0, s, -y1 * s]])
    landmarks = np.array([[150.0, 150.0], [250.0, 200.0]] + [[200.0, 250.0]] * 66)
    return FaceResult(0, face_id, np.array(box), 0.9, True, expression, np.full(8, 1 / 8), 0.5, -0.5, landmarks, matrix)


def planes(frame: torch.Tensor, size) -> tuple[np.ndarray, np.ndarray]:
    """The Y plane and the frame back in RGB (OpenCV's conversion)."""
    w, h = size
    yuv = frame.numpy().reshape(h * 3 // 2, w)
    return yuv[:h], cv2.cvtColor(yuv, cv2.COLOR_YUV2RGB_I420)


def luma(rgb) -> float:
    r, g, b = rgb
    return 16 + (0.299 * r + 0.587 * g + 0.114 * b) * 219 / 255


def test_frames_and_panel_convert_as_opencv_does():
    canvas = VideoCanvas(NAMES)
    image = gradient()
    out = canvas.draw([torch.from_numpy(image)], [[]], [[]])
    size = canvas.size
    assert size == coded_size(H, W) == (W + panel_width(H), H) and out.shape == (1, size[0] * size[1] * 3 // 2)
    y, rgb = planes(out[0], size)
    expected = cv2.cvtColor(image, cv2.COLOR_RGB2YUV_I420)
    top = slice(0, H - 40)  # above the "no face found" caption
    assert np.abs(y[top, :W].astype(int) - expected[:H][top]).max() <= 1
    assert np.abs(rgb[top, :W].astype(int) - image[top]).max() <= 4
    assert np.abs(rgb[:20, W + 2:W + 20].astype(int) - 24).max() <= 2  # the panel's grey background


def test_marks_land_on_the_face_and_the_panel_shows_its_crop():
    canvas = VideoCanvas(NAMES)
    black = np.zeros((H, W, 3), np.uint8)
    f = face()
    out = canvas.draw([torch.from_numpy(black)], [[(f, [(0.0, 0.0), (0.5, -0.5)])]], [[(255, 0, 0)]])
    y, _ = planes(out[0], canvas.size)
    assert abs(y[150, 100] - luma(PALETTE[1])) <= 2 and abs(y[200, 340] - luma(PALETTE[1])) <= 2  # box sides
    assert abs(y[200, 250] - luma((0, 255, 255))) <= 2  # a landmark
    assert abs(y[150, 200] - 16) <= 1  # inside the box: the frame's black

    # The panel's crop is the face's square, resized: compare with OpenCV's warp of the same matrix.
    image = gradient()
    out = canvas.draw([torch.from_numpy(image)], [[(f, [])]], [[(255, 0, 0)]])
    side = panel_width(H) if panel_width(H) <= H // 2 else H // 2
    matrix = f.matrix * (side / CROP_SIZE)
    expected = cv2.warpAffine(image, matrix, (side, side), flags=cv2.INTER_LINEAR)
    _, rgb = planes(out[0], canvas.size)
    x0 = W + (panel_width(H) - side) // 2
    crop = rgb[:side, x0:x0 + side].astype(int)
    assert np.median(np.abs(crop - expected)) <= 3  # landmark dots aside, the same pixels


def test_a_chunk_draws_each_frame_as_if_alone():
    frames = [gradient(0), gradient(40), gradient(80)]
    faces = [[(face(), [(0.1, 0.1)])], [], [(face((300.0, 20.0, 500.0, 220.0), 2, 6), [(0.0, 0.0), (-0.3, 0.4)]),
                                          (face((320.0, 40.0, 520.0, 240.0), 3, 3), [])]]
    colors = [[(255, 0, 0)], [], [(0, 255, 0), (0, 0, 255)]]
    together = VideoCanvas(NAMES, banner="untrained").draw([torch.from_numpy(f) for f in frames], faces, colors)
    alone = VideoCanvas(NAMES, banner="untrained")
    for b in range(3):
        assert torch.equal(together[b], alone.draw([torch.from_numpy(frames[b])], [faces[b]], [colors[b]])[0])
    assert not torch.equal(together[0], together[1])


def test_marks_the_frames_edge_cuts_do_not_wrap_to_the_next_row():
    # A face over the left edge, its box's side and landmark dots partly outside: a pixel left of column 0
    # would land at the end of the row above (the panel's right edge, its grey) were it not cut.
    canvas = VideoCanvas(NAMES)
    f = face((-60.0, 60.0, 180.0, 300.0))
    f.landmarks[:] = np.stack([np.linspace(-4.0, 1.0, 68), np.linspace(80.0, 280.0, 68)], 1)
    out = canvas.draw([torch.from_numpy(np.zeros((H, W, 3), np.uint8))], [[(f, [])]], [[(255, 0, 0)]])
    y, _ = planes(out[0], canvas.size)
    assert abs(y[150, 0] - luma((0, 255, 255))) <= 2  # the dots inside the frame are drawn
    grey = luma((24, 24, 24))
    assert np.abs(y[50:H - 50, -3:].astype(float) - grey).max() <= 1


def test_a_frame_of_another_size_is_resized_with_its_faces():
    canvas = VideoCanvas(NAMES)
    canvas.draw([torch.from_numpy(np.zeros((H, W, 3), np.uint8))], [[]], [[]])
    small = np.zeros((H // 2, W // 2, 3), np.uint8)
    f = face((50.0, 30.0, 170.0, 150.0))
    out = canvas.draw([torch.from_numpy(small)], [[(f, [])]], [[(255, 0, 0)]])
    assert canvas.resized and out.shape[1] == canvas.size[0] * canvas.size[1] * 3 // 2
    y, _ = planes(out[0], canvas.size)
    assert abs(y[150, 100] - luma(PALETTE[1])) <= 2  # the box's left side, at twice the size


def test_the_gpu_draws_what_the_cpu_draws():
    import pytest
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    frames = [gradient(0), gradient(60)]
    cpu = VideoCanvas(NAMES, banner="untrained")
    gpu = VideoCanvas(NAMES, banner="untrained", device=torch.device("cuda"))
    # Chunk after chunk on one canvas: its uploads go through staging buffers that are taken in turn and grow.
    for k in range(4):
        faces = [[(face(box=(100.0 + 20 * k, 60.0, 340.0, 300.0), expression=k),
                   [(0.1, 0.1), (0.3, -0.2 + 0.1 * k)])] * (1 + k % 2), []]
        colors = [[(255, 0, 0)] * (1 + k % 2), []]
        on_cpu = cpu.draw([torch.from_numpy(f) for f in frames], faces, colors)
        on_gpu = gpu.draw([torch.from_numpy(f).cuda() for f in frames], faces, colors)
        # The crop's bilinear sampling may round a level differently; every mark and the rest are the same.
        assert (on_gpu.cpu().int() - on_cpu.int()).abs().max() <= 1, k
