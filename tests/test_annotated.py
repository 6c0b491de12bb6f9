"""The annotated video's drawing-and-encoding processes: segments joined into one playable file."""
import numpy as np
import pytest

from emonet.io.annotated import AnnotatedVideoWriter
from emonet.io.images import InputError
from emonet.results import FaceResult

from .test_video import probe, top_level_boxes


def face(frame: int) -> FaceResult:
    box = np.array([40.0 + frame, 30.0, 140.0 + frame, 130.0])
    landmarks = np.random.default_rng(frame).uniform(50, 120, (68, 2))
    matrix = np.array([[2.0, 0.0, -80.0 - 2 * frame], [0.0, 2.0, -60.0]])
    return FaceResult(frame, 0, box, 0.9, True, 1, np.full(8, 1 / 8), 0.2, -0.1, landmarks, matrix)


def frames(n: int):
    for i in range(n):
        image = np.full((160, 240, 3), 30 + 5 * i, np.uint8)
        yield i, image, [(face(i), [(0.0, 0.0), (0.2, -0.1)])] if i % 4 else []


@pytest.mark.parametrize("workers", [1, 3])
def test_segments_join_into_one_video_with_every_frame_in_order(tmp_path, workers):
    writer = AnnotatedVideoWriter(tmp_path / "a.mp4", 25.0, [f"c{i}" for i in range(8)], "banner",
                                  workers=workers, segment_frames=5)
    for index, image, faces in frames(23):
        writer.put(100 + index, image, faces, [(255, 0, 0)] * len(faces))
    assert writer.close() == tmp_path / "a.mp4"
    info = probe(tmp_path / "a.mp4")
    assert (info["codec"], info["pix_fmt"], info["frames"], info["fps"]) == ("h264", "yuv420p", 23, 25.0)
    assert info["width"] == 240 + 200  # the frame and the panel beside it
    boxes = top_level_boxes(tmp_path / "a.mp4")
    assert boxes.index("moov") < boxes.index("mdat")
    import av
    with av.open(str(tmp_path / "a.mp4")) as container:
        decoded = list(container.decode(video=0))
    step = decoded[1].pts - decoded[0].pts
    assert [f.pts for f in decoded] == [i * step for i in range(23)]  # the source's timing, no gap or repeat
    # Frame i was drawn on its own pixels: the background brightness rises by 5 a frame.
    corners = [int(f.to_ndarray(format="rgb24")[150, 5].mean()) for f in decoded]
    assert all(abs(c - (30 + 5 * i)) <= 3 for i, c in enumerate(corners))
    assert writer.seconds["draw"] > 0 and writer.seconds["encode"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]  # no segment or partial file left


def test_no_frame_leaves_no_file_and_a_bad_name_is_refused(tmp_path):
    assert AnnotatedVideoWriter(tmp_path / "a.mp4", 25.0, ["a"], None).close() is None
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputError, match=".mp4"):
        AnnotatedVideoWriter(tmp_path / "a.gif", 25.0, ["a"], None)
