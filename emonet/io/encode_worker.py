"""An encoding child process of :class:`emonet.io.annotated.AnnotatedVideoWriter`.

Run as a script (``python encode_worker.py``), so it imports OpenCV, NumPy and PyAV, never torch: it
starts in a fraction of a second. Encoding in a process of its own keeps PyAV's per-frame Python work
(wrapping each frame for FFmpeg) off the analysing process's GIL; x264's threads do the rest.

Protocol. The parent writes messages on stdin (:mod:`.ipc`'s length-prefixed pickles; the parent is this
process's own creator: nothing else writes there):

- ``("open", spec)``: the slot file to map, slot count and size, frame size, frame rate, codec, encoder
  threads;
- ``("frames", path, [(slot, index), ...])``: append the I420 frames in these slots to the file ``path``
  (a new path finishes the previous one: the parent's segments);
- ``("end",)``: finish the open file and exit.

The child answers one text line each on stdout: ``O`` (the slot file is mapped), ``R slot`` (the slot may be
reused: each frame is given back once copied for the encoder), ``S frames path`` (a file is finished),
``T encode user system`` (seconds spent encoding, and the process's CPU seconds, x264's threads included,
at the end), ``E message`` (a failure; later frames are then only released).
It ignores Ctrl-C: the parent, which sees it too, ends the run by sending ``end``, so every frame handed
over is kept.
"""
from __future__ import annotations

import mmap
import resource
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package, wherever it is installed
    import numpy as np

    from emonet.io.ipc import messages
    from emonet.io.writer import VideoWriter

    out = sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

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
            say("O")  # mapped: the parent may remove the file's name
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


if __name__ == "__main__":
    sys.exit(main())
