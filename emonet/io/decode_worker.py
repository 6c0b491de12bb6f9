"""The decoding child process of :class:`emonet.io.video.VideoReader`: frames decoded into shared-memory slots.

Started by :func:`emonet.io.helper.start_helper` (``main(SPEC)``, SPEC as JSON); it imports only PyAV, OpenCV
and NumPy, not torch: it starts in a fraction of a second. Decoding in a process of its own keeps FFmpeg fed while
the parent's Python threads hold the GIL (in a thread, every frame handed over waited for it).

Video files are decoded by PyAV, frame-threaded, and handed over as decoded: I420 (yuv420p planes, 1.5
bytes a pixel), which the parent turns into RGB on the GPU. OpenCV's reader converted every frame to BGR
on the CPU (3 bytes a pixel): PyAV decoded a 720p clip about twice as fast for two thirds of the CPU
(docs/PERFORMANCE.md). OpenCV still reads cameras, numbered images, and the files PyAV cannot hand over
as I420 as they are (no PyAV, odd sides, a rotation to apply), as BGR.

The spec lists one or more videos (a collection's, in the order they are analysed): each is decoded in
turn, the next one's first frames into the slots as soon as the last one's are handed back, so many
short videos cost one process start and no pause between them.

Protocol: :mod:`.ipc` messages both ways, each a tuple whose first item is its kind (:class:`Kind`); the
frames themselves go through an :class:`.ipc.Ring`. The child sends, for each video in turn:

- ``("info", fps, frame_count, height, width, slots, path, layout, live)``: opened (``live``: a camera or a
  network stream without a duration, read as it comes); ``path`` is a new ring's file
  (the parent attaches it and removes its name at once), ``"="`` when the last video's ring serves this one
  too, ``None`` when the video has no frame at all; ``layout`` is ``bgr`` (height x width x 3 bytes) or
  ``i420:MATRIX:RANGE`` (yuv420p planes, ``MATRIX`` 601 or 709, ``RANGE`` limited or full);
- ``("frame", slot, height, width, seconds, time)``: a frame is in ``slot``; ``seconds`` is the time its
  decoding took, ``time`` its presentation time in seconds from the stream's start (a camera's: since its
  first frame was captured), None where the source has none (numbered images);
- ``("frame_bytes", height, width, seconds, time, data)``: a frame too large for a slot (the video changed
  size), its bytes in the message;
- ``("end", produced, declared, damaged, dropped)``: no more frames of this video (at its end, ``max_frames`` or
  ``end``): how many were handed over, how many the container declares (0: it does not say), whether
  decoding stopped at damaged data (a network stream: that stalled or broke off), and how many frames of
  a live source (a camera, a network stream) were read and dropped because the analysis was behind;
- ``("cannot_open",)``: it could not be opened; ``("error", message)``: decoding failed. The next video follows.

The parent sends ``("release", slot)`` when it has finished with a slot. The child decodes ahead into free slots
and waits for one when none is left (a live source's frame is dropped instead), so memory stays bounded; a video with larger frames gets a new ring
once every slot of the old one is back. It ignores Ctrl-C: the parent, which sees it too, ends the child
when it closes the reader.
"""
from __future__ import annotations

import json
import math
import os
import select
import sys
import time
from collections import deque
from typing import Optional

from .containers import LIVE_SLOTS, in_run, open_video


class Kind:
    """The protocol's message kinds (see the module's docstring): plain strings, the same on both sides."""

    INFO = "info"                # child -> parent: a video opened, its header
    FRAME = "frame"              # a frame in a slot of the ring
    FRAME_BYTES = "frame_bytes"  # a frame too large for a slot, its bytes in the message
    END = "end"                  # no more frames of this video, and how they ended
    CANNOT_OPEN = "cannot_open"  # the video could not be opened
    ERROR = "error"              # decoding failed, and why
    RELEASE = "release"          # parent -> child: a slot handed back


def main(spec_json: str) -> int:
    """Decode each of the JSON ``spec``'s ``videos`` in turn into a ring of up to ``slots`` slots (at most
    ``budget`` bytes) in one of its ``folders``: the next video's frames follow the last one's without a pause."""
    import numpy as np

    from emonet.io.ipc import Ring, receive, send

    spec = json.loads(spec_json)
    # Unbuffered: select() on it then sees every message not yet read (a buffer would hide some).
    out, inp = sys.stdout.buffer, sys.stdin.buffer.raw
    ring: Optional[Ring] = None
    free: deque = deque()

    def say(*message) -> None:
        send(out, message)

    def take_back() -> bool:
        """Wait for the parent to hand a slot back; False once it has gone."""
        message = receive(inp)
        if message is None:
            return False
        free.append(message[1])
        return True

    try:
        for video in spec["videos"]:
            reader, first, seconds = open_video(video)
            if reader is None:
                say(Kind.CANNOT_OPEN)
                continue
            fps, count = reader.fps, reader.count
            if first is None:
                reader.close()
                say(Kind.INFO, fps, count, 0, 0, 0, None, reader.layout, False)
                say(Kind.END, 0, reader.declared, reader.damaged, 0)
                continue
            h, w = reader.dims(first)
            live = reader.live
            named = "="  # the ring so far serves this video too
            if ring is None or first.nbytes > ring.slot_bytes:  # the first video, or larger frames: a new ring
                if ring is not None:
                    while len(free) < ring.slots:  # every slot handed back: the parent has finished with it
                        if not take_back():
                            return 0
                    frame = target = None  # no view of the old slots may outlive their file
                    ring.unlink()  # normally the parent already did, right after attaching it
                    ring.close()
                slot_bytes = first.nbytes
                # A live source keeps few frames ahead: the fewer held, the fresher the one analysed.
                wanted = LIVE_SLOTS if live else spec["slots"]
                ring = Ring.create(max(2, min(wanted, spec["budget"] // slot_bytes)), slot_bytes, spec["folders"])
                if ring is None:
                    reader.close()
                    say(Kind.ERROR, f"no room for {spec['slots']} decoded frames of {w}x{h} in "
                                    f"{' or '.join(spec['folders'])}")
                    return 0
                free, named = deque(range(ring.slots)), ring.path
            say(Kind.INFO, fps, count, h, w, ring.slots, named, reader.layout, live)
            # Where this video's run ends: --max-frames, or --end by the parent's reckoning of frame times.
            rate = fps if 0 < fps < 1000 else 30.0
            index = int(round(video["start"] * rate)) if video["start"] > 0 else 0
            end, limit = video.get("end"), video.get("max_frames")
            pending, produced, dropped, slot = first, 0, 0, None
            try:
                while in_run(produced, index, rate, limit, end):
                    if live:  # take the slots handed back so far, without waiting
                        while not free and select.select([inp], [], [], 0)[0]:
                            if not take_back():
                                return 0
                        if not free and pending is None:
                            # The analysis is behind: this frame is read (the stream goes on) and dropped,
                            # so the delay stays bounded rather than growing with a queue.
                            if reader.read(lambda fh, fw: None) is None:
                                break
                            dropped += 1
                            index += 1  # (its time passes: --end counts the stream's time)
                            continue
                    while not free:
                        if not take_back():  # the parent has gone
                            return 0
                    slot = free.popleft()
                    if pending is not None:  # the first frame, read before the ring existed
                        frame, pending = pending, None
                    else:
                        # Decoded (or copied) straight into the slot while frames fit it; a larger frame gets
                        # an array of its own and goes in the message.
                        t0 = time.perf_counter()
                        frame = reader.read(lambda fh, fw: ring.view(slot, reader.shape(fh, fw))
                                            if math.prod(reader.shape(fh, fw)) <= ring.slot_bytes else None)
                        seconds = time.perf_counter() - t0
                        if frame is None:
                            free.appendleft(slot)
                            break
                    h, w = reader.dims(frame)
                    produced += 1
                    index += 1
                    if frame.nbytes > ring.slot_bytes:  # the video grew: this frame goes through the pipe
                        say(Kind.FRAME_BYTES, h, w, seconds, reader.time, frame.tobytes())
                        free.appendleft(slot)
                        slot = None
                        continue
                    target = ring.view(slot, frame.shape)
                    if frame.ctypes.data != target.ctypes.data:
                        np.copyto(target, frame)
                    say(Kind.FRAME, slot, h, w, seconds, reader.time)
                    slot = None  # the parent's until it hands it back
                say(Kind.END, produced, reader.declared, reader.damaged, dropped)
            except BrokenPipeError:
                raise
            except Exception as exc:  # one message for the parent to report; the next video goes on
                if slot is not None:  # taken, never handed over: still free
                    free.appendleft(slot)
                say(Kind.ERROR, f"{type(exc).__name__}: {exc}".replace("\n", " "))
            finally:
                reader.close()
        while receive(inp) is not None:  # the ring stays named until the parent has attached it: wait for its end
            pass
    except BrokenPipeError:  # the parent closed the reader early; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    finally:
        if ring is not None:
            ring.unlink()  # normally the parent already did, right after attaching it
    return 0
