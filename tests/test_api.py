"""The Python API, used as the README shows it."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import emonet

from .test_video import make_clip

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return make_clip(tmp_path_factory.mktemp("api") / "clip.mp4", frames=12, blank_from=10)


def test_frames_faces_and_summary(clip):
    reader = emonet.Reader(weights="random", device="cpu", batch_size=4)
    frames = list(reader.video(str(clip)))
    assert [f.index for f in frames] == list(range(12))
    assert all(len(f.faces) == 1 for f in frames[:10]) and not any(f.faces for f in frames[10:])
    assert frames[0].faces[0].detected and frames[1].timestamp == pytest.approx(0.04)
    (face,) = emonet.summarize(frames, reader.class_names)
    assert face["face_id"] == 0 and face["frames"] == 10 and face["dominant_expression"] in reader.class_names
    (photo_faces,) = reader.images([_first_frame(clip)])
    assert len(photo_faces) == 1


def _first_frame(clip):
    import cv2
    ok, bgr = cv2.VideoCapture(str(clip)).read()
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def test_the_readme_example_runs_as_written(clip, tmp_path):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(import emonet\n.*?)```", readme, re.S).group(1)
    (tmp_path / "clip.mp4").write_bytes(clip.read_bytes())
    out = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "face 0" in out.stdout


def test_small_faces_are_found_in_video(tmp_path):
    from emonet.io.writer import VideoWriter
    from emonet.tracking import iou

    from .conftest import small_faces_scene

    scene, truth = small_faces_scene(widths=(40, 90), places=((300, 700), (1000, 200)))
    path = tmp_path / "small.mp4"
    writer = VideoWriter(path, 30.0, (1920, 1080))
    for _ in range(3):
        writer.write(scene)
    writer.close()
    reader = emonet.Reader(weights="random", device="cpu", batch_size=4)
    small = list(reader.video(str(path)))[0].faces
    assert len(small) == 2 and any(iou(f.box, truth[0]) > 0.4 for f in small) and any(iou(f.box, truth[1]) > 0.4 for f in small)
