"""Several GPU loops behind one service (emonet.serve.pool), for real on the CPU: sessions spread over the loops,
each loop the same runtime giving the same numbers, a loop that cannot start or that dies said in one line."""
import json
import signal
import subprocess
import sys
import time

import cv2
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from emonet.build import ModelOptions  # noqa: E402
from emonet.serve.pool import LoopPool  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from .conftest import free_port  # noqa: E402
from .test_serve import PHOTO, ROOT, assert_video_rows, children, png_clip, start_server, still_running, strict, \
    stream_replies, video_rows, ws_url  # noqa: E402,F401 - png_clip is a fixture

pytestmark = pytest.mark.slow  # loops in processes of their own


def test_a_session_opens_in_the_loop_with_fewest_and_either_loop_gives_the_same_answer():
    pool = LoopPool(ModelOptions(weights="random", device="cpu"), loops=2)
    try:
        assert pool.about["loops"] == 2 and pool.alive and pool.failure is None
        assert len({loop._helper.proc.pid for loop in pool.loops}) == 2  # two processes
        first, second, request = pool.open(), pool.open(), pool.open(one_shot=True)
        assert pool.sessions == [2, 1]  # the first and the request in loop 0, the second in loop 1
        image = cv2.cvtColor(cv2.imread(str(PHOTO)), cv2.COLOR_BGR2RGB)
        answers = [pool.submit(s, image, 0, 0.0).result(timeout=300) for s in (first, second, request)]
        faces = json.loads(answers[0].faces)
        assert len(faces) == 1 and faces[0]["detected"]
        assert answers[1].faces == answers[0].faces == answers[2].faces  # the same bits, whichever loop
        pool.close_session(request)
        pool.close_session(first)
        assert pool.sessions == [0, 1]
        third = pool.open()
        assert pool.sessions == [1, 1]
        assert json.loads(pool.submit(third, image, 0, 0.0).result(timeout=300).faces) == faces
    finally:
        pool.close()
    assert not pool.alive


def test_after_a_loop_dies_new_sessions_open_in_the_loops_still_running():
    pool = LoopPool(ModelOptions(weights="random", device="cpu", detector="yunet"), loops=2)
    try:
        pool.loops[0]._helper.proc.kill()  # the loop a new session would open in first
        deadline = time.monotonic() + 30
        while pool.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pool.alive and "killed by SIGKILL" in pool.failure
        session = pool.open()
        assert pool.sessions == [0, 1]
        image = cv2.cvtColor(cv2.imread(str(PHOTO)), cv2.COLOR_BGR2RGB)
        assert len(json.loads(pool.submit(session, image, 0, 0.0).result(timeout=300).faces)) == 1
    finally:
        pool.close()


def test_two_streams_at_once_on_two_loops_each_give_the_video_tools_rows(png_clip, tmp_path):
    path, frames = png_clip
    proc, url = start_server("--loops", "2")
    try:
        assert httpx.get(f"{url}/health").json()["loops"] == 2 and len(children(proc.pid)) == 2
        with connect(ws_url(url), max_size=None) as one, connect(ws_url(url), max_size=None) as two:
            replies: list = [[], []]
            for frame in frames:  # both streams open, a frame each in turn
                for k, ws in enumerate((one, two)):
                    ws.send(frame)
                for k, ws in enumerate((one, two)):
                    replies[k].append(strict(ws.recv(timeout=120)))
            assert httpx.get(f"{url}/health").json()["sessions_per_loop"] == [1, 1]  # one in each loop
            metrics = httpx.get(f"{url}/metrics").text
            assert 'emonet_loop_sessions{loop="0"} 1.0' in metrics and 'emonet_loop_sessions{loop="1"} 1.0' in metrics
            assert "emonet_loops_running 2.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert "Traceback" not in proc.stderr.read()
    rows = video_rows(path, tmp_path)
    for k in range(2):
        assert_video_rows(replies[k], rows, len(frames))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_while_the_loops_load_leaves_none_behind(sig):
    proc = subprocess.Popen([sys.executable, "-m", "emonet.apps.serve", "--weights", "random", "--device", "cpu",
                             "--loops", "2", "--port", str(free_port())], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(children(proc.pid)) < 2 and time.monotonic() < deadline:  # both loops started, loading
        time.sleep(0.02)
    loops = children(proc.pid)
    assert len(loops) == 2
    proc.send_signal(sig)
    proc.wait(timeout=60)
    err = proc.stderr.read()  # the loops' output too: read to its end, once they have ended
    assert "Traceback" not in err, err[-2000:]
    # Stopped while loading ("interrupted", 130) or, where the loops were quicker, as a running server stops.
    assert (proc.returncode, err.strip().splitlines()[-1]) in ((130, "interrupted"), (130, "emonet-serve: stopped"))
    assert not still_running(loops)


def test_a_loop_that_dies_is_said_by_health_and_the_others_stop_with_the_server():
    proc, url = start_server("--loops", "2")
    try:
        loops = children(proc.pid)
        assert len(loops) == 2
        with connect(ws_url(url), max_size=None) as one, connect(ws_url(url), max_size=None) as two:  # one a loop
            subprocess.run(["kill", "-KILL", str(loops[1])], check=True)
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/health").status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            health = httpx.get(f"{url}/health")
            assert health.status_code == 503 and "killed by SIGKILL" in health.json()["why"]
            assert health.json()["status"] == "degraded" and health.json()["loops_running"] == 1
            assert health.json()["device"].startswith("cpu") and health.json()["engine"]  # what it runs, still said
            assert (health.json()["streams"], health.json()["max_streams"]) == (2, 2)  # the keys of a ready server
            assert "emonet_loops_running 1.0" in httpx.get(f"{url}/metrics").text
            # The stream whose loop died is told so and closed (the client reconnects); the other goes on.
            replies = []
            for ws in (one, two):
                ws.send(PHOTO.read_bytes())
                replies.append(json.loads(ws.recv(timeout=120)))
            lost = [k for k, r in enumerate(replies) if "error" in r]
            assert len(lost) == 1 and "ended unexpectedly" in replies[lost[0]]["error"], replies
            assert len(replies[1 - lost[0]]["faces"]) == 1
            with pytest.raises(ConnectionClosed) as closed:
                (one, two)[lost[0]].recv(timeout=30)
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1011, "its analysis loop ended; reconnect")
        # The loop that lives goes on answering: a new stream opens there, not in the one that died.
        reply = stream_replies(url, [PHOTO.read_bytes()])[0]
        assert reply["frame"] == 0 and len(reply["faces"]) == 1 and "error" not in reply
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == 130 and "Traceback" not in err  # stopped by SIGTERM, as every tool interrupted
    assert "warning: the analysis loop process ended unexpectedly (killed by SIGKILL" in err  # said when it happened
    assert not still_running(loops[:1])  # the loop that lived ends with the server


def test_loops_that_cannot_load_the_checkpoint_are_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "emonet.apps.serve", "--weights", str(tmp_path / "missing.pth"),
                          "--device", "cpu", "--loops", "2", "--port", str(free_port())], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: checkpoint not found: {tmp_path / 'missing.pth'}") and len(lines) == 1


def test_more_loops_than_it_takes_is_one_line():
    out = subprocess.run([sys.executable, "-m", "emonet.apps.serve", "--loops", "17"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith("python -m emonet.apps.serve: error: --loops takes at most 16")
