"""The drawing process, and the same drawing in this process: chunks of frames with their faces in,
annotated videos out, the same frames as the canvas draws; videos that overlap; a process that ends is one
clear error. On the CPU here, on the GPU (through the frame ring) where there is one."""
import os
import time

import av
import numpy as np
import pytest
import torch

from emonet.drawing import PALETTE
from emonet.drawing.canvas import VideoCanvas
from emonet.drawing.process import DrawingProcess, LocalDrawing
from emonet.errors import HelperError, OutputError

from .test_canvas import NAMES, face
from .test_video import probe, top_level_boxes

pytestmark = pytest.mark.slow  # end-to-end: the tools in processes of their own

DEVICE = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def frames(n: int, start: int = 0, shape=(240, 320)) -> list[torch.Tensor]:
    """Frames whose brightness rises by 7 a frame (a swap or a repeat shows)."""
    return [torch.full((*shape, 3), 20 + 7 * ((start + i) % 30), dtype=torch.uint8, device=DEVICE) for i in range(n)]


def chunk_faces(n: int) -> tuple[list, list]:
    faces = [[(face((40.0 + i, 30.0, 160.0 + i, 150.0)), [(0.1 * (i % 5), -0.2)])] if i % 3 else [] for i in range(n)]
    return faces, [[PALETTE[0]] * len(f) for f in faces]


def decoded(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="yuv420p") for f in container.decode(video=0)]


def planned_apart(device) -> LocalDrawing:
    """Drawn here, planned in the planning process (up before the first chunk)."""
    drawing = LocalDrawing(device, plan_apart=True)
    _wait_for(lambda: drawing.plans_apart)
    return drawing


def planned_here(device) -> LocalDrawing:
    return LocalDrawing(device, plan_apart=False)


@pytest.fixture(params=[DrawingProcess, planned_here, planned_apart])
def drawing(request):
    drawing = request.param(DEVICE)
    yield drawing
    drawing.close()


@pytest.fixture
def process():
    process = DrawingProcess(DEVICE)
    yield process
    process.close()


# The frame size said ahead (a frame of its size drawn, the ring made at open), also a wrong one, or none.
@pytest.mark.parametrize("ahead", [None, (240, 320), (120, 160)])
def test_the_video_has_every_frame_drawn_as_the_canvas_draws_it(drawing, tmp_path, ahead):
    if ahead is not None and isinstance(drawing, DrawingProcess):
        drawing.warm(ahead)
    video = drawing.open(tmp_path / "a.mp4", 25.0, NAMES, codec="h264", frame=ahead)
    here = VideoCanvas(NAMES, device=DEVICE)
    expected = []
    for start, n in ((0, 8), (8, 8), (16, 5)):  # the last chunk shorter, as at a video's end
        images, (faces, colors) = frames(n, start), chunk_faces(n)
        drawing.put(video, images, list(range(start, start + n)), faces, colors)
        expected += [f.cpu().numpy() for f in here.draw(images, faces, colors)]
    drawn = drawing.finish(video)
    assert drawn.path == tmp_path / "a.mp4" and not drawn.resized
    info = probe(drawn.path)
    assert (info["codec"], info["pix_fmt"], info["frames"]) == ("h264", "yuv420p", 21)
    assert top_level_boxes(drawn.path).index("moov") < top_level_boxes(drawn.path).index("mdat")
    # Frame for frame what the canvas draws (up to H.264's loss: each frame is nearest its own).
    out = [f.reshape(-1).astype(int) for f in decoded(drawn.path)]
    for i, frame in enumerate(out):
        errors = [np.abs(frame - e.astype(int)).mean() for e in expected]
        assert int(np.argmin(errors)) == i and errors[i] < 2.0
    assert set(drawn.seconds) == {"plan", "plan wait", "draw", "to encoders", "encoder wait", "encode"}
    assert drawn.cpu["encoding"] > 0 and drawn.apart == isinstance(drawing, DrawingProcess)
    assert drawn.cpu.get("drawing", 1.0) > 0  # apart: its own CPU time (else it is this process's)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]


def test_the_next_video_may_open_before_the_last_one_is_finished(drawing, tmp_path):
    a = drawing.open(tmp_path / "a.mp4", 25.0, NAMES)
    drawing.put(a, frames(6), list(range(6)), *chunk_faces(6))
    b = drawing.open(tmp_path / "b.mp4", 30.0, NAMES)  # a's final frames come after b opened
    drawing.put(b, frames(4, shape=(120, 160)), list(range(4)), *chunk_faces(4))
    drawing.put(a, frames(3, 6), [6, 7, 8], *chunk_faces(3))
    assert drawing.finish(a).path == tmp_path / "a.mp4"
    drawing.put(b, frames(2, 4, shape=(120, 160)), [4, 5], *chunk_faces(2))
    assert drawing.finish(b).path == tmp_path / "b.mp4"
    assert (probe(tmp_path / "a.mp4")["frames"], probe(tmp_path / "b.mp4")["frames"]) == (9, 6)
    assert probe(tmp_path / "b.mp4")["width"] < probe(tmp_path / "a.mp4")["width"]


def test_frames_of_another_size_are_resized_to_the_first(drawing, tmp_path):
    video = drawing.open(tmp_path / "a.mp4", 25.0, NAMES)
    drawing.put(video, frames(3) + frames(2, shape=(120, 160)), list(range(5)), *chunk_faces(5))
    drawn = drawing.finish(video)
    assert drawn.resized and probe(drawn.path)["frames"] == 5


def test_closing_finishes_the_videos_still_open(drawing, tmp_path):
    video = drawing.open(tmp_path / "a.mp4", 25.0, NAMES)
    for start in (0, 6):  # planned apart: the second chunk still waits to be drawn
        drawing.put(video, frames(6, start), list(range(start, start + 6)), *chunk_faces(6))
    drawing.close()
    assert probe(tmp_path / "a.mp4")["frames"] == 12


def test_a_drawing_process_that_ends_is_one_clear_error(process, tmp_path):
    video = process.open(tmp_path / "a.mp4", 25.0, NAMES)
    process.put(video, frames(4), list(range(4)), *chunk_faces(4))
    process._helper.proc.kill()
    process._helper.proc.wait()
    with pytest.raises(HelperError, match="^writing the annotated video failed: the drawing process ended"):
        for start in range(4, 400, 4):  # the end is seen once the listener reads it
            process.put(video, frames(4, start), list(range(start, start + 4)), *chunk_faces(4))
    with pytest.raises(HelperError, match="drawing process ended"):
        process.finish(video)


def test_a_failing_encoder_is_one_clear_error(drawing, tmp_path):
    video = drawing.open(tmp_path / "gone" / "a.mp4", 25.0, NAMES)  # a folder that is not there
    with pytest.raises(OutputError, match="^writing the annotated video failed: "):
        for start in range(0, 400, 4):  # the encoders' failure is seen once it is read
            drawing.put(video, frames(4, start), list(range(start, start + 4)), *chunk_faces(4))
    with pytest.raises(OutputError, match="^writing the annotated video failed: "):
        drawing.finish(video)


def _wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not up in time"
        time.sleep(0.02)


class ElsewhereTrail(list):
    """A trail that cannot be read in another process than the one that made it: the planning process fails
    to plan the chunk that holds it, the analysing process plans it as any other."""

    def __init__(self, points, pid=None):
        super().__init__(points)
        self.pid = os.getpid() if pid is None else pid

    def __len__(self):
        if os.getpid() != self.pid:
            raise RuntimeError("not readable here")
        return super().__len__()


@pytest.mark.parametrize("planning", ["up", "ends", "fails"])
def test_planned_apart_or_here_the_video_is_the_same(tmp_path, planning):
    """Planned here, then in the planning process once it is up (and, if it ends or cannot plan a chunk, here
    again for the rest of the video): frame for frame the video planned here throughout; the kept sprites (a
    face's disc, "no face") survive each change."""
    chunks = [(0, 7), (7, 9), (16, 6), (22, 8), (30, 5)]
    videos = {}
    for name, plan_apart in (("here", False), ("apart", True)):
        drawing = LocalDrawing(DEVICE, plan_apart=plan_apart)
        try:
            video = drawing.open(tmp_path / f"{name}.mp4", 25.0, NAMES)
            for k, (start, n) in enumerate(chunks):
                if plan_apart and k == 1:
                    _wait_for(lambda: drawing.plans_apart)
                if plan_apart and planning == "ends" and k == 3:
                    drawing._planning._helper.proc.kill()
                # Faces of a size per chunk, the first chunk's again later: each size's disc is kept, in each
                # planner's atlas at its own place.
                grow = 20 * (0, 1, 2, 0, 1)[k]
                trail = ElsewhereTrail if planning == "fails" and k == 2 else list
                faces = [[(face((40.0, 30.0, 130.0 + grow, 120.0 + grow)), trail([(0.1 * (i % 5), -0.2)]))]
                         if i % 3 else [] for i in range(n)]
                drawing.put(video, frames(n, start), list(range(start, start + n)), faces,
                            [[PALETTE[0]] * len(f) for f in faces])
            videos[name] = drawing.finish(video)
        finally:
            drawing.close()
    here, apart = videos["here"], videos["apart"]
    assert here.seconds["plan wait"] == 0 and here.planned_apart == 0 and apart.seconds["plan wait"] > 0
    # The first chunk planned here (the process was not up yet), the second and others there.
    assert apart.planned_apart == {"up": 35 - 7, "ends": 9 + 6, "fails": 9}[planning]
    assert 0 < apart.not_in_put < sum(v for k, v in apart.seconds.items() if k != "encode")
    here, apart = decoded(here.path), decoded(apart.path)
    assert len(here) == len(apart) == 35
    assert all(np.array_equal(a, b) for a, b in zip(here, apart))
