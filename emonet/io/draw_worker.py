"""A drawing-and-encoding child process of :class:`emonet.io.annotated.AnnotatedVideoWriter`.

Run as a script (``python draw_worker.py``), so it imports OpenCV, NumPy, PyAV and the package's drawing
code, never torch: it starts in a fraction of a second. Drawing and encoding in processes of their own
take them off the parent's GIL, and several of them encode segments of the video side by side.

Protocol. The parent writes messages on stdin, each a 4-byte big-endian length and a pickle (the parent
is this process's own creator: nothing else writes there):

- ``("open", spec)``: the slot file to map, slot size, class names, banner, frame rate, codec, encoder
  threads;
- ``("frame", segment, path, slot, index, (h, w), faces, colors)``: draw the frame in ``slot`` (``faces``:
  ``(FaceResult, trail)`` pairs) and append it to the segment's file ``path`` (a new segment closes the
  previous one);
- ``("end",)``: finish the open segment and exit.

The child answers one text line each on stdout: ``R slot`` (the slot may be reused), ``S path frames``
(a segment file is finished), ``T draw encode user system`` (seconds spent drawing and encoding, and the process's CPU seconds, at
the end), ``E message`` (a failure;
later frames are then only released). It ignores Ctrl-C: the parent, which sees it too, ends the run
by sending ``end``, so every frame handed over is kept.
"""
from __future__ import annotations

import mmap
import pickle
import signal
import struct
import sys
import time
from pathlib import Path


def _messages(stream):
    while True:
        header = stream.read(4)
        if len(header) < 4:
            return
        (size,) = struct.unpack(">I", header)
        yield pickle.loads(stream.read(size))


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package, wherever it is installed
    import numpy as np

    from emonet.drawing import FramePainter
    from emonet.io.writer import VideoWriter

    out = sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    painter = memory = slots = spec = writer = None
    failed = False
    seconds = {"draw": 0.0, "encode": 0.0}

    def finish_segment() -> None:
        nonlocal writer
        if writer is not None:
            frames, path = writer.frames, writer.close()
            writer = None
            if path is not None:
                say(f"S {frames} {path}")

    for message in _messages(sys.stdin.buffer):
        kind = message[0]
        if kind == "open":
            spec = message[1]
            with open(spec["slots_path"], "r+b") as fh:
                memory = mmap.mmap(fh.fileno(), 0)
            whole = np.frombuffer(memory, np.uint8)
            slots = [whole[i * spec["slot_bytes"]:(i + 1) * spec["slot_bytes"]] for i in range(spec["slots"])]
            painter = FramePainter(spec["class_names"], spec["banner"])
        elif kind == "frame":
            _, segment, path, slot, index, (h, w), faces, colors = message
            if failed:
                say(f"R {slot}")
                continue
            try:
                t0 = time.perf_counter()
                composed = painter(slots[slot][: h * w * 3].reshape(h, w, 3), faces, colors)
                say(f"R {slot}")  # the pixels are drawn into a frame of this process's own
                t1 = time.perf_counter()
                if writer is None or writer.path != Path(path):
                    finish_segment()
                    writer = VideoWriter(path, spec["fps"], (composed.shape[1], composed.shape[0]),
                                         codec=spec["codec"], threads=spec["threads"])
                writer.write(composed, index)
                t2 = time.perf_counter()
                seconds["draw"] += t1 - t0
                seconds["encode"] += t2 - t1
            except Exception as exc:  # reported once; the parent turns it into one line
                failed = True
                say(f"R {slot}")
                say("E " + f"{type(exc).__name__}: {exc}".replace("\n", " "))
        elif kind == "end":
            break
    try:
        finish_segment()
    except Exception as exc:
        say("E " + f"{type(exc).__name__}: {exc}".replace("\n", " "))
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)  # x264's threads included
    say(f"T {seconds['draw']:.6f} {seconds['encode']:.6f} {usage.ru_utime:.3f} {usage.ru_stime:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
