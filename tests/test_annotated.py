"""The annotated video's encoding process: I420 frames through a shared-memory ring into one playable file."""
import subprocess
import sys
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
import torch

from emonet.io.annotated import AnnotatedVideoWriter
from emonet.io.encode_worker import Spare
from emonet.errors import InputError

from .test_video import probe, top_level_boxes

pytestmark = pytest.mark.slow  # end-to-end: the tools in processes of their own

SIZE = (240, 160)  # width, height


def i420(level: int) -> torch.Tensor:
    """A flat grey frame of brightness ``level`` as I420."""
    rgb = np.full((SIZE[1], SIZE[0], 3), level, np.uint8)
    return torch.from_numpy(cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420).reshape(-1))


def test_chunks_become_one_video_with_every_frame_in_order(tmp_path):
    writer = AnnotatedVideoWriter(tmp_path / "a.mp4", 25.0)
    levels = [30 + 5 * i for i in range(23)]
    for start in range(0, 23, 4):  # chunks of 4, as the video tool hands them over
        chunk = list(range(start, min(start + 4, 23)))
        writer.put([100 + i for i in chunk], torch.stack([i420(levels[i]) for i in chunk]), SIZE)
    assert writer.close() == tmp_path / "a.mp4"
    info = probe(tmp_path / "a.mp4")
    assert (info["codec"], info["pix_fmt"], info["frames"], info["fps"]) == ("h264", "yuv420p", 23, 25.0)
    assert (info["width"], info["height"]) == SIZE
    boxes = top_level_boxes(tmp_path / "a.mp4")
    assert boxes.index("moov") < boxes.index("mdat")
    with av.open(str(tmp_path / "a.mp4")) as container:
        decoded = list(container.decode(video=0))
    step = decoded[1].pts - decoded[0].pts
    assert [f.pts for f in decoded] == [i * step for i in range(23)]  # the source's timing, no gap or repeat
    # Frame i is its own frame: the brightness rises by 5 a frame.
    assert all(abs(int(f.to_ndarray(format="rgb24").mean()) - level) <= 3 for f, level in zip(decoded, levels))
    assert writer.encode_seconds > 0 and writer.cpu_seconds["user"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]  # no partial file left


def test_chunks_larger_than_the_ring_and_wrapping_round_it_keep_every_frame_in_order(tmp_path):
    writer = AnnotatedVideoWriter(tmp_path / "a.mp4", 25.0)
    levels = [16 + (37 * i) % 220 for i in range(100)]  # neighbours far apart: a swap would show
    for start in (0, 50):  # the ring holds 64 frames of this size: the second chunk wraps round it
        writer.put(range(start, start + 50), torch.stack([i420(levels[i]) for i in range(start, start + 50)]), SIZE)
    assert writer.close() == tmp_path / "a.mp4"
    with av.open(str(tmp_path / "a.mp4")) as container:
        means = [int(f.to_ndarray(format="rgb24").mean()) for f in container.decode(video=0)]
    assert len(means) == 100 and all(abs(m - level) <= 3 for m, level in zip(means, levels))
    writer = AnnotatedVideoWriter(tmp_path / "b.mp4", 25.0)
    writer.put(range(150), torch.stack([i420(levels[i % 100]) for i in range(150)]), SIZE)  # > the ring at once
    assert writer.close() == tmp_path / "b.mp4" and probe(tmp_path / "b.mp4")["frames"] == 150


def test_no_frame_leaves_no_file_and_bad_names_and_sizes_are_refused(tmp_path):
    writer = AnnotatedVideoWriter(tmp_path / "a.mp4", 25.0)
    encoder = writer._helper.proc  # started at once: its start-up runs while the first frames are analysed
    assert writer.close() is None and encoder.poll() is not None  # no frame: nothing kept, nothing left running
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputError, match=".mp4"):
        AnnotatedVideoWriter(tmp_path / "a.gif", 25.0)
    writer = AnnotatedVideoWriter(tmp_path / "a.mp4", 25.0)
    writer.put([0], i420(50)[None], SIZE)
    with pytest.raises(ValueError, match="video's"):
        writer.put([1], i420(50)[None], (SIZE[0] + 2, SIZE[1]))
    assert writer.close() == tmp_path / "a.mp4" and probe(tmp_path / "a.mp4")["frames"] == 1


def shm_rings() -> set:
    return set(Path("/dev/shm").glob("emonet-frames-*")) if Path("/dev/shm").is_dir() else set()


def test_a_ring_made_ahead_takes_the_frames_of_its_size_or_gives_way_to_theirs(tmp_path):
    before = shm_rings()
    for name, ahead in (("same.mp4", SIZE), ("other.mp4", (SIZE[0] + 2, SIZE[1] + 2))):
        writer = AnnotatedVideoWriter(tmp_path / name, 25.0)
        writer.prepare(ahead, "cpu")
        writer.put(range(4), torch.stack([i420(40 + 30 * i) for i in range(4)]), SIZE)
        writer.put(range(4, 6), torch.stack([i420(160), i420(190)]), SIZE)
        assert writer.close() == tmp_path / name
        info = probe(tmp_path / name)
        assert (info["frames"], info["width"], info["height"]) == (6, *SIZE)
        with av.open(str(tmp_path / name)) as container:
            means = [int(f.to_ndarray(format="rgb24").mean()) for f in container.decode(video=0)]
        assert all(abs(m - (40 + 30 * i)) <= 3 for i, m in enumerate(means))
    writer = AnnotatedVideoWriter(tmp_path / "none.mp4", 25.0)
    writer.prepare(SIZE, "cpu")
    encoder = writer._helper.proc
    assert writer.close() is None and encoder.poll() is not None  # made ahead, no frame: nothing kept or left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.mp4", "same.mp4"] and shm_rings() == before


def test_mp4v_takes_the_same_frames(tmp_path):
    writer = AnnotatedVideoWriter(tmp_path / "a.avi", 25.0, codec="mp4v")
    writer.put(range(6), torch.stack([i420(40 * i) for i in range(6)]), SIZE)
    assert writer.close() == tmp_path / "a.avi"
    cap = cv2.VideoCapture(str(tmp_path / "a.avi"))
    means = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        means.append(bgr.mean())
    assert len(means) == 6 and all(abs(m - 40 * i) <= 4 for i, m in enumerate(means))


def test_an_encoder_started_ahead_encodes_the_video_and_the_next_one_waits_for_its_own(tmp_path):
    spare = Spare()
    first = spare._proc
    with pytest.raises(InputError, match=".mp4"):  # a refused name takes no encoder: it waits for the next video
        AnnotatedVideoWriter(tmp_path / "a.gif", 25.0, spare=spare)
    assert spare._proc is first and first.poll() is None
    writer = AnnotatedVideoWriter(tmp_path / "a.mp4", 25.0, spare=spare)
    assert writer._helper.proc is first
    second = spare._proc  # started by taking the first, for the next video
    assert second is not first
    writer.put(range(3), torch.stack([i420(60)] * 3), SIZE)
    assert writer.close() == tmp_path / "a.mp4" and probe(tmp_path / "a.mp4")["frames"] == 3
    assert first.returncode == 0
    spare.close()  # the one not taken ends too
    assert second.poll() is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]


def test_an_encoder_whose_parent_dies_ends_quietly():
    # The spare's parent exits at once: the spare reads the end of its input, and its last line finds no one.
    parent = subprocess.run([sys.executable, "-c", "import os; from emonet.io.encode_worker import Spare; "
                             "Spare(); os._exit(0)"], capture_output=True, text=True, timeout=120)
    assert parent.returncode == 0 and parent.stderr == ""  # read to its end: the spare, its heir, has ended too
