"""The service's load generator (emonet.bench.load): frames as a camera sends them, and a server's limit said."""
import re
import signal
import subprocess
import sys

import numpy as np
import pytest


@pytest.mark.parametrize("size, keep", [((1280, 720), (slice(None), slice(160, 1120))),
                                        ((480, 800), (slice(220, 580), slice(None)))])
def test_serve_load_sends_a_clip_as_a_4_3_camera_would_its_centre_unstretched(tmp_path, size, keep):
    import cv2

    from emonet.bench.load import camera_frames
    from emonet.io.writer import VideoWriter

    width, height = size
    frame = np.zeros((height, width, 3), np.uint8)
    frame[..., 0] = 200  # red where the camera's 4:3 frame does not reach
    frame[keep] = (30, 180, 60)
    path = tmp_path / "wide.mp4"
    writer = VideoWriter(path, 30.0, (width, height))
    for _ in range(3):
        writer.write(frame)
    writer.close()
    frames = camera_frames(path, count=2)
    assert len(frames) == 2
    image = cv2.cvtColor(cv2.imdecode(np.frombuffer(frames[0], np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    assert image.shape == (480, 640, 3)
    # Every pixel from the centre's colour (a stretched frame would bring the red sides in).
    inner = image[4:-4, 4:-4].astype(int)
    assert np.abs(inner - (30, 180, 60)).max() < 40


@pytest.mark.slow  # a server in a process of its own
def test_counts_over_the_servers_limit_are_said_and_not_run_and_a_clip_it_cannot_read_is_one_line(tmp_path):
    pytest.importorskip("fastapi")
    from websockets.sync.client import connect

    from .test_serve import ROOT, start_server

    import cv2

    text = tmp_path / "notes.mp4"
    text.write_text("not a video")
    empty = tmp_path / "empty.avi"
    cv2.VideoWriter(str(empty), cv2.VideoWriter_fourcc(*"MJPG"), 30, (64, 48)).release()  # a video of no frames
    bench = [sys.executable, "-m", "emonet.bench", "--serve-seconds", "1", "--serve-load"]
    proc, url = start_server()  # a CPU's default: 2 streams
    try:
        some = subprocess.run([*bench, url, "--serve-streams", "2,4", "--serve-warmup", "1"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        none = subprocess.run([*bench, url, "--serve-streams", "4,8"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        bad = subprocess.run([*bench, url, "--serve-clip", str(text)], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
        hollow = subprocess.run([*bench, url, "--serve-clip", str(empty)], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        with connect(url.replace("http", "ws", 1) + "/v1/stream"):  # another client holds one of the two
            full = subprocess.run([*bench, url, "--serve-streams", "2", "--serve-warmup", "1"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=300)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert some.returncode == 0, some.stderr[-2000:]
    rows = [line for line in some.stdout.splitlines() if line.startswith("| ")]
    assert rows[-2].startswith("| 2 | 30 | 60 |")  # two streams (the limit: the warm-up's closed), 1 s at 30 frames/s
    # One stream first, not in the table: its first frame's round trip against its last second's.
    assert re.search(r"Warm-up: 1 stream for 1 s before the counts, not in the table: the first frame answered in "
                     r"[0-9.]+ ms, the last [0-9]+ at p50 [0-9.]+ ms \([0-9]+ of 30 frames answered\)\.",
                     some.stdout), some.stdout
    assert rows[-1] == "| 4 | not run: the server takes at most 2 streams (its --max-streams) |"
    # The warm-up takes the one stream left; of the count's two, the server refuses one: said in the row and in a
    # line, never a traceback, and the run does not pass for whole (exit 1).
    assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr[-2000:]
    assert full.stderr.strip().splitlines()[-1].startswith("error: not every stream ran as asked")
    assert "Warm-up: 1 stream for 1 s" in full.stdout
    row = [line for line in full.stdout.splitlines() if line.startswith("| 2 ")][0]
    # One stream's second of frames; the refused stream's first frame may leave before its refusal comes back.
    assert re.match(r"\| 2 \(1 refused\) \| 30 \| 3[01] \|", row), row
    assert "<!-- 2 streams: 1 error, first: the server is at its limit of 2 streams" in full.stdout, full.stdout
    for out, line in ((none, f"error: {url}: the server takes at most 2 streams and 4 or more were asked for: start "
                                   f"it with --max-streams 8, or ask for fewer (--serve-streams)"),
                      (bad, f"error: {text}: not a video this can read"),
                      (hollow, f"error: {empty}: a video with no frames")):
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert out.stderr.strip().splitlines()[-1].startswith(line)


def test_client_processes_results_merge_into_one_every_count_added_and_every_list_joined():
    from dataclasses import fields

    from emonet.bench.load import LoadResult

    def part(k: int) -> LoadResult:
        # Every field set, so a field left out of the merge shows as missing below.
        result = LoadResult(16, 30.0, mean_batch=7.0)
        for f in fields(LoadResult):
            value = getattr(result, f.name)
            if f.name not in ("streams", "fps", "mean_batch"):
                setattr(result, f.name, [f"{f.name}{k}"] if isinstance(value, list) else k + 1)
        return result

    merged = LoadResult.merged(32, 30.0, [part(1), part(2)])
    assert (merged.streams, merged.fps, merged.mean_batch) == (32, 30.0, None)
    for f in fields(LoadResult):
        if f.name not in ("streams", "fps", "mean_batch"):
            value = getattr(merged, f.name)
            assert value == ([f"{f.name}1", f"{f.name}2"] if isinstance(value, list) else 5), f.name
