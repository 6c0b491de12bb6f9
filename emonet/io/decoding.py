"""The decoding client: a child process (:mod:`.decode_worker`) decodes one or more videos in turn and hands
their frames back through a ring of shared-memory slots; :class:`Decoder` starts it, reads its messages
(:class:`.decode_worker.Kind`) and hands the slots back."""
from __future__ import annotations

import json
import os
from typing import Iterator, Optional, Union

import numpy as np

from ..errors import HelperError, InputError
from . import ipc
from .containers import STALL_SECONDS, is_stream_url
from .decode_worker import Kind
from .frames import Ending
from .helper import died, start_helper

# Not a message: what :meth:`Decoder._receive` gives once the child's output has ended (it has died).
GONE = "gone"


class Decoder:
    """Decoding in a child process (:mod:`.decode_worker`: PyAV, else OpenCV); frames come back through shared memory.

    In a thread of this process, decoding waited for the GIL whenever it handed a frame over, and
    FFmpeg's threads idled meanwhile; a process of its own decodes ahead into a few reusable slots of a
    memory-mapped file (in /dev/shm where there is room), which on a GPU are also page-locked for
    asynchronous uploads. ``videos`` (each ``{source, start, end, max_frames}``) are decoded one after the
    other; :meth:`next_video` reads each one's header in turn, then :meth:`frames` its frames.
    """

    SLOTS = 16
    BUDGET = 256 << 20  # bytes of decoded frames held ahead, at most

    def __init__(self, videos: list[dict], pin: bool) -> None:
        spec = {"videos": videos, "slots": self.SLOTS, "budget": self.BUDGET, "folders": list(ipc.FOLDERS)}
        # FFmpeg's own warnings (OpenCV prints them) are silenced in the child only.
        env = {"OPENCV_FFMPEG_LOGLEVEL": os.environ.get("OPENCV_FFMPEG_LOGLEVEL", "-8")}
        self.process = start_helper("emonet.io.decode_worker:main", json.dumps(spec), env=env, quiet=True)
        self.pin = pin
        self.source: Union[str, int, None] = None
        self.ring: Optional[ipc.Ring] = None
        self.live = False  # the current video is read as it comes (from its header)
        self.at_end = True  # every message of the current video has been read
        self.ending: Optional[Ending] = None  # the current video's, once read to its end

    def next_video(self, source: Union[str, int]) -> None:
        """Read the next video's header: :attr:`fps`, :attr:`frame_count`, :attr:`shape` (``(H, W, 3)`` of its
        first frame, then of the last one read; zeros: no frame) and :attr:`layout`; an :class:`InputError`
        when it cannot be opened."""
        self.source = source
        self.ending = None
        message = self._receive()
        if message[0] == Kind.CANNOT_OPEN:
            if isinstance(source, int):
                raise InputError(f"camera {source} could not be opened (no camera there, or it is in use)")
            if is_stream_url(source):
                raise InputError(f"{source}: the stream could not be opened (nothing answered or sent video within "
                                 f"{STALL_SECONDS:g} s; check the address, and that the sender is running)")
            raise InputError(f"{source}: not a video FFmpeg or OpenCV can open (not a video, corrupt, or an unknown codec)")
        if message[0] != Kind.INFO:
            raise InputError(f"{source}: decoding could not start ({self._why(message)})")
        _, fps, count, h, w, slots, path, self.layout, self.live = message
        self.fps, self.frame_count = float(fps), int(count)
        self.shape = (int(h), int(w), 3)
        self.at_end = False
        if path not in (None, "="):  # a new ring: the old one's slots have all been handed back
            self._unmap()
            self.ring = ipc.Ring.attach(path, slots)
            self.ring.unlink()  # both processes hold it mapped: nothing is left behind, however they end
            if self.pin:  # page-locked, a slot uploads asynchronously
                self.ring.pin()

    def _receive(self) -> tuple:
        return ipc.receive(self.process.stdout) or (GONE,)

    def _why(self, message: tuple) -> str:
        if message[0] == Kind.ERROR:
            return message[1]
        return died("decoding", self.process)

    def _shape(self, h: int, w: int) -> tuple:
        return (h, w, 3) if self.layout == "bgr" else (h * 3 // 2, w)

    def frames(self) -> Iterator[tuple[np.ndarray, float, Optional[int], Optional[float]]]:
        """``(frame as decoded, seconds its decoding took, slot, presentation time or None)`` in order (BGR
        ``(H, W, 3)``, or I420 ``(H * 3 // 2, W)`` planes, as :attr:`layout` says); hand each slot back with
        :meth:`release`. At the end, :attr:`ending` says how the video ended."""
        while True:
            message = self._receive()
            kind = message[0]
            if kind == Kind.FRAME:
                _, slot, h, w, seconds, shown = message
                self.shape = (h, w, 3)
                yield self.ring.view(slot, self._shape(h, w)), seconds, slot, shown
            elif kind == Kind.FRAME_BYTES:
                _, h, w, seconds, shown, data = message
                self.shape = (h, w, 3)
                yield np.frombuffer(bytearray(data), np.uint8).reshape(self._shape(h, w)), seconds, None, shown
            elif kind == Kind.END:
                _, produced, declared, damaged, dropped = message
                self.ending = Ending(produced, declared, damaged, dropped)
                self.at_end = True
                return
            else:
                self.at_end = True
                if kind == Kind.ERROR:  # the decoder said why: the input's data
                    raise RuntimeError(message[1])
                raise HelperError(died("decoding", self.process))  # it died: no fault of the input

    def release(self, slot: Optional[int]) -> None:
        """The parent is done with ``slot``: the child may decode into it again."""
        if slot is not None:
            try:
                ipc.send(self.process.stdin, (Kind.RELEASE, slot))
            except BrokenPipeError:  # it has finished (the last frames, or --max-frames, were read)
                pass

    def skip(self) -> None:
        """Read the rest of the current video's messages, handing its slots straight back (the next video's
        header comes after them)."""
        if self.at_end:
            return
        try:
            for _, _, slot, _ in self.frames():
                self.release(slot)
        except (RuntimeError, HelperError):  # an error ends the video as well
            pass
        self.at_end = True

    def close(self) -> None:
        """End the child and free the shared memory (no upload from it may still be running)."""
        if self.process.poll() is None:
            self.process.kill()  # it holds nothing worth finishing: frames not yet read are not wanted
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:  # BrokenPipe flushing stdin
                pass
        self._unmap()

    def _unmap(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
