"""The annotated video's encoding: I420 frames handed to an encoding process through a ring of slots.

The frames come drawn and converted (:class:`emonet.drawing.VideoCanvas`, on the GPU where there is one).
A chunk is copied into consecutive slots of an :class:`.ipc.Ring` in one copy (two where it wraps),
straight from the GPU where there is one (the ring is page-locked, so the copy runs while the next chunk
is analysed), and one message naming the slots goes to the encoding process (:mod:`.encode_worker`),
which wraps each frame for libx264 and hands it over; x264's own frame threads use the cores. (Two
encoding processes, each a segment of the video, kept up worse than one: docs/PERFORMANCE.md.)
"""
from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import encode_worker, ipc
from ..errors import HelperError, OutputError
from .helper import died
from .writer import check_video_name

SLOT_BUDGET = 512 << 20   # bytes of frames waiting for the encoder, at most (a quarter of it by default)


def default_threads() -> int:
    """x264 frame threads: three quarters of the cores (the rest decode, analyse and draw), up to 12
    (beyond, they add little and compete with the decoding process)."""
    return max(1, min(12, (os.cpu_count() or 1) * 3 // 4))


class AnnotatedVideoWriter:
    """``put(indices, frames, size)`` chunk after chunk; ``close()`` finishes the video.

    ``frames``: ``(n, width * height * 3 // 2)`` uint8 I420 frames on any device, the source's frame
    ``indices`` placing them in time.
    """

    def __init__(self, path: Union[str, Path], fps: float, codec: str = "h264", encoder_threads: Optional[int] = None,
                 spare: Optional[encode_worker.Spare] = None) -> None:
        check_video_name(path, codec)
        self.path = Path(path)
        self.fps = fps
        self.codec = codec
        self.encoder_threads = encoder_threads
        self.frames = 0
        self.wait_seconds = 0.0  # put() waiting for the encoder to give slots back (it is behind)
        self.encode_seconds = 0.0
        self.cpu_seconds = {"user": 0.0, "system": 0.0}  # the encoder's, as it reports at the end
        self._busy: list[bool] = []  # per slot of the ring: handed to the encoder, not yet given back
        self._released = threading.Condition()
        self._next = 0  # the ring's next slot
        self._written = False  # the encoder has finished the file
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._size: Optional[tuple[int, int]] = None
        self._ring: Optional[ipc.Ring] = None
        self._slots: Optional[torch.Tensor] = None  # (slots, slot bytes) over the ring
        self._unmapped: set[str] = set()  # rings the encoder has yet to map (their names go once it has)
        self._handoff: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._sender: Optional[threading.Thread] = None
        self._preparing: Optional[threading.Thread] = None  # the ring made ahead (see prepare)
        self._prepare_error: Optional[BaseException] = None
        # The encoding process starts now (taken from ``spare``, started ahead, if given): its start-up runs
        # while the first frames are analysed.
        self._proc: subprocess.Popen = spare.take() if spare is not None else encode_worker.start()
        self._reader = threading.Thread(target=self._listen, name="emonet-encode", daemon=True)
        self._reader.start()

    # -- start, on the first frames (their size sizes the slots), or ahead of them --------------------
    def prepare(self, size: tuple[int, int], device: Union[str, torch.device]) -> None:
        """Make the ring for frames of ``size`` (width, height) now, in a thread, before the first frames:
        page-locking it takes tens of milliseconds, which the first frames would otherwise wait for."""
        if self._size is None and self._preparing is None:
            self._preparing = threading.Thread(target=self._prepare, args=(tuple(size), torch.device(device)),
                                               name="emonet-encode-ring", daemon=True)
            self._preparing.start()

    def _prepare(self, size: tuple[int, int], device: torch.device) -> None:
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # (per thread) the ring is page-locked for this device's copies
            self._start(size, device)
        except BaseException as exc:  # raised by the first put, where the caller is
            self._prepare_error = exc

    def _prepared(self) -> None:
        """Wait for :meth:`prepare`'s thread, if any; raise what it raised."""
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None
            if self._prepare_error is not None:
                raise self._prepare_error

    def _start(self, size: tuple[int, int], device: torch.device) -> None:
        slot_bytes = size[0] * size[1] * 3 // 2
        slots = int(np.clip(SLOT_BUDGET // (4 * slot_bytes), 8, 64))
        ring = ipc.Ring.create(slots, slot_bytes)
        if ring is None:
            raise OutputError(f"no room for {slots} frames of {size[0]}x{size[1]} in {' or '.join(ipc.FOLDERS)}")
        if device.type == "cuda":  # page-locked, the frames come back from the GPU asynchronously
            ring.pin()
        self._ring, self._size = ring, size
        with self._lock:
            self._unmapped.add(ring.path)
        self._slots = torch.from_numpy(ring.array).view(slots, slot_bytes)
        self._busy = [False] * slots
        self._send(("open", {"ring": ring.path, "slots": slots, "size": size, "fps": self.fps, "path": str(self.path),
                             "codec": self.codec, "threads": self.encoder_threads or default_threads()}))
        self._sender = threading.Thread(target=self._hand_over, name="emonet-encode-send", daemon=True)
        self._sender.start()

    def _free_ring(self, keep_slots: bool = False) -> None:
        """Stop handing over, then (unless ``keep_slots``: the encoder still reads them) free the slots."""
        if self._sender is not None:
            self._handoff.put(None)
            self._sender.join()
            self._sender = None
        if self._ring is not None and not keep_slots:
            self._slots = None
            self._ring.close()
            self._ring = None
            self._size = None

    def _send(self, message: tuple) -> None:
        try:
            ipc.send(self._proc.stdin, message)
        except (BrokenPipeError, OSError):
            self._fail(died("encoding", self._proc))

    def _hand_over(self) -> None:
        """Once a chunk's copies into its slots have finished, tell the encoder (a thread: no waiting here)."""
        while True:
            item = self._handoff.get()
            if item is None:
                return
            done, message = item
            if done is not None:
                done.synchronize()
            self._send(message)

    def _listen(self) -> None:
        for message in ipc.messages(self._proc.stdout):
            kind = message[0]
            if kind == "released":
                with self._released:
                    self._busy[message[1]] = False
                    self._released.notify_all()
            elif kind == "mapped":  # both processes hold it mapped: nothing is left behind, however they end
                with self._lock:
                    self._unmapped.discard(message[1])
                Path(message[1]).unlink(missing_ok=True)
            elif kind == "written":
                self._written = True
            elif kind == "times":
                _, encode, user, system = message
                with self._lock:
                    self.encode_seconds += encode
                    self.cpu_seconds["user"] += user
                    self.cpu_seconds["system"] += system
            elif kind == "error":
                self._fail(message[1])
        if self._proc.wait() != 0:
            self._fail(died("encoding", self._proc))

    def _fail(self, message: str) -> None:
        with self._lock:
            if message not in self._errors:
                self._errors.append(message)

    def _check(self) -> None:
        if self._errors:
            kind = HelperError if "process ended unexpectedly" in self._errors[0] else OutputError
            raise kind(f"writing the annotated video failed: {self._errors[0]}")

    def _claim(self, n: int) -> int:
        """The ring's next ``n`` slots, marked busy once every one is free; returns the first."""
        count = len(self._busy)
        start = self._next
        wanted = [(start + i) % count for i in range(n)]
        t0 = time.perf_counter()
        with self._released:
            while any(self._busy[i] for i in wanted):
                if not self._released.wait(timeout=0.5):
                    self._check()
                    if self._proc.poll() is not None:
                        self._fail("the encoding process ended unexpectedly")
                        self._check()
            for i in wanted:
                self._busy[i] = True
        self.wait_seconds += time.perf_counter() - t0
        self._next = (start + n) % count
        return start

    # -- frames ------------------------------------------------------------------------------
    def put(self, indices: Sequence[int], frames: torch.Tensor, size: tuple[int, int]) -> None:
        """Hand over I420 ``frames`` of ``size`` = (width, height); blocks while the slots wait for the encoder."""
        self._check()
        self._prepared()
        if self._size is not None and tuple(size) != self._size and self.frames == 0:
            self._free_ring()  # made ahead for another size than the frames have
        if self._size is None:
            self._start(size, frames.device)
        if tuple(size) != self._size:
            raise ValueError(f"frames of {size}, the video's are {self._size}")
        indices = list(indices)
        count = len(self._busy)
        for lo in range(0, len(indices), count):  # a chunk larger than the ring goes in pieces
            self._put(indices[lo:lo + count], frames[lo:lo + count])

    def _put(self, indices: list[int], frames: torch.Tensor) -> None:
        n, count = len(indices), len(self._busy)
        start = self._claim(n)
        first = min(n, count - start)
        self._slots[start:start + first].copy_(frames[:first], non_blocking=True)
        if first < n:  # wrapped round
            self._slots[:n - first].copy_(frames[first:], non_blocking=True)
        self.frames += n
        done = None
        if frames.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        self._handoff.put((done, ("frames", [((start + i) % count, int(index)) for i, index in enumerate(indices)])))

    def close(self) -> Optional[Path]:
        """Let the encoder finish every frame handed over and move the video into place; returns its path
        (None when no frame was written). Raises :class:`OutputError` on a failure, after keeping what could
        be kept."""
        try:
            self._prepared()
        except BaseException as exc:  # noqa: BLE001 - no frame came: the failure is reported as the encoder's
            self._fail(f"{exc}")
        self._free_ring(keep_slots=True)
        self._send(("end",))
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        self._reader.join()
        self._free_ring()
        for name in self._unmapped:  # the encoder ended before mapping it
            Path(name).unlink(missing_ok=True)
        self._unmapped.clear()
        self._check()
        return self.path if self.frames and self._written and self.path.exists() else None
