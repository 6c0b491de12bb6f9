"""Where frames come from (emonet.video.sources): a live network stream read as it comes, through the video tool."""
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import free_port

pytestmark = pytest.mark.slow  # the tool and a sender in processes of their own

ROOT = Path(__file__).resolve().parents[1]

SENDER = """if True:
    import sys, time, av, numpy as np, cv2
    port, frames, photo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    face = cv2.resize(cv2.imread(photo), (200, 200))
    print("ready", flush=True)
    out = av.open(f"tcp://127.0.0.1:{port}?listen=1", mode="w", format="mpegts")
    stream = out.add_stream("mpeg2video", rate=10)
    stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
    for i in range(frames):
        canvas = np.full((240, 320, 3), 90, np.uint8)
        canvas[20:220, 10 + 5 * i:210 + 5 * i] = face
        for packet in stream.encode(av.VideoFrame.from_ndarray(canvas, format="bgr24")):
            out.mux(packet)
        time.sleep(0.1)  # a live sender: 10 frames a second, whatever the reader does
    for packet in stream.encode(None):
        out.mux(packet)
    out.close()
"""


def test_a_live_tcp_stream_gives_a_row_per_frame_analysed_and_counts_the_frames_dropped(tmp_path):
    port, sent = free_port(), 20
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(port), str(sent),
                               str(ROOT / "emonet" / "engine" / "astronaut.jpg")], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert sender.stdout.readline() == "ready\n"
        time.sleep(0.5)  # listening
        rows_path = tmp_path / "live.csv"
        out = subprocess.run([sys.executable, "-m", "emonet.apps.video", "--video", f"tcp://127.0.0.1:{port}",
                              "--csv", str(rows_path), "--weights", "random", "--device", "cpu"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        sender.wait(timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = list(csv.DictReader(rows_path.open()))
    meta = json.loads(rows_path.with_suffix(".meta.json").read_text())
    frames = [int(r["frame"]) for r in rows]
    assert frames == sorted(set(frames)) and meta["frames"] == len(frames)
    assert meta["frames"] + meta["dropped_frames"] == sent and meta["complete"] is True  # every frame received
    times = [float(r["timestamp"]) for r in rows]
    assert times == sorted(times) and times[-1] <= (sent - 1) / 10 + 0.05  # the stream's presentation times
    assert all(r["face_id"] != "" for r in rows)  # the face was found in every analysed frame
    if meta["dropped_frames"]:
        assert f"note: {meta['dropped_frames']} frames of the live source were dropped" in out.stderr


def test_a_stream_nobody_sends_is_one_line():
    port = free_port()  # nothing listens there
    out = subprocess.run([sys.executable, "-m", "emonet.apps.video", "--video", f"tcp://127.0.0.1:{port}",
                          "--weights", "random", "--device", "cpu"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == (
        f"error: tcp://127.0.0.1:{port}: the stream could not be opened (nothing answered or sent video within 10 s; "
        f"check the address, and that the sender is running)")
