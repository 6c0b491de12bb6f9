"""An encoding child process of :class:`emonet.io.annotated.AnnotatedVideoWriter`.

Started by :func:`emonet.io.helper.start_helper`; it imports OpenCV, NumPy and PyAV, never torch: it starts in
a fraction of a second. Encoding in a process of its own keeps PyAV's per-frame Python work
(wrapping each frame for FFmpeg) off the analysing process's GIL; x264's threads do the rest.

Protocol. The parent writes messages on stdin (:mod:`.ipc`'s length-prefixed pickles; the parent is this
process's own creator: nothing else writes there):

- ``("open", spec)``: the slot file to map, slot count and size, frame size, frame rate, codec, encoder
  threads;
- ``("frames", path, [(slot, index), ...])``: append the I420 frames in these slots to the file ``path``
  (a new path finishes the previous one: the parent's segments);
- ``("end",)``: finish the open file and exit.

The child answers one text line each on stdout: ``O path`` (the slot file is mapped), ``R slot`` (the slot may be
reused: each frame is given back once copied for the encoder), ``S frames path`` (a file is finished),
``T encode user system`` (seconds spent encoding, and the process's CPU seconds, x264's threads included,
at the end), ``E message`` (a failure; later frames are then only released).
It ignores Ctrl-C (as every helper does): the parent, which sees it too, ends the run by sending ``end``, so
every frame handed over is kept.

:func:`start` starts one; :class:`Spare` keeps one started ahead of the video that will take it.
"""
from __future__ import annotations

import importlib
import mmap
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from .helper import start_helper

# Every file is closed and every line said when main returns: skip the interpreter's tear-down (tens of
# ms), which the parent would wait for at the end of each video.
FAST_EXIT = True

# Each frame handed to FFmpeg gets a buffer of a few MB: glibc would map and unmap it at every frame, the
# kernel zeroing fresh pages each time (system time rivalling x264's own); kept on the heap, it is reused.
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def start() -> subprocess.Popen:
    """Start an encoding process (pipes to and from it); it waits for ``open``."""
    return start_helper("emonet.io.encode_worker:main", env=WORKER_ENV)


class Spare:
    """One encoding process started ahead of the video that will take it: its start-up (Python, NumPy, PyAV;
    about half a second on a busy server) then runs before that video's first frames, not after them."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = start()

    def take(self) -> subprocess.Popen:
        """The started process, yours to use; the next one starts now, for the next video."""
        proc, self._proc = self._proc, start()
        return proc

    def close(self) -> None:
        """End the process not taken, at once (it may be still starting: nothing of it is kept)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
            self._proc = None


def main() -> int:
    import numpy as np

    from emonet.io.ipc import messages
    from emonet.io.writer import VideoWriter
    try:  # PyAV now, while this process waits for its video, not when its first frames come
        importlib.import_module("av")
    except ImportError:  # the writer says so, if the video needs it
        pass

    out = sys.stdout

    def say(line: str) -> None:
        try:
            out.write(line + "\n")
            out.flush()
        except OSError:  # the parent has ended (a spare's, say): no one listens, and the exit stays quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())

    slots = spec = writer = None
    failed = False
    encode = 0.0

    def finish() -> None:
        nonlocal writer
        if writer is not None:
            frames, path = writer.frames, writer.close()
            writer = None
            if path is not None:
                say(f"S {frames} {path}")

    for message in messages(sys.stdin.buffer):
        kind = message[0]
        if kind == "open":
            spec = message[1]
            with open(spec["slots_path"], "r+b") as fh:
                memory = mmap.mmap(fh.fileno(), 0)
            whole = np.frombuffer(memory, np.uint8)
            w, h = spec["size"]
            slots = [whole[i * spec["slot_bytes"]:][: w * h * 3 // 2] for i in range(spec["slots"])]
            say(f"O {spec['slots_path']}")  # mapped: the parent may remove the file's name
        elif kind == "frames":
            _, path, frames = message
            for slot, index in frames:
                if not failed:  # after a failure, frames are only given back
                    try:
                        t0 = time.perf_counter()
                        if writer is None or writer.path != Path(path):
                            finish()
                            writer = VideoWriter(path, spec["fps"], tuple(spec["size"]), codec=spec["codec"],
                                                 threads=spec["threads"])
                        writer.write_i420(slots[slot], index)
                        encode += time.perf_counter() - t0
                    except Exception as exc:  # reported once; the parent turns it into one line
                        failed = True
                        say("E " + f"{type(exc).__name__}: {exc}".replace("\n", " "))
                say(f"R {slot}")  # copied for the encoder: the slot may take the next frame at once
        elif kind == "end":
            break
    try:
        finish()
    except Exception as exc:
        say("E " + f"{type(exc).__name__}: {exc}".replace("\n", " "))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    say(f"T {encode:.6f} {usage.ru_utime:.3f} {usage.ru_stime:.3f}")
    return 0

