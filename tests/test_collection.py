"""Many videos in one run: per-video rows, summaries and plots, summary.csv, reruns, and torchrun shards."""
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emonet.apps.collection import collect_videos, shares
from emonet.errors import InputError

from .test_video import make_clip

pytestmark = pytest.mark.slow  # end-to-end: the tools in processes of their own

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--weights", "random", "--device", "cpu", "--batch-size", "4"]


def demo_video(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "demo_video.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recordings")
    make_clip(folder / "a.mp4", frames=10)
    make_clip(folder / "b.mp4", frames=14, blank_from=9)
    (folder / "sub").mkdir()
    make_clip(folder / "sub" / "c.mp4", frames=6)
    (folder / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 this is not a video")
    return folder


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def one_thread():
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # as torchrun gives each of its processes


@pytest.fixture(scope="module")
def single_run(recordings, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "out"
    result = demo_video("--video", recordings, "--out-dir", out, *COMMON, env=one_thread())
    return out, result


def test_a_folder_with_a_corrupt_file_gives_every_output_and_summary(recordings, single_run):
    out, result = single_run
    assert result.returncode == 1, result.stderr  # one video failed; the others are done
    assert "broken.mp4" in result.stderr and "Traceback" not in result.stderr
    for stem, frames in (("a", 10), ("b", 14), ("c", 6)):
        rows = read_csv(out / f"{stem}.csv")
        assert [int(r["frame"]) for r in rows] == list(range(frames))
        record = json.loads((out / f"{stem}.summary.json").read_text())
        assert record["frames"] == frames and record["error"] is None and record["untrained"] is True
        face_rows = [r for r in rows if r["face_id"] == "0"]
        (face,) = record["faces"]
        assert face["frames"] == len(face_rows)
        assert face["valence_mean"] == pytest.approx(np.mean([float(r["valence"]) for r in face_rows]), abs=1e-4)
        assert face["arousal_std"] == pytest.approx(np.std([float(r["arousal"]) for r in face_rows]), abs=1e-4)
        shares_sum = sum(v for k, v in face.items() if k.startswith("share_"))
        assert shares_sum == pytest.approx(1.0, abs=1e-4)
        png = (out / f"{stem}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000  # a real plot, not an empty canvas
    summary = read_csv(out / "summary.csv")
    assert [Path(r["video"]).name for r in summary] == ["a.mp4", "b.mp4", "broken.mp4", "c.mp4"]
    assert [r["error"] != "" for r in summary] == [False, False, True, False]
    assert summary[0]["face_id"] == "0" and summary[0]["dominant_expression"] and "share_Happy" in summary[0]
    assert not list(out.glob(".*"))  # no temporary file left
    # Every video given is counted, each as read or failed.
    assert f"summary: {out / 'summary.csv'} (4 videos: 3 read, 1 failed)" in result.stderr
    assert "\n4 videos: 3 read, 1 failed; 30 frames: " in result.stderr


def test_repeated_video_options_add_their_videos(recordings, tmp_path):
    out = tmp_path / "out"
    r = demo_video("--video", recordings / "sub" / "c.mp4", "--video", recordings / "broken.mp4", "--out-dir", out,
                   *COMMON)
    assert r.returncode == 1 and "broken.mp4: not a video" in r.stderr, r.stderr
    assert [Path(row["video"]).name for row in read_csv(out / "summary.csv")] == ["c.mp4", "broken.mp4"]
    assert len(read_csv(out / "c.csv")) == 6
    assert r.stderr.strip().splitlines()[-1] == f"summary: {out / 'summary.csv'} (2 videos: 1 read, 1 failed)"


def test_a_rerun_skips_complete_videos_and_force_redoes_them(recordings, single_run, tmp_path):
    out, _ = single_run
    copy = tmp_path / "out"
    copy.mkdir()
    for f in out.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "c.png").unlink()  # an incomplete video: processed again
    before = (copy / "a.csv").stat().st_mtime_ns
    again = demo_video("--video", recordings, "--out-dir", copy, *COMMON)
    assert again.returncode == 1 and "2 skipped" in again.stderr and "2 to process" in again.stderr
    assert (copy / "c.png").exists() and (copy / "a.csv").stat().st_mtime_ns == before
    forced = demo_video("--video", recordings / "a.mp4", "--out-dir", copy, "--force", *COMMON)
    assert forced.returncode == 0 and "0 skipped" in forced.stderr
    assert (copy / "a.csv").stat().st_mtime_ns != before


def test_torchrun_with_two_processes_gives_the_outputs_of_one(recordings, single_run, tmp_path):
    out, _ = single_run
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(ROOT / "demo_video.py"), "--video", str(recordings), "--out-dir", str(tmp_path),
                             *COMMON], capture_output=True, text=True, timeout=600, env=one_thread())
    assert result.returncode != 0 and "broken.mp4" in result.stderr  # the corrupt file is still reported
    assert "rank 0" in result.stderr and "rank 1" in result.stderr  # both processes took videos
    assert "all 2 processes: 30 frames" in result.stderr  # and their throughput is reported together
    names = sorted(p.name for p in out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    for name in names:
        if name.endswith((".csv", ".json")):
            assert (tmp_path / name).read_text() == (out / name).read_text(), name


def test_shares_balance_frame_counts():
    assert shares([100, 10, 60, 50], 2) == [[0, 1], [2, 3]]  # 110 frames each
    assert shares([100, 10, 20, 30], 2) == [[0], [1, 2, 3]]
    assert shares([5, 5, 5], 1) == [[0, 1, 2]]
    assert shares([1], 3) == [[0], [], []]


def test_collect_videos_refuses_missing_paths_and_clashing_names(recordings, tmp_path):
    with pytest.raises(InputError, match="no such video"):
        collect_videos([str(tmp_path / "missing.mp4")])
    with pytest.raises(InputError, match="matches"):
        collect_videos([str(tmp_path / "*.mp4")])
    (tmp_path / "x").mkdir()
    make_clip(tmp_path / "x" / "a.mp4", frames=2)
    with pytest.raises(InputError, match="same outputs"):
        collect_videos([str(recordings), str(tmp_path / "x")])
    found = collect_videos([str(recordings / "*.mp4"), str(recordings / "sub")])
    assert [p.name for p in found] == ["a.mp4", "b.mp4", "broken.mp4", "c.mp4"]


def test_a_missing_path_is_one_line_and_leaves_no_folder(tmp_path):
    out = demo_video("--video", tmp_path / "nowhere", "--out-dir", tmp_path / "out", *COMMON)
    assert out.returncode == 2 and out.stderr.strip().endswith("no such video file or folder")
    assert "Traceback" not in out.stderr and not (tmp_path / "out").exists()


def test_annotated_videos_of_a_collection_each_have_their_own_frames(recordings, single_run, tmp_path):
    from .test_video import probe

    # The next video starts before the last one's final frames are written: each file still gets its own.
    result = demo_video("--video", recordings / "a.mp4", recordings / "sub" / "c.mp4", "--out-dir", tmp_path,
                        "--output-videos", *COMMON, env=one_thread())
    assert result.returncode == 0, result.stderr
    for stem, frames in (("a", 10), ("c", 6)):
        info = probe(tmp_path / f"{stem}.mp4")
        assert (info["codec"], info["pix_fmt"], info["frames"]) == ("h264", "yuv420p", frames)
        assert (tmp_path / f"{stem}.csv").read_text() == (single_run[0] / f"{stem}.csv").read_text()


def test_sigterm_ends_a_collection_cleanly_and_a_rerun_finishes_it(tmp_path):
    import signal
    import time

    folder = tmp_path / "in"
    folder.mkdir()
    for name in "pqr":
        make_clip(folder / f"{name}.mp4", frames=8)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(ROOT / "demo_video.py"), "--video", str(folder), "--out-dir",
                             str(out), *COMMON], stderr=subprocess.PIPE, text=True, env=one_thread())
    deadline = time.monotonic() + 300
    while not (out / "p.summary.json").exists() and time.monotonic() < deadline:  # the first video is done
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    done = {p.name.split(".")[0] for p in out.glob("*.summary.json")}
    assert "p" in done and len(done) < 3
    for stem in done:  # a finished video has every output, whole
        assert len(read_csv(out / f"{stem}.csv")) == 8 and (out / f"{stem}.png").exists()
    assert not list(out.glob(".*"))  # no partial file left behind
    again = demo_video("--video", folder, "--out-dir", out, *COMMON, env=one_thread())
    assert again.returncode == 0, again.stderr
    assert f"{len(done)} skipped" in again.stderr and len(list(out.glob("*.summary.json"))) == 3


def test_a_video_without_a_face_has_its_frames_and_says_no_face(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    make_clip(folder / "quiet.mp4", frames=6, blank_from=0)
    out = tmp_path / "out"
    result = demo_video("--video", folder / "quiet.mp4", "--out-dir", out, *COMMON, env=one_thread())
    assert result.returncode == 0, result.stderr
    (row,) = read_csv(out / "summary.csv")
    assert row["frames"] == "6" and row["note"] == "no face" and row["error"] == "" and row["untrained"] == "1"
    assert "1 video:" in result.stderr and "1 videos" not in result.stderr and "(1 video)" in result.stderr
    assert json.loads((out / "quiet.summary.json").read_text())["provenance"]["weights"]["untrained"] is True


def test_devices_start_a_worker_each_and_give_the_outputs_of_one_process(recordings, single_run, tmp_path):
    out, _ = single_run
    common = [c for c in COMMON if c not in ("--device", "cpu")]
    result = demo_video("--video", recordings, "--out-dir", tmp_path, "--devices", "cpu,cpu", *common,
                        env=one_thread())
    assert result.returncode == 1 and "broken.mp4" in result.stderr and "Traceback" not in result.stderr
    assert "rank 0 (cpu)" in result.stderr and "rank 1 (cpu)" in result.stderr
    assert "all 2 processes: 30 frames" in result.stderr
    # Each worker's start-up line counts from the job's start (not its fork), its stages named as they ran.
    lines = [line for line in result.stderr.splitlines() if line.startswith("first results")]
    assert len(lines) == 2, result.stderr
    for line in lines:
        stages = dict((name, float(seconds)) for name, seconds in
                      re.findall(r"([A-Za-z][A-Za-z ,'-]+?) (\d+\.\d+) s", line.split(": ", 1)[1]))
        assert list(stages)[:5] == ["Python start-up and imports", "reading the videos' headers",
                                    "starting the worker", "model, engine and warm-up",
                                    "waiting for the other processes"], line
        assert stages["Python start-up and imports"] >= 0.3, line  # the parent's: torch's import is in it
    names = sorted(p.name for p in out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    for name in names:
        if name.endswith((".csv", ".json")):
            assert (tmp_path / name).read_text() == (out / name).read_text(), name


def test_devices_refuse_what_is_not_a_device(recordings, tmp_path):
    for spec, says in (("gpu0", "is not a device"), ("cuda:0,cuda:0", "does not exist here")):
        result = demo_video("--video", recordings, "--out-dir", tmp_path, "--devices", spec, *COMMON)
        assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


def test_ctrl_c_stops_every_worker_cleanly_keeping_the_finished_videos(tmp_path):
    import signal
    import time

    folder = tmp_path / "in"
    folder.mkdir()
    for name, frames in (("a_short", 6), ("b_short", 6), ("c_long", 400), ("d_long", 400)):
        make_clip(folder / f"{name}.mp4", frames=frames)
    out = tmp_path / "out"
    common = [c for c in COMMON if c not in ("--device", "cpu")]
    proc = subprocess.Popen([sys.executable, str(ROOT / "demo_video.py"), "--video", str(folder), "--out-dir",
                             str(out), "--devices", "cpu,cpu", *common], stderr=subprocess.PIPE, text=True,
                            env=one_thread())
    seen, finished = "", 0
    while finished < 2:  # each worker done with its short video: both are in their long one now
        line = proc.stderr.readline()
        assert line, f"ended early: {seen}"
        seen += line
        finished += "_short.mp4: 6 frames" in line
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, seen + rest
    assert "Traceback" not in seen + rest and rest.count("interrupted") >= 2
    for stem in ("a_short", "b_short"):
        assert (out / f"{stem}.summary.json").is_file() and (out / f"{stem}.png").is_file()
    assert not (out / "c_long.summary.json").exists() and not (out / "d_long.summary.json").exists()
    summary = read_csv(out / "summary.csv")
    assert [r["error"] for r in summary if "long" in r["video"]] == ["not processed (interrupted)"] * 2
    assert not list(out.glob(".*"))  # nothing half-written
