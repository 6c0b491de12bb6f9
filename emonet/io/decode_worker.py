"""The decoding child process of :class:`emonet.video.VideoReader`: OpenCV decodes into shared-memory slots.

Run as a script (``python decode_worker.py SPEC``), so it imports only OpenCV and NumPy, not torch or the
package: it starts in a fraction of a second. Decoding in a process of its own keeps FFmpeg fed while
the parent's Python threads hold the GIL (in a thread, every frame handed over waited for it).

Protocol, one text line per message. The child writes on stdout:

- ``I fps frame_count height width slots path``: opened; ``path`` is the slot file (the parent maps it
  and deletes its name at once), ``-`` when the video has no frame at all;
- ``F slot height width seconds``: a frame is in ``slot``; ``seconds`` is the time its decoding took;
- ``B height width seconds``, then ``height * width * 3`` bytes: a frame too large for a slot (the video
  changed size), sent through the pipe instead;
- ``D``: no more frames; ``X reason``: the video could not be opened; ``E message``: decoding failed.

The parent writes a slot number on stdin when it has finished with that slot. The child decodes ahead
into free slots and waits for one when none is left, so memory stays bounded. It ignores Ctrl-C: the
parent, which sees it too, ends the child when it closes the reader.
"""
from __future__ import annotations

import json
import mmap
import os
import signal
import sys
import tempfile
import time
from collections import deque


def decoding_threads() -> int:
    """FFmpeg threads for decoding a file: up to 8. FFmpeg's own choice (one per core, up to 16) burned nearly
    twice the CPU per frame of 8 on a 16-core server, for fewer frames/s; the cores left over analyse and encode."""
    return max(1, min(8, os.cpu_count() or 1))


def open_capture(source, start: float = 0.0):
    """OpenCV's capture of a file (on :func:`decoding_threads`), camera index or numbered images, quietly,
    at ``start`` seconds; check ``isOpened()``."""
    import cv2
    camera = isinstance(source, int)
    previous = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)  # the parent's one line says what is wrong
    try:
        # Numbered images through OpenCV's own reader, which keeps each image's size (FFmpeg's rescales).
        sequence = isinstance(source, str) and "%" in source
        capture = None
        if sequence:
            capture = cv2.VideoCapture(source, cv2.CAP_IMAGES)
        elif not camera:
            capture = cv2.VideoCapture(source, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, decoding_threads()])
        if capture is None or not capture.isOpened():  # a camera, or a file only another backend opens
            capture = cv2.VideoCapture(source)
    finally:
        cv2.utils.logging.setLogLevel(previous)
    if capture.isOpened() and start > 0 and not camera:
        capture.set(cv2.CAP_PROP_POS_MSEC, start * 1000.0)
    return capture


def _slot_file(spec: dict, slot_bytes: int):
    """``(slots, path, mmap)`` in the first folder with room (shared memory first), or ``(0, None, None)``.

    At most ``spec['budget']`` bytes, and at least 2 slots; the space is reserved now (posix_fallocate),
    so a full tmpfs fails here rather than with SIGBUS on a later frame.
    """
    slots = max(2, min(spec["slots"], spec["budget"] // slot_bytes))
    for folder in spec["folders"]:
        if not os.path.isdir(folder):
            continue
        fd, path = tempfile.mkstemp(prefix="emonet-frames-", dir=folder)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, slots * slot_bytes)
            else:
                os.ftruncate(fd, slots * slot_bytes)
            return slots, path, mmap.mmap(fd, slots * slot_bytes)
        except OSError:
            os.unlink(path)
        finally:
            os.close(fd)
    return 0, None, None


def main(spec: dict) -> int:
    """Decode ``spec['source']`` into up to ``spec['slots']`` slots of a file in one of ``spec['folders']``."""
    import cv2
    import numpy as np

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out, inp = sys.stdout.buffer, sys.stdin.buffer

    def say(line: str, payload: bytes = b"") -> None:
        out.write(line.encode() + b"\n" + payload)
        out.flush()

    capture = open_capture(spec["source"], spec["start"])
    if not capture.isOpened():
        say("X cannot-open")
        return 0
    fps = capture.get(cv2.CAP_PROP_FPS) or 0.0
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
    t0 = time.perf_counter()
    ok, first = capture.read()  # the slots are sized by the first frame itself (cameras may not say)
    first_seconds = time.perf_counter() - t0
    if not ok:
        say(f"I {fps} {count} 0 0 0 -")
        say("D")
        return 0
    h, w = first.shape[:2]
    slot_bytes = first.nbytes
    slots, path, memory = _slot_file(spec, slot_bytes)
    if memory is None:
        say(f"E no room for {spec['slots']} decoded frames of {w}x{h} in {' or '.join(spec['folders'])}")
        return 0
    say(f"I {fps} {count} {h} {w} {slots} {path}")

    whole = np.frombuffer(memory, dtype=np.uint8)
    free = deque(range(slots))
    views: dict = {}  # (slot, shape) -> array over the slot

    def view(slot: int, shape: tuple):
        key = (slot, shape)
        if key not in views:
            n = int(np.prod(shape))
            views[key] = whole[slot * slot_bytes: slot * slot_bytes + n].reshape(shape)
        return views[key]

    pending, seconds, produced = first, first_seconds, 0
    limit = spec.get("max_frames")
    try:
        while limit is None or produced < limit:
            while not free:
                line = inp.readline()
                if not line:  # the parent has gone
                    return 0
                free.append(int(line))
            slot = free.popleft()
            # Decoded straight into the slot while frames fit it; otherwise (the first frame, read before
            # the slots existed, or a frame larger than a slot) where OpenCV puts it, then copied or piped.
            target = view(slot, (h, w, 3)) if h * w * 3 <= slot_bytes and pending is None else None
            if pending is not None:
                frame, pending = pending, None
            else:
                t0 = time.perf_counter()
                ok, frame = capture.read(target) if target is not None else capture.read()
                seconds = time.perf_counter() - t0
                if not ok:
                    break
            h, w = frame.shape[:2]
            produced += 1
            if frame.nbytes > slot_bytes:  # the video grew: this frame goes through the pipe
                say(f"B {h} {w} {seconds:.6f}", frame.tobytes())
                free.appendleft(slot)
                continue
            if target is None or frame.ctypes.data != target.ctypes.data:
                np.copyto(view(slot, frame.shape), frame)
            say(f"F {slot} {h} {w} {seconds:.6f}")
        say("D")
        while inp.readline():  # the slot file stays named until the parent has mapped it: wait for its end
            pass
    except BrokenPipeError:  # the parent closed the reader early; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    except Exception as exc:  # one line for the parent to report
        say(f"E {type(exc).__name__}: {exc}".replace("\n", " "))
        while inp.readline():
            pass
    finally:
        capture.release()
        try:
            os.unlink(path)  # normally the parent already did, right after mapping it
        except FileNotFoundError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
