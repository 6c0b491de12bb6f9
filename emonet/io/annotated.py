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
import threading
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import encode_worker, ipc
from ..errors import HelperError, OutputError
from .helper import HelperClient
from .writer import check_video_name

SLOT_BUDGET = 512 << 20   # bytes of frames waiting for the encoder, at most (a quarter of it by default)


def default_threads() -> int:
    """x264 frame threads: five eighths of the cores (the rest decode, analyse, plan and draw), up to 12 (beyond,
    they add little and compete with the decoding process). More took cores from the analysing process's
    threads; fewer fell behind the drawing (docs/PERFORMANCE.md)."""
    return max(1, min(12, (os.cpu_count() or 1) * 5 // 8))


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
        self._next = 0  # the ring's next slot
        self._written = False  # the encoder has finished the file
        self._size: Optional[tuple[int, int]] = None
        self._ring: Optional[ipc.Ring] = None
        self._slots: Optional[torch.Tensor] = None  # (slots, slot bytes) over the ring
        self._unmapped: set[str] = set()  # rings the encoder has yet to map (their names go once it has)
        self._preparing: Optional[threading.Thread] = None  # the ring made ahead (see prepare)
        self._prepare_error: Optional[BaseException] = None
        # The encoding process starts now (taken from ``spare``, started ahead, if given): its start-up runs
        # while the first frames are analysed.
        self._helper = HelperClient(
            "encoding", spare.take() if spare is not None else encode_worker.start(),
            {"released": self._on_released, "mapped": self._on_mapped, "written": self._on_written,
             "times": self._on_times, "error": self._fail}, thread="emonet-encode")
        self._state = self._helper.state  # held by the handlers below; put() waits on it for slots
        self._helper.start()

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
        with self._state:
            self._unmapped.add(ring.path)
        self._slots = torch.from_numpy(ring.array).view(slots, slot_bytes)
        self._busy = [False] * slots
        self._helper.send(("open", {"ring": ring.path, "slots": slots, "size": size, "fps": self.fps,
                                    "path": str(self.path), "codec": self.codec,
                                    "threads": self.encoder_threads or default_threads()}))

    def _free_ring(self) -> None:
        """Unmap the ring: no copy into it is running (none was handed over, or every one has been sent)."""
        if self._ring is not None:
            self._slots = None
            self._ring.close()
            self._ring = None
            self._size = None

    def _on_released(self, slot: int) -> None:
        self._busy[slot] = False

    def _on_mapped(self, ring: str) -> None:
        # Both processes hold it mapped: nothing is left behind, however they end.
        self._unmapped.discard(ring)
        Path(ring).unlink(missing_ok=True)

    def _on_written(self, frames: int) -> None:
        self._written = True

    def _on_times(self, encode: float, user: float, system: float) -> None:
        self.encode_seconds += encode
        self.cpu_seconds["user"] += user
        self.cpu_seconds["system"] += system

    def _fail(self, message: str) -> None:
        self._helper.fail(message)

    def _check(self) -> None:
        failure = self._helper.failure
        if failure is not None:
            kind = HelperError if "process ended unexpectedly" in failure else OutputError
            raise kind(f"writing the annotated video failed: {failure}")

    def _claim(self, n: int) -> int:
        """The ring's next ``n`` slots, marked busy once every one is free; returns the first."""
        count = len(self._busy)
        start = self._next
        wanted = [(start + i) % count for i in range(n)]
        t0 = time.perf_counter()
        with self._state:
            while any(self._busy[i] for i in wanted):
                if not self._state.wait(timeout=0.5):
                    self._check()
                    if self._helper.proc.poll() is not None:
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
            self._free_ring()  # made ahead for another size than the frames have (none handed over)
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
        # Sent once the copies into the slots have finished (in the sender thread: no waiting here).
        self._helper.send(("frames", [((start + i) % count, int(index)) for i, index in enumerate(indices)]),
                          after=done.synchronize if done is not None else None)

    def close(self) -> Optional[Path]:
        """Let the encoder finish every frame handed over and move the video into place; returns its path
        (None when no frame was written). Raises :class:`OutputError` on a failure, after keeping what could
        be kept."""
        try:
            self._prepared()
        except BaseException as exc:  # noqa: BLE001 - no frame came: the failure is reported as the encoder's
            self._fail(f"{exc}")
        self._helper.close(last=("end",))  # after every frame handed over; the encoder's reading is done
        self._free_ring()
        for name in self._unmapped:  # the encoder ended before mapping it
            Path(name).unlink(missing_ok=True)
        self._unmapped.clear()
        self._check()
        return self.path if self.frames and self._written and self.path.exists() else None
