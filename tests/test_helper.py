"""Helper processes (emonet.io.helper): started one way, deaf to Ctrl-C, and a death said with its reason."""
import os
import signal
import time
from pathlib import Path

import pytest

from emonet.io.helper import died, start_helper, widen_pipe


def test_a_helper_ignores_ctrl_c_and_finishes_when_its_input_closes():
    proc = start_helper("emonet.summary:serve_plots")  # the plotting helper: reads messages until stdin closes
    proc.send_signal(signal.SIGINT)  # at once: long before the interpreter runs its first statement
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while not _ignores_sigint(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    time.sleep(0.3)
    assert proc.poll() is None  # Ctrl-C and a stop to the whole job are the parent's to handle
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def _ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT (Linux: its SigIgn mask in /proc)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def test_a_helper_that_dies_is_said_with_its_reason():
    proc = start_helper("emonet.summary:serve_plots")
    proc.kill()
    assert died("plotting", proc) == "the plotting process ended unexpectedly (killed by SIGKILL (out of memory?))"
    proc = start_helper("emonet.io.helper:no_such_function", quiet=True)  # fails at start: exit code 1
    assert died("test", proc) == "the test process ended unexpectedly (exit code 1)"


def test_a_stream_helpers_pipes_hold_a_dozen_camera_frames_where_the_system_allows():
    # A reading thread takes in at most a pipe's worth a read and may wait a switch interval for the interpreter
    # between reads (see PIPE_BYTES): through 64 KiB, fewer frames a second than a few dozen streams send.
    fcntl = pytest.importorskip("fcntl")
    from emonet.io.helper import PIPE_BYTES

    allowed = int(Path("/proc/sys/fs/pipe-max-size").read_text())
    if allowed < 12 * 67 << 10:
        pytest.skip(f"this system's pipes hold at most {allowed} bytes")
    proc = start_helper("emonet.summary:serve_plots", pipe_bytes=PIPE_BYTES)
    plain = start_helper("emonet.summary:serve_plots")  # a helper of small messages keeps the default
    try:
        for pipe in (proc.stdin, proc.stdout):
            assert fcntl.fcntl(pipe.fileno(), 1032) == min(PIPE_BYTES, allowed)  # F_GETPIPE_SZ
        assert fcntl.fcntl(plain.stdin.fileno(), 1032) == 1 << 16
    finally:
        for p in (proc, plain):
            p.stdin.close()
            assert p.wait(timeout=30) == 0


def test_a_pipe_asked_for_more_than_the_system_allows_gets_the_most_it_does():
    pytest.importorskip("fcntl")
    allowed = int(Path("/proc/sys/fs/pipe-max-size").read_text())
    read, write = os.pipe()
    try:
        assert widen_pipe(write, 4 * allowed) == allowed  # halved until the system takes it
        assert widen_pipe(write, 1 << 12) == allowed  # never below Linux's default: left as it is
    finally:
        os.close(read)
        os.close(write)
