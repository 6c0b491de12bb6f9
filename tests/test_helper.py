"""Helper processes (emonet.io.helper): started one way, deaf to Ctrl-C, and a death said with its reason."""
import signal
import time

from emonet.io.helper import died, start_helper


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


def test_a_helpers_pipes_hold_a_dozen_camera_frames_where_the_system_allows():
    # A reading thread takes in at most a pipe's worth a read and may wait a switch interval for the interpreter
    # between reads (see PIPE_BYTES): through 64 KiB, fewer frames a second than a few streams send.
    import fcntl

    from emonet.io.helper import PIPE_BYTES

    allowed = int(open("/proc/sys/fs/pipe-max-size").read())
    proc = start_helper("emonet.summary:serve_plots")
    try:
        for pipe in (proc.stdin, proc.stdout):
            assert fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ) >= min(PIPE_BYTES, allowed) >= 12 * 69_000
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
