"""The library's lines and progress bars (emonet.log): plain lines off a terminal, tqdm's bar on one."""
from __future__ import annotations

import io
import time

from emonet.log import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_short_job_writes_no_bar():
    log = io.StringIO()
    for _ in progress_bar(range(50), file=log, unit="frame"):
        pass
    assert log.getvalue() == ""


def test_off_a_terminal_a_long_job_writes_whole_lines_and_no_carriage_return():
    log = io.StringIO()
    bar = progress_bar(total=6, every=0.02, file=log, unit="frame", desc="clip.mp4")
    for _ in range(6):
        time.sleep(0.03)
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) >= 2 and all(line.startswith("clip.mp4:") for line in lines)
    assert "6/6" in lines[-1]


def test_on_a_terminal_the_bar_is_tqdms_own():
    screen = _Terminal()
    for _ in progress_bar(range(3), file=screen, mininterval=0):
        pass
    assert "\r" in screen.getvalue() and "3/3" in screen.getvalue()


def test_off_a_terminal_other_lines_written_meanwhile_stay_lines_of_their_own():
    from tqdm import tqdm

    log = io.StringIO()
    for i in progress_bar(range(3), every=0.01, file=log, desc="photos"):
        time.sleep(0.02)
        tqdm.write(f"image {i}: one face", file=log)
    lines = log.getvalue().splitlines()
    assert [line for line in lines if line.startswith("image")] == [f"image {i}: one face" for i in range(3)]
    assert all(line.startswith(("image", "photos:")) for line in lines)
