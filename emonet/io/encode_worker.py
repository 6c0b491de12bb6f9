"""An encoding child process of :class:`emonet.io.annotated.AnnotatedVideoWriter`.

Started by :func:`emonet.io.helper.start_helper`; it imports OpenCV, NumPy and PyAV, never torch: it starts in
a fraction of a second. Encoding in a process of its own keeps PyAV's per-frame Python work
(wrapping each frame for FFmpeg) off the analysing process's GIL; x264's threads do the rest.

Protocol: :mod:`.ipc` messages both ways; the frames themselves are in an :class:`.ipc.Ring`. The parent sends:

- ``("open", spec)``: the ring to attach (``ring``, ``slots``), the frame ``size``, ``fps``, the output
  ``path``, ``codec`` and encoder ``threads``;
- ``("frames", [(slot, index), ...])``: append the I420 frames in these slots;
- ``("end",)``: finish the file and exit.

The child answers ``("mapped", ring)`` (the ring is attached: the parent may remove its name), ``("released",
slot)`` (the slot may be reused: each frame is given back once copied for the encoder), ``("written",
frames)`` (the file is finished), ``("times", encode, user, system)`` (seconds spent encoding, and the
process's CPU seconds, x264's threads included, at the end), ``("error", message)`` (a failure; later
frames are then only released). It ignores Ctrl-C and SIGTERM (as every helper does): the parent, which sees
them too, ends the run by sending ``end``, so every frame handed over is kept.

:func:`start` starts one; :class:`Spare` keeps one started ahead of the video that will take it.
"""
from __future__ import annotations

import importlib
import os
import resource
import subprocess
import sys
import time
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
    from emonet.io.ipc import Ring, messages, send
    from emonet.io.writer import VideoWriter
    try:  # PyAV now, while this process waits for its video, not when its first frames come
        importlib.import_module("av")
    except ImportError:  # the writer says so, if the video needs it
        pass

    out = sys.stdout.buffer

    def say(*message) -> None:
        try:
            send(out, message)
        except OSError:  # the parent has ended (a spare's, say): no one listens, and the exit stays quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())

    ring = spec = writer = None
    failed = False
    encode = 0.0
    for message in messages(sys.stdin.buffer):
        kind = message[0]
        if kind == "open":
            spec = message[1]
            if ring is not None:  # made ahead for another frame size: given up for this one
                ring.close()
            ring = Ring.attach(spec["ring"], spec["slots"])
            w, h = spec["size"]
            say("mapped", spec["ring"])
        elif kind == "frames":
            for slot, index in message[1]:
                if not failed:  # after a failure, frames are only given back
                    try:
                        t0 = time.perf_counter()
                        if writer is None:
                            writer = VideoWriter(spec["path"], spec["fps"], tuple(spec["size"]), codec=spec["codec"],
                                                 threads=spec["threads"])
                        writer.write_i420(ring.view(slot, (w * h * 3 // 2,)), index)
                        encode += time.perf_counter() - t0
                    except Exception as exc:  # reported once; the parent turns it into one line
                        failed = True
                        say("error", f"{type(exc).__name__}: {exc}".replace("\n", " "))
                say("released", slot)  # copied for the encoder: the slot may take the next frame at once
        elif kind == "end":
            break
    if writer is not None:
        try:
            frames = writer.frames
            if writer.close() is not None:
                say("written", frames)
        except Exception as exc:
            say("error", f"{type(exc).__name__}: {exc}".replace("\n", " "))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    say("times", encode, usage.ru_utime, usage.ru_stime)
    return 0
