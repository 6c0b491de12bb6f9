"""The README's commands, run as written: each bash line of its blocks, in a folder holding the input files
they name (a photo, a clip, a labels CSV) and the checkout's scripts, as a newcomer runs them."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import cv2
import pytest

from emonet.engine.check import SAMPLE_PHOTO

from .test_video import make_clip

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# Lines the suite itself stands for: the set-up (CI installs exactly so), the tests, and the camera
# (tests/test_video.py runs that line with numbered images standing in for the camera).
NOT_HERE = {"pip": "set-up: CI runs it on a clean clone", "pytest": "the suite itself",
            "--video 0": "a camera: test_video.py runs it with numbered images"}


def readme_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines += [line for line in block.splitlines() if shlex.split(line, comments=True)]
    return lines


def runnable() -> list[str]:
    return [line for line in readme_lines() if not any(key in line for key in NOT_HERE)]


def test_the_readme_lines_not_run_here_are_still_in_it():
    lines = readme_lines()
    assert len(runnable()) >= 5
    assert all(any(key in line for line in lines) for key in NOT_HERE), "NOT_HERE names a line no longer there"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A newcomer's folder: the checkout's scripts and the files the README's lines name."""
    here = tmp_path_factory.mktemp("readme")
    for script in ("demo.py", "demo_video.py", "test.py"):
        shutil.copy(ROOT / script, here / script)
    shutil.copy(SAMPLE_PHOTO, here / "photo.jpg")
    make_clip(here / "clip.mp4", frames=10, blank_from=8)
    face = cv2.imread(str(SAMPLE_PHOTO))
    for i, scale in enumerate((1.0, 0.8, 0.6)):
        cv2.imwrite(str(here / f"face{i}.jpg"), cv2.resize(face, None, fx=scale, fy=scale))
    (here / "labels.csv").write_text("image,expression,valence,arousal\nface0.jpg,Happy,0.5,0.2\n"
                                     "face1.jpg,Neutral,0.0,-0.1\nface2.jpg,Sad,-0.4,-0.3\n")
    return here


def command(line: str) -> list[str]:
    argv = shlex.split(line, comments=True)
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    found = shutil.which(argv[0])
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{argv[0]} is not installed: the README's set-up installs it")
        pytest.skip(f"{argv[0]} is not installed here (pip install -e . installs it)")
    return [found, *argv[1:]]


@pytest.mark.parametrize("line", [line for line in runnable() if "emonet-serve" not in line])
def test_a_readme_line_runs_as_written(line, folder):
    done = subprocess.run(command(line), cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    for name in re.findall(r"--(?:json|csv|output) (\S+)", line):
        if name != "-":
            path = folder / name
            written = any(path.iterdir()) if path.is_dir() else path.is_file() and path.stat().st_size > 0
            assert written, f"{line}: {name} not written"


@pytest.mark.parametrize("line", [line for line in runnable() if "emonet-serve" in line])
def test_the_readme_service_line_serves_the_page_and_stops_on_ctrl_c(line, folder):
    log = folder / "serve.log"
    server = subprocess.Popen(command(line), cwd=folder, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline, page = time.monotonic() + 240, None
        while page is None and time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8000/", timeout=5) as answer:
                    page = answer.read().decode()
            except OSError:
                time.sleep(0.5)
        assert page is not None and "<html" in page.lower(), log.read_text()[-3000:]
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()  # never left holding the port
            server.wait()
    assert server.returncode == 130, log.read_text()[-3000:]  # stopped by Ctrl-C, as every tool interrupted
