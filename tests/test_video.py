"""demo_video.py end to end on clips the tests write with OpenCV (the test photo moving across a canvas)."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from emonet.engine.check import SAMPLE_PHOTO

pytestmark = pytest.mark.slow  # end-to-end: the tools in processes of their own

ROOT = Path(__file__).resolve().parents[1]


def make_clip(path: Path, frames: int, blank_from: int = 10 ** 9, fps: float = 25.0) -> Path:
    face = cv2.resize(cv2.imread(str(SAMPLE_PHOTO)), (256, 256))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (480, 320))
    for i in range(frames):
        canvas = np.full((320, 480, 3), 40, np.uint8)
        if i < blank_from:
            x = 10 + 3 * min(i % 120, 120 - i % 120)  # moves right, then back: stays on the canvas
            canvas[30:286, x:x + 256] = face
        writer.write(canvas)
    writer.release()
    return path


def demo_video(*args, **kwargs):
    return subprocess.run([sys.executable, str(ROOT / "demo_video.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=300, **kwargs)


def top_level_boxes(path: Path) -> list[str]:
    """The MP4 file's top-level box types, in order (``moov`` before ``mdat``: it streams)."""
    data, boxes, at = path.read_bytes(), [], 0
    while at + 8 <= len(data):
        size, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8].decode("latin-1")
        if size == 1:
            size = int.from_bytes(data[at + 8:at + 16], "big")
        boxes.append(kind)
        if size < 8:
            break
        at += size
    return boxes


def probe(path: Path) -> dict:
    """Codec, pixel format, frame rate and the number of frames actually decoded (PyAV)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        info = {"codec": stream.codec_context.name, "pix_fmt": stream.codec_context.pix_fmt,
                "fps": float(stream.average_rate), "width": stream.width, "height": stream.height}
        info["frames"] = sum(1 for _ in container.decode(stream))
    return info


def frame_count(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.read()[0]:
        n += 1
    return n


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return make_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", frames=25, blank_from=20)


def test_video_csv_jsonl_and_stable_ids(clip, tmp_path):
    out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--batch-size", "4",
                     "--output", tmp_path / "out.mp4", "--csv", tmp_path / "f.csv", "--jsonl", tmp_path / "f.jsonl",
                     "--landmarks")
    assert out.returncode == 0, out.stderr
    # Plays in a browser: H.264 in yuv420p, the index (moov) before the data, every frame, the source's rate.
    info = probe(tmp_path / "out.mp4")
    assert (info["codec"], info["pix_fmt"], info["frames"]) == ("h264", "yuv420p", 25)
    assert info["fps"] == pytest.approx(25) and info["width"] > 480  # the frame and the panel beside it
    boxes = top_level_boxes(tmp_path / "out.mp4")
    assert boxes.index("moov") < boxes.index("mdat")
    assert frame_count(tmp_path / "out.mp4") == 25  # OpenCV reads it too
    rows = list(csv.DictReader((tmp_path / "f.csv").open()))
    assert [int(r["frame"]) for r in rows] == list(range(25))  # one face per frame, or one empty row
    with_face = [r for r in rows if r["face_id"] != ""]
    assert len(with_face) == 20 and {r["face_id"] for r in with_face} == {"0"}
    assert all(r["face_id"] == "" and r["valence"] == "" for r in rows[20:])  # "no face", not "not processed"
    assert rows[0]["detected"] == "1" and float(rows[1]["timestamp"]) == pytest.approx(0.04)
    # A row's score is its own frame's detection: tracked frames (detected=0) have none.
    assert all((r["score"] != "") == (r["detected"] == "1") for r in with_face)
    assert any(r["detected"] == "0" for r in with_face)
    header = next(csv.reader((tmp_path / "f.csv").open()))
    assert len(header) == len(set(header)) == 20 + 136 + 1  # landmark columns never shadow the box's x1..y2
    assert header[-1] == "untrained" and rows[0]["untrained"] == "1"  # random weights: every row says so
    assert rows[0]["lm67_y"] != ""
    assert float(rows[0]["x1"]) < float(rows[0]["x2"]) and float(rows[0]["y1"]) < float(rows[0]["y2"])
    lines = [json.loads(line) for line in (tmp_path / "f.jsonl").open()]
    assert len(lines) == 25 and lines[0]["face_id"] == 0 and lines[24]["face_id"] is None
    assert all((line["score"] is None) == (line["detected"] == 0) for line in lines[:20])
    assert "frames/s end to end" in out.stderr and "emonet" in out.stderr and "first call" in out.stderr
    assert not list(tmp_path.glob(".*partial*"))


def test_max_frames_start_end_and_no_video(clip, tmp_path):
    out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--no-video", "--csv",
                     tmp_path / "f.csv", "--start", "0.2", "--max-frames", "6", "--no-smooth")
    assert out.returncode == 0, out.stderr
    frames = [int(r["frame"]) for r in csv.DictReader((tmp_path / "f.csv").open())]
    assert frames == list(range(5, 11))
    # One chunk, its first results its last: the start-up line ends with them, and no steady state is claimed.
    (line,) = [line for line in out.stderr.splitlines() if line.startswith("first results")]
    assert line.endswith(" s") and ", first frames " in line, line
    assert "wall clock" not in out.stderr
    out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--no-video", "--csv",
                     tmp_path / "g.csv", "--end", "0.1")
    assert [int(r["frame"]) for r in csv.DictReader((tmp_path / "g.csv").open())] == [0, 1, 2]
    out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--no-video", "--csv",
                     tmp_path / "h.csv", "--end", "0.2")  # exclusive: 0.2 s at 25 frames/s is frames 0-4
    assert [int(r["frame"]) for r in csv.DictReader((tmp_path / "h.csv").open())] == [0, 1, 2, 3, 4]


def long_run(tmp_path: Path, *extra: str, group: bool = False) -> subprocess.Popen:
    """demo_video on a 150-frame clip, a frame a chunk on the CPU, rows to f.csv: returned once 3 rows are on disk
    (``group``: in a process group of its own, its helpers with it)."""
    clip = make_clip(tmp_path / "long.mp4", frames=150)
    proc = subprocess.Popen([sys.executable, str(ROOT / "demo_video.py"), "--video", str(clip), "--weights", "random",
                             "--device", "cpu", "--batch-size", "1", *extra, "--csv", str(tmp_path / "f.csv")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=group)
    deadline = time.time() + 120
    while time.time() < deadline:
        partial = next(tmp_path.glob(".f.csv.*.partial"), None)
        if partial is not None and partial.read_text().count("\n") >= 4:
            break
        time.sleep(0.2)
    return proc


@pytest.mark.parametrize("whole_group", [False, True])
def test_an_interrupted_run_keeps_a_playable_video_and_every_finished_row(tmp_path, whole_group):
    # SIGTERM to the process, or to its whole process group as `timeout`, systemd and batch schedulers send it
    # (its decoding and encoding helpers get it too, and must leave the stop to the process).
    proc = long_run(tmp_path, "--output", str(tmp_path / "out.mp4"), group=whole_group)
    if whole_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    rows = list(csv.DictReader((tmp_path / "f.csv").open()))
    assert 3 <= len(rows) < 150
    assert probe(tmp_path / "out.mp4")["frames"] == len(rows)  # the video holds exactly the finished frames
    boxes = top_level_boxes(tmp_path / "out.mp4")
    assert boxes.index("moov") < boxes.index("mdat")
    assert not list(tmp_path.glob(".*partial*"))


def test_a_decoder_that_dies_part_way_is_a_helper_failure_and_the_rows_kept_say_they_are_not_whole(tmp_path):
    proc = long_run(tmp_path)
    decoders = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/cmdline")
                if "decode_worker" in p.read_bytes().decode(errors="replace") and
                f"PPid:\t{proc.pid}\n" in (p.parent / "status").read_text()]
    assert len(decoders) == 1
    os.kill(decoders[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 4 and "Traceback" not in err
    assert "the decoding process ended unexpectedly (killed by SIGKILL" in err.strip().splitlines()[-1]
    rows = list(csv.DictReader((tmp_path / "f.csv").open()))
    meta = json.loads((tmp_path / "f.meta.json").read_text())
    assert 3 <= len(rows) < 150 and meta["complete"] is False and meta["frames"] == len(rows)
    assert "killed by SIGKILL" in meta["error"]


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.mp4", "no such video file"),
    (lambda d: (d / "notes.mp4").write_text("not a video") and d / "notes.mp4", "not a video FFmpeg or OpenCV can open"),
])
def test_bad_videos_are_one_clear_line(tmp_path, make, message):
    out = demo_video("--video", make(tmp_path), "--weights", "random", "--device", "cpu", "--csv", tmp_path / "f.csv")
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "f.csv").exists()


def test_a_missing_video_is_said_before_the_weights_are_fetched(tmp_path):
    # The released weights are the default and not on disk here: the bad path is the only line, and no download
    # (nor a device's start) comes before it.
    env = {**os.environ, "EMONET_HOME": str(tmp_path / "home")}
    out = demo_video("--video", tmp_path / "gone.mp4", "--no-video", "--csv", tmp_path / "f.csv", env=env)
    assert out.returncode == 2 and out.stderr.strip() == f"error: {tmp_path / 'gone.mp4'}: no such video file"
    assert not (tmp_path / "home").exists() and not (tmp_path / "f.csv").exists()


def test_unwritable_output_and_wrong_extension(clip, tmp_path):
    (tmp_path / "file").write_text("x")
    out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--output", tmp_path / "file" / "o.mp4")
    assert out.returncode == 2 and f"{tmp_path / 'file'}: is a file, not a folder" in out.stderr
    # An output named as the video would replace it.
    before = clip.read_bytes()
    for flag in ("--output", "--csv", "--jsonl"):
        out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", flag, clip)
        assert out.returncode == 2 and out.stderr.strip().endswith(f"{clip}: is also an input, which this output "
                                                                   f"would replace; give the output another name")
    assert clip.read_bytes() == before and not list(clip.parent.glob("*.meta.json"))
    out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--output", tmp_path / "o.gif")
    assert out.returncode == 2 and ".mp4" in out.stderr
    # A folder where a file goes: said before any work, and nothing written beside it.
    (tmp_path / "rows").mkdir()
    out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--csv", tmp_path / "rows")
    assert out.returncode == 2 and "is a folder" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "rows.meta.json").exists() and not any((tmp_path / "rows").iterdir())


@pytest.mark.parametrize("codec, name", [("h264", "h264"), ("mp4v", "mpeg4")])
def test_writer_codecs_keep_colours_size_and_frames(tmp_path, codec, name):
    from emonet.io.writer import VideoWriter

    image = np.zeros((121, 203, 3), np.uint8)  # odd sides: H.264's yuv420p needs even ones
    image[:, :100] = (220, 40, 40)
    image[60:] = (30, 200, 90)
    writer = VideoWriter(tmp_path / "v.mp4", 30000 / 1001, (203, 121), codec=codec)
    for i in range(12):
        writer.write(image, index=100 + i)
    assert not (tmp_path / "v.mp4").exists()  # written under a temporary name until closed
    assert writer.close() == tmp_path / "v.mp4" and not list(tmp_path.glob(".*partial*"))
    info = probe(tmp_path / "v.mp4")
    assert info["codec"] == name and info["frames"] == 12 and info["fps"] == pytest.approx(29.97, abs=0.01)
    cap = cv2.VideoCapture(str(tmp_path / "v.mp4"))
    ok, bgr = cap.read()
    h, w = min(bgr.shape[0], 121), min(bgr.shape[1], 203)  # OpenCV's mp4v drops an odd line; H.264 pads it
    assert ok and h >= 120 and w >= 202
    assert np.abs(cv2.cvtColor(bgr[:h, :w], cv2.COLOR_BGR2RGB).astype(int) - image[:h, :w]).mean() < 6


def test_writer_refuses_unknown_containers_and_codecs(tmp_path):
    from emonet.errors import InputError
    from emonet.io.writer import VideoWriter

    with pytest.raises(InputError, match=r"\.mp4"):
        VideoWriter(tmp_path / "v.gif", 25, (64, 64))
    with pytest.raises(InputError, match="codec"):
        VideoWriter(tmp_path / "v.mp4", 25, (64, 64), codec="vp9")
    assert not list(tmp_path.iterdir())


def decoded_rgb(clip, n: int) -> list:
    """The first ``n`` frames as FFmpeg decodes them (yuv420p), in RGB by the conversion checked below."""
    import av
    from emonet.io.video import i420_to_rgb
    with av.open(str(clip)) as container:
        return [i420_to_rgb(torch.from_numpy(f.to_ndarray(format="yuv420p"))).numpy()
                for _, f in zip(range(n), container.decode(video=0))]


def test_reader_frames_are_rgb(clip):
    from emonet.io.video import VideoReader
    ok, bgr = cv2.VideoCapture(str(clip)).read()
    reader = VideoReader(str(clip), max_frames=1)
    (frame,) = list(reader)
    reader.close()
    assert frame.shape == bgr.shape
    assert np.array_equal(frame.image, decoded_rgb(clip, 1)[0])
    # OpenCV's own reader interpolates chroma where this one repeats it: the same picture, in RGB order
    difference = np.abs(frame.image.astype(int) - bgr[..., ::-1])
    assert difference.mean() < 2 and np.abs(frame.image.astype(int) - bgr).mean() > 10


def test_i420_to_rgb_is_opencvs_conversion_and_knows_bt709_and_full_range():
    import torch
    from emonet.io.video import i420_to_rgb
    rng = np.random.default_rng(1)
    rgb = cv2.GaussianBlur(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), (5, 5), 2)
    planes = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)
    batch = torch.from_numpy(np.stack([planes, planes[::-1].copy()]))
    out = i420_to_rgb(batch).numpy()
    assert out.shape == (2, 48, 64, 3)
    assert np.abs(out[0].astype(int) - cv2.cvtColor(planes, cv2.COLOR_YUV2RGB_I420)).max() <= 1
    assert np.abs(out[1].astype(int) - cv2.cvtColor(planes[::-1].copy(), cv2.COLOR_YUV2RGB_I420)).max() <= 1
    # grey stays grey under either matrix; limited-range white (235) and black (16) reach 255 and 0
    flat = np.full((48 * 3 // 2, 64), 128, np.uint8)
    flat[:48] = 235
    assert (i420_to_rgb(torch.from_numpy(flat), "709").numpy() == 255).all()
    flat[:48] = 16
    assert (i420_to_rgb(torch.from_numpy(flat), "709").numpy() == 0).all()
    assert (i420_to_rgb(torch.from_numpy(flat), "601", full_range=True).numpy() == 16).all()
    # a saturated red differs between the matrices: BT.709's weaker red weight needs more Cr
    red = np.full((48 * 3 // 2, 64), 128, np.uint8)
    red[:48], red[48 + 48 * 64 // 4 // 64:] = 81, 240
    r601, r709 = (i420_to_rgb(torch.from_numpy(red), m).numpy()[0, 0] for m in ("601", "709"))
    assert r601[0] > 200 and r709[0] > r601[0] - 60 and not np.array_equal(r601, r709)


def test_i420_to_rgb_is_its_stated_arithmetic_for_every_chroma_pair():
    # Each (Cb, Cr) product rounded, their sum, plus the scaled luma, rounded half to even and clamped: float32
    # steps that every device rounds alike (so the GPU's pixels are the CPU's), here on all 65,536 chroma pairs.
    # Lumas 111 and 146 are where a fused multiply-add (either order) would put a pixel a level apart.
    import torch
    from emonet.io.colour import _MATRICES, i420_to_rgb
    c = np.arange(256, dtype=np.uint8)
    cb, cr = (a.reshape(256, 256) for a in np.meshgrid(c, c, indexing="ij"))
    lumas = np.array([0, 1, 16, 17, 100, 111, 128, 146, 201, 235, 254, 255], np.uint8)
    n = len(lumas)
    luma = np.broadcast_to(lumas[:, None, None], (n, 512, 512)).reshape(n, -1)
    i420 = np.concatenate([luma, np.broadcast_to(np.concatenate([cb.ravel(), cr.ravel()]), (n, 2 * 256 * 256))], axis=1)
    nv12 = np.concatenate([luma, np.broadcast_to(np.stack([cb.ravel(), cr.ravel()], -1).ravel(), (n, 2 * 256 * 256))], axis=1)
    f = np.float32
    for matrix, full, interleaved in (("601", False, False), ("601", True, False), ("709", False, False),
                                      ("709", True, False), ("601", False, True)):
        planes = (nv12 if interleaved else i420).reshape(n, 768, 512)
        out = i420_to_rgb(torch.from_numpy(planes), matrix, full, nv12=interleaved).numpy()
        kr, kb = _MATRICES[matrix]
        kg = 1.0 - kr - kb
        y_scale, c_scale, y0 = (1.0, 1.0, 0.0) if full else (255.0 / 219.0, 255.0 / 224.0, 16.0)
        weights = np.array([[0.0, -2 * (1 - kb) * kb / kg, 2 * (1 - kb)],
                            [2 * (1 - kr), -2 * (1 - kr) * kr / kg, 0.0]], f) * f(c_scale)
        offsets = (cb.astype(f)[..., None] - f(128)) * weights[0] + (cr.astype(f)[..., None] - f(128)) * weights[1]
        for k, y in enumerate(lumas):
            expected = np.clip(np.rint(offsets + (f(y) - f(y0)) * f(y_scale)), 0, 255).astype(np.uint8)
            for dy in (0, 1):  # every pixel of a 2x2 block carries its block's chroma
                for dx in (0, 1):
                    assert np.array_equal(out[k, dy::2, dx::2], expected), (matrix, full, interleaved, y)


def test_reader_decodes_in_a_child_process_and_leaves_nothing_behind(clip):
    from emonet.io.video import VideoReader
    before = set(Path("/dev/shm").glob("emonet-frames-*")) if Path("/dev/shm").is_dir() else set()
    reader = VideoReader(str(clip))
    child = reader._decoder.process
    frames = []
    for frame in reader:  # stopped early: the child is still decoding ahead
        frames.append(frame)
        if len(frames) == 3:
            break
    reader.close()
    assert child.poll() is not None  # ended, not left running
    assert [f.index for f in frames] == [0, 1, 2] and 0 < reader.decode_seconds < 5
    assert (set(Path("/dev/shm").glob("emonet-frames-*")) if Path("/dev/shm").is_dir() else set()) == before
    for frame, expected in zip(frames, decoded_rgb(clip, 3)):  # each frame its own copy, though the slots were reused
        assert np.array_equal(frame.image, expected)


def shm_frames() -> set:
    return set(Path("/dev/shm").glob("emonet-frames-*")) if Path("/dev/shm").is_dir() else set()


def test_a_sequence_decodes_many_videos_in_one_process_each_as_alone(clip, tmp_path):
    from emonet.errors import InputError
    from emonet.io.video import VideoSequence
    before = shm_frames()
    large = tmp_path / "large.mp4"  # larger frames than the first video's slots hold: new slots
    writer = cv2.VideoWriter(str(large), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, (640, 480))
    for i in range(4):
        writer.write(np.full((480, 640, 3), (30 * i, 90, 160), np.uint8))
    writer.release()
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video")
    sources = [clip, tmp_path / "broken.mp4", large, tmp_path / "gone.mp4", clip]
    sequence = VideoSequence(sources)
    first = sequence.next()
    child = sequence._decoder.process
    taken = []
    for frame in first:  # stopped early: the rest of this video is read past, not handed to the next
        taken.append(frame)
        if len(taken) == 3:
            break
    first.close()
    with pytest.raises(InputError, match="broken.mp4: not a video"):
        sequence.next()
    third = sequence.next()
    big = list(third)
    third.close()
    with pytest.raises(InputError, match="gone.mp4: no such video file"):
        sequence.next()
    last = sequence.next()
    whole = list(last)
    last.close()
    sequence.close()
    assert child.poll() is not None and shm_frames() == before
    expected = decoded_rgb(clip, 25)
    assert [f.index for f in taken] == [0, 1, 2] and [f.index for f in whole] == list(range(25))
    assert all(np.array_equal(f.image, e) for f, e in zip(taken + whole, expected[:3] + expected))
    assert [f.shape for f in big] == [(480, 640, 3)] * 4 and np.array_equal(big[2].image, decoded_rgb(large, 4)[2])
    assert third.fps == 25.0 and third.frame_count == 4


def test_a_sequence_stops_each_video_at_its_end_time(clip):
    from emonet.io.video import VideoSequence
    sequence = VideoSequence([clip, clip], start=0.2, end=0.4)  # 25 frames/s: frames 5 to 9 (the end excluded)
    indices = []
    for _ in range(2):
        reader = sequence.next()
        indices.append([f.index for f in reader])
        reader.close()
    sequence.close()
    assert indices == [list(range(5, 10))] * 2


def test_reader_follows_frames_that_change_size(tmp_path):
    from emonet.io.video import VideoReader
    # Larger than the first (sent through the pipe, twice in a row), smaller (in a slot), the first again.
    sizes = [(48, 64), (48, 64), (120, 160), (120, 160), (24, 32), (48, 64)]
    for i, (h, w) in enumerate(sizes):
        cv2.imwrite(str(tmp_path / f"f{i:03d}.png"), np.full((h, w, 3), (10 * i, 100, 200), np.uint8))
    reader = VideoReader(str(tmp_path / "f%03d.png"))
    frames = list(reader)
    reader.close()
    assert [f.shape[:2] for f in frames] == sizes
    assert all((f.image[0, 0] == (200, 100, 10 * i)).all() for i, f in enumerate(frames))  # RGB


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_frames_are_uploaded_as_rgb_and_a_host_copy_is_optional(clip):
    from emonet.io.video import CONVERT_FRAMES, VideoReader
    device = torch.device("cuda:0")
    count = CONVERT_FRAMES + 3  # a whole group converted on the GPU, and the rest at the end
    expected = decoded_rgb(clip, count)
    for keep_host in (True, False):
        reader = VideoReader(str(clip), max_frames=count, device=device, keep_host=keep_host)
        frames = list(reader)
        reader.close()
        assert [f.index for f in frames] == list(range(count))
        for frame, rgb in zip(frames, expected):
            assert (frame.host is not None) == keep_host and frame.shape == rgb.shape
            # the same arithmetic on the GPU as on the CPU, rounded alike: the same pixels (without a host
            # copy, frame.image is the GPU's copied back)
            assert np.array_equal(frame.on_device(device).cpu().numpy(), rgb)
            assert np.array_equal(frame.image, rgb)


def test_detected_rows_are_the_same_at_every_batch_size(clip, tmp_path):
    # Every row belongs to its frame: a detected frame's box, score and readings do not depend on how
    # frames are batched (crops between detections may: they come from the last chunk's landmarks).
    rows = {}
    for batch in (1, 8):
        # fp32 (eager): on a CPU with bf16 in hardware, auto's bf16 differs more between batch sizes.
        out = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--batch-size", batch,
                         "--engine", "eager", "--detect-every", 5, "--no-smooth", "--csv", tmp_path / f"b{batch}.csv")
        assert out.returncode == 0, out.stderr
        rows[batch] = list(csv.DictReader((tmp_path / f"b{batch}.csv").open()))
    # Every 5th frame is detected at any batch size; random weights' landmarks also break their bounds
    # between detections, and the detector looks again at the next frame it can (which depends on the chunks).
    periodic = {b: [r for r in rows[b] if r["detected"] == "1" and int(r["frame"]) % 5 == 0] for b in rows}
    assert [int(r["frame"]) for r in periodic[1]] == [int(r["frame"]) for r in periodic[8]] == [0, 5, 10, 15]
    detected = {b: [r for r in rows[b] if r["detected"] == "1"] for b in rows}
    assert max(int(r["frame"]) for r in detected[1] + detected[8]) < 20  # the face leaves at frame 20
    exact = ("frame", "timestamp", "face_id", "detected", "score", "x1", "y1", "x2", "y2")
    for one, eight in zip(periodic[1], periodic[8]):
        assert [one[k] for k in exact] == [eight[k] for k in exact]
        # The same crop; the network's arithmetic may differ in the last digits between batch sizes.
        readings = [k for k in one if k.startswith("p_") or k in ("valence", "arousal")]
        np.testing.assert_allclose([float(one[k]) for k in readings], [float(eight[k]) for k in readings], atol=2e-4)
    for r in detected[8]:  # this frame's face: inside the photo pasted at x = 10 + 3 * frame
        x, centre = 10 + 3 * int(r["frame"]), (float(r["x1"]) + float(r["x2"])) / 2
        assert x < centre < x + 256 and 20 < float(r["x2"]) - float(r["x1"]) < 150, r
    assert [r["frame"] for r in rows[1]] == [r["frame"] for r in rows[8]]


def test_decoder_nvdec_without_pynvvideocodec_is_one_clear_line(clip, tmp_path):
    from emonet.io import nvdec
    if nvdec.available():
        pytest.skip("PyNvVideoCodec is installed here")
    out = demo_video("--video", clip, "--weights", "random", "--decoder", "nvdec", "--csv", tmp_path / "f.csv")
    assert out.returncode == 2 and "--decoder nvdec needs NVIDIA's PyNvVideoCodec" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "f.csv").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (and PyNvVideoCodec)")
def test_an_annotated_video_is_decoded_on_nvdec_with_the_cpus_rows(tmp_path):
    from emonet.io import nvdec
    from tests.test_nvdec import h264_clip
    if not nvdec.available():
        pytest.skip("needs PyNvVideoCodec")
    clip = h264_clip(tmp_path / "c.mp4", 40)
    rows, errs = {}, {}
    for decoder in ("auto", "cpu"):
        out = demo_video("--video", clip, "--weights", "random", "--decoder", decoder, "--output",
                         tmp_path / f"{decoder}.mp4", "--csv", tmp_path / f"{decoder}.csv", "--engine", "eager")
        assert out.returncode == 0, out.stderr
        assert probe(tmp_path / f"{decoder}.mp4")["frames"] == 40
        rows[decoder] = list(csv.DictReader((tmp_path / f"{decoder}.csv").open()))
        errs[decoder] = out.stderr
    assert "decode is NVDEC's, on the GPU" in errs["auto"] and "decode runs in a process of its own" in errs["cpu"]
    # the same pixels: the same faces in the same places (two processes' GPU kernels may round differently)
    exact, box = ("frame", "face_id", "detected"), ("x1", "y1", "x2", "y2")
    assert [[r[k] for k in exact] for r in rows["auto"]] == [[r[k] for k in exact] for r in rows["cpu"]]
    with_face = [(a, c) for a, c in zip(rows["auto"], rows["cpu"]) if a["face_id"] != ""]
    assert len(with_face) == 40
    np.testing.assert_allclose([[float(a[k]) for k in box] for a, _ in with_face],
                               [[float(c[k]) for k in box] for _, c in with_face], atol=0.5)


def make_h264(path: Path, times: list, size=(160, 120), faststart: bool = False) -> Path:
    """An H.264 clip whose frame ``i`` is shown at ``times[i]`` seconds (a millisecond time base: variable
    frame rate as phones record it), the test photo moving over a plain background."""
    import fractions

    import av

    face = cv2.cvtColor(cv2.resize(cv2.imread(str(SAMPLE_PHOTO)), (96, 96)), cv2.COLOR_BGR2RGB)
    with av.open(str(path), "w", options={"movflags": "faststart"} if faststart else {}) as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.codec_context.time_base = fractions.Fraction(1, 1000)
        for i, t in enumerate(times):
            canvas = np.full((size[1], size[0], 3), 60, np.uint8)
            x = (3 * i) % (size[0] - 96)
            canvas[12:108, x:x + 96] = face
            frame = av.VideoFrame.from_ndarray(canvas, format="rgb24")
            frame.pts, frame.time_base = round(t * 1000), fractions.Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_timestamps_are_presentation_times_on_variable_frame_rate_video(tmp_path):
    # Recorded at 30 frames/s, then at 5: index / average rate is off by over a second by the end.
    times = [i / 30 for i in range(18)] + [18 / 30 + i / 5 for i in range(12)]
    clip = make_h264(tmp_path / "vfr.mp4", times)
    out = tmp_path / "rows.csv"
    r = demo_video("--video", clip, "--csv", out, "--weights", "random", "--device", "cpu", "--batch-size", "8")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    seen = {}
    for row in rows:
        seen[int(row["frame"])] = float(row["timestamp"])
    assert sorted(seen) == list(range(len(times)))
    for i, t in enumerate(times):
        assert abs(seen[i] - t) <= 1e-3, (i, seen[i], t)


def test_a_truncated_video_says_so_keeps_its_frames_and_exits_1(tmp_path, ckpt_dir):
    import hashlib

    whole = make_h264(tmp_path / "whole.mp4", [i / 30 for i in range(60)], faststart=True)
    cut = tmp_path / "cut.mp4"
    data = whole.read_bytes()
    cut.write_bytes(data[:len(data) // 2])  # the index (at the front) still declares 60 frames
    out = tmp_path / "rows.csv"
    weights = ckpt_dir / "emonet_8.pth"
    r = demo_video("--video", cut, "--csv", out, "--weights", weights, "--device", "cpu", "--detect-every", "100")
    assert r.returncode == 1, r.stderr
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "of the 60 frames the file declares" in warning[0], r.stderr
    frames = {int(row["frame"]) for row in csv.DictReader(out.open())}
    assert 0 < len(frames) < 60 and frames == set(range(len(frames)))  # what could be read is kept
    meta = json.loads((tmp_path / "rows.meta.json").read_text())
    assert meta["complete"] is False and meta["frames"] == len(frames) and meta["declared_frames"] == 60
    assert "of the 60 frames" in meta["warning"]
    assert meta["weights"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert meta["precision"] == "fp32" and meta["engine"] and meta["torch_version"] and meta["emonet_version"]
    # The whole file: complete, exit 0, no warning.
    r = demo_video("--video", whole, "--csv", out, "--weights", "random", "--device", "cpu", "--max-frames", "4")
    assert r.returncode == 0 and "warning: " not in r.stderr.replace("warning: untrained", ""), r.stderr
    meta = json.loads((tmp_path / "rows.meta.json").read_text())
    assert meta["complete"] is True and meta["weights"] == {"source": "random", "sha256": None, "untrained": True}


def test_the_readmes_camera_line_prints_rows_with_numbered_images_for_the_camera(tmp_path):
    # README: `python demo_video.py --video 0`; numbered images stand in for the camera here.
    folder = tmp_path / "frames"
    folder.mkdir()
    face = cv2.resize(cv2.imread(str(SAMPLE_PHOTO)), (160, 160))
    for i in range(6):
        canvas = np.full((200, 320, 3), 50, np.uint8)
        canvas[20:180, 10 + 20 * i:170 + 20 * i] = face
        cv2.imwrite(str(folder / f"{i:04d}.png"), canvas)
    readme = (ROOT / "README.md").read_text()
    assert "python demo_video.py --video 0  " in readme
    r = demo_video("--video", folder / "%04d.png", "--weights", "random", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(r.stdout.splitlines()))
    assert sorted({int(row["frame"]) for row in rows}) == list(range(6)) and rows[0]["face_id"] != ""


def test_small_faces_is_still_accepted_and_says_it_is_the_default(capsys):
    from emonet.apps import video

    args = video.parse_args(["--video", "x.mp4", "--csv", "f.csv", "--small-faces"])
    assert args.small_faces and "--small-faces is the default now" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        video.parse_args(["--help"])
    assert "--small-faces" not in capsys.readouterr().out  # not offered any more


def test_argument_errors_are_one_line_each(clip):
    for argv, message in [(("--batch-size", "0"), "--batch-size must be at least 1, not 0"),
                          (("--start", "5", "--end", "2"), "--end (2 s) must come after --start (5 s)")]:
        r = demo_video("--video", clip, *argv)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
        assert "(see " in r.stderr and "usage:" not in r.stderr


def test_json_lines_on_stdout_carry_the_landmarks_as_the_photo_tools_json(clip, tmp_path):
    # `--jsonl -` is standard output, as `--csv -` is: no file named "-" (nor "-.meta.json") is made.
    r = demo_video("--video", clip, "--weights", "random", "--device", "cpu", "--batch-size", "4", "--max-frames", "3",
                   "--jsonl", "-", "--landmarks", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [line["frame"] for line in lines] == [0, 1, 2] and not list(tmp_path.iterdir())
    for line in lines:
        assert not any(key.startswith("lm") for key in line)
        assert len(line["landmarks"]) == 68 and all(len(p) == 2 and all(isinstance(v, float) for v in p)
                                                    for p in line["landmarks"])


def test_outputs_that_would_overwrite_each_other_are_one_line_before_the_model_loads(clip, tmp_path):
    (tmp_path / "link.csv").symlink_to(tmp_path / "o.mp4")
    for args, message in [
        (["--csv", "-", "--jsonl", "-"], "error: --csv - and --jsonl -: only one output can go to standard output"),
        (["--csv", tmp_path / "f.csv", "--jsonl", f"{tmp_path}/./f.csv"],
         f"error: --csv {tmp_path / 'f.csv'} and --jsonl {tmp_path}/./f.csv name the same file, so one would "
         f"overwrite the other; give each output a name of its own"),
        (["--output", tmp_path / "o.mp4", "--csv", tmp_path / "link.csv"], "name the same file"),
    ]:
        r = demo_video("--video", clip, "--weights", "random", "--device", "cpu", *args)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["link.csv"]


def test_a_file_that_is_no_video_writes_nothing_to_stdout_not_even_a_header(tmp_path):
    (tmp_path / "notimage.jpg").write_text("not an image, nor a video")
    r = demo_video("--video", tmp_path / "notimage.jpg", "--weights", "random", "--device", "cpu", "--csv", "-")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip().splitlines()[-1] == f"error: {tmp_path / 'notimage.jpg'}: no frame could be read (empty, " \
                                                "corrupt, or a codec neither FFmpeg nor OpenCV decodes)"


def test_repeated_video_options_are_a_list_that_needs_out_dir(clip, capsys):
    from emonet.apps import video

    args = video.parse_args(["--video", "a.mp4", "--video", "b.mp4", "c.mp4", "--out-dir", "out"])
    assert args.video == ["a.mp4", "b.mp4", "c.mp4"]
    with pytest.raises(SystemExit) as stop:
        video.parse_args(["--video", str(clip), "--video", str(clip), "--csv", "f.csv"])
    assert stop.value.code == 2
    assert f"{clip} {clip}: several videos (or a folder or pattern) need --out-dir DIR" in capsys.readouterr().err


def test_help_speaks_of_video_and_of_standard_output_for_each_rows_output(capsys):
    from emonet.apps import video

    with pytest.raises(SystemExit):
        video.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a face already followed from frame to frame is kept down to 0.1 under it" in text
    assert "none (each frame is already a face crop)" in text and "photo" not in text.replace("emonet-photo", "")
    assert "--jsonl FILE the same rows as JSON lines; - for standard output" in text
    assert 'in JSON lines "landmarks": [[x, y], ...]' in text and "(--video may be repeated)" in text
