"""The annotated video's encoding: I420 frames handed to encoder processes, in segments side by side.

The frames come drawn and converted (:class:`emonet.drawing.VideoCanvas`, on the GPU where there is one).
A chunk is copied into consecutive slots of a shared-memory file used as a ring, in one copy (two where
it wraps), straight from the GPU where there is one (the file is page-locked, so the copy runs while the
next chunk is analysed), and one message naming the slots goes to each encoder process concerned
(:mod:`.encode_worker`), which wraps each frame for libx264 and hands it over; x264's own threads
encode. With one encoder the output file is written directly; with several, the video is cut into
segments, handed out in turn, each encoded on its own (starting with a key frame), and on close the
segments are joined, packets copied in order with their timestamps, into one file whose index is at the
front.
"""
from __future__ import annotations

import mmap
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import encode_worker, ipc
from ..errors import HelperError, OutputError
from .helper import died
from .writer import check_video_name, join_segments

SLOT_BUDGET = 512 << 20   # bytes of frames waiting for the encoders, at most


def default_threads(workers: int) -> int:
    """x264 frame threads per encoder: three quarters of the cores shared out (the rest decode, analyse and
    draw), up to 12 (beyond, they add little and compete with the decoding process)."""
    return max(1, min(12, (os.cpu_count() or 1) * 3 // 4 // workers))


class AnnotatedVideoWriter:
    """``put(indices, frames, size)`` chunk after chunk; ``close()`` finishes the video.

    ``frames``: ``(n, width * height * 3 // 2)`` uint8 I420 frames on any device, the source's frame
    ``indices`` placing them in time.
    """

    def __init__(self, path: Union[str, Path], fps: float, codec: str = "h264", workers: Optional[int] = None,
                 segment_frames: Optional[int] = None, encoder_threads: Optional[int] = None,
                 spare: Optional[encode_worker.Spare] = None) -> None:
        check_video_name(path, codec)
        self.path = Path(path)
        self.fps = fps
        self.codec = codec
        # One encoder by default: its x264 frame threads use the cores, and it kept up better than two or
        # three encoding segments side by side (docs/PERFORMANCE.md). mp4v: always one (OpenCV's files
        # cannot be joined without PyAV).
        self.workers = 1 if codec != "h264" else (workers or 1)
        self.segment_frames = segment_frames
        self.encoder_threads = encoder_threads
        self.frames = 0
        self.wait_seconds = 0.0  # put() waiting for the encoders to give slots back (they are behind)
        self.encode_seconds = 0.0
        self.cpu_seconds = {"user": 0.0, "system": 0.0}  # the encoders', as they report at the end
        self._procs: list[subprocess.Popen] = []
        self._readers: list[threading.Thread] = []
        self._busy: list[bool] = []  # per slot of the ring: handed to an encoder, not yet given back
        self._released = threading.Condition()
        self._next = 0  # the ring's next slot
        self._segments: list[tuple[int, str]] = []   # (frames, path) as the encoders finish them
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._size: Optional[tuple[int, int]] = None
        self._parts: Optional[Path] = None
        self._slot_file: Optional[Path] = None
        self._unmapped: dict[str, int] = {}  # slot file -> encoder processes yet to map it (then it is unlinked)
        self._ring: Optional[torch.Tensor] = None  # (slots, slot bytes) over the shared file
        self._registered: Optional[int] = None
        self._handoff: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._sender: Optional[threading.Thread] = None
        self._preparing: Optional[threading.Thread] = None  # the ring made ahead (see prepare)
        self._prepare_error: Optional[BaseException] = None
        # The encoder processes start now (the first taken from ``spare``, started ahead, if given): their
        # start-up runs while the first frames are analysed.
        for k in range(self.workers):
            proc = spare.take() if k == 0 and spare is not None else encode_worker.start()
            self._procs.append(proc)
            reader = threading.Thread(target=self._listen, args=(proc,), name=f"emonet-encode-{k}", daemon=True)
            reader.start()
            self._readers.append(reader)

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
        self._size = size
        slot_bytes = size[0] * size[1] * 3 // 2
        if self.workers == 1:
            slots = int(np.clip(SLOT_BUDGET // (4 * slot_bytes), 8, 64))
        else:
            if self.segment_frames is None:
                # Long segments (fewer key frames) within the memory budget; every encoder kept busy.
                self.segment_frames = int(np.clip(SLOT_BUDGET // (slot_bytes * 2 * self.workers), 8, 120))
            slots = 2 * self.workers * self.segment_frames
        folder = next((d for d in ("/dev/shm", tempfile.gettempdir())
                       if os.path.isdir(d) and shutil.disk_usage(d).free > 2 * slots * slot_bytes),
                      tempfile.gettempdir())
        fd, name = tempfile.mkstemp(prefix="emonet-encode-", dir=folder)
        self._slot_file = Path(name)
        with self._lock:
            self._unmapped[name] = self.workers
        os.ftruncate(fd, slots * slot_bytes)
        self._memory = mmap.mmap(fd, 0)
        os.close(fd)
        whole = np.frombuffer(self._memory, np.uint8)
        if device.type == "cuda":  # page-locked, the frames come back from the GPU asynchronously
            self._registered = ipc.pin(whole)
        self._ring = torch.from_numpy(whole).view(slots, slot_bytes)
        self._busy = [False] * slots
        if self.workers > 1 and self._parts is None:
            self._parts = Path(tempfile.mkdtemp(prefix=f".{self.path.stem}.{os.getpid()}.parts", dir=self.path.parent))
        spec = {"slots_path": name, "slots": slots, "slot_bytes": slot_bytes, "size": size, "fps": self.fps,
                "codec": self.codec, "threads": self.encoder_threads or default_threads(self.workers)}
        for k in range(self.workers):
            self._send(k, ("open", spec))
        self._sender = threading.Thread(target=self._hand_over, name="emonet-encode-send", daemon=True)
        self._sender.start()

    def _free_ring(self, keep_slots: bool = False) -> None:
        """Stop handing over, then (unless ``keep_slots``: the encoders still read them) free the slots."""
        if self._sender is not None:
            self._handoff.put(None)
            self._sender.join()
            self._sender = None
        if self._slot_file is not None and not keep_slots:  # (its name goes once every encoder has mapped it)
            self._ring = None
            ipc.unpin(self._registered)
            self._registered = None
            try:
                self._memory.close()
            except BufferError:
                pass
            self._slot_file = None
            self._size = None

    def _send(self, k: int, message: tuple) -> None:
        try:
            ipc.send(self._procs[k].stdin, message)
        except (BrokenPipeError, OSError):
            self._fail(died("encoding", self._procs[k]))

    def _hand_over(self) -> None:
        """Once a chunk's copies into its slots have finished, tell the encoders (a thread: no waiting here)."""
        while True:
            item = self._handoff.get()
            if item is None:
                return
            done, messages = item
            if done is not None:
                done.synchronize()
            for k, message in messages:
                self._send(k, message)

    def _listen(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            kind, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
            if kind == "R":
                with self._released:
                    self._busy[int(rest)] = False
                    self._released.notify_all()
            elif kind == "O":
                with self._lock:
                    self._unmapped[rest] -= 1
                    if not self._unmapped[rest]:
                        # Every process holds it mapped: nothing is left behind, however they end.
                        del self._unmapped[rest]
                        Path(rest).unlink(missing_ok=True)
            elif kind == "S":
                frames, path = rest.split(" ", 1)
                with self._lock:
                    self._segments.append((int(frames), path))
            elif kind == "T":
                encode, user, system = map(float, rest.split())
                with self._lock:
                    self.encode_seconds += encode
                    self.cpu_seconds["user"] += user
                    self.cpu_seconds["system"] += system
            elif kind == "E":
                self._fail(rest)
        if proc.wait() != 0:
            self._fail(died("encoding", proc))

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
                    if any(p.poll() is not None for p in self._procs):
                        self._fail("an encoding process ended unexpectedly")
                        self._check()
            for i in wanted:
                self._busy[i] = True
        self.wait_seconds += time.perf_counter() - t0
        self._next = (start + n) % count
        return start

    # -- frames ------------------------------------------------------------------------------
    def put(self, indices: Sequence[int], frames: torch.Tensor, size: tuple[int, int]) -> None:
        """Hand over I420 ``frames`` of ``size`` = (width, height); blocks while the slots wait for the encoders."""
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
        self._ring[start:start + first].copy_(frames[:first], non_blocking=True)
        if first < n:  # wrapped round
            self._ring[:n - first].copy_(frames[first:], non_blocking=True)
        messages: list[tuple[int, tuple]] = []  # per encoder and file, its frames in order
        for i, index in enumerate(indices):
            segment = self.frames // self.segment_frames if self.workers > 1 else 0
            path = str(self._parts / f"{segment:06d}.mp4") if self.workers > 1 else str(self.path)
            k = segment % self.workers
            if not messages or messages[-1][1][1] != path:
                messages.append((k, ("frames", path, [])))
            messages[-1][1][2].append(((start + i) % count, int(index)))
            self.frames += 1
        done = None
        if frames.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        self._handoff.put((done, messages))

    def close(self) -> Optional[Path]:
        """Let the encoders finish every frame handed over, join their segments, and move the video into
        place; returns its path (None when no frame was written). Raises :class:`OutputError` on a failure,
        after keeping what could be kept."""
        try:
            self._prepared()
        except BaseException as exc:  # noqa: BLE001 - no frame came: the failure is reported as the encoders'
            self._fail(f"{exc}")
        self._free_ring(keep_slots=True)
        for k in range(len(self._procs)):
            self._send(k, ("end",))
        for proc, reader in zip(self._procs, self._readers):
            try:
                proc.stdin.close()
            except OSError:
                pass
            reader.join()
        self._procs, self._readers = [], []
        self._free_ring()
        for name in self._unmapped:  # an encoder that ended before mapping it
            Path(name).unlink(missing_ok=True)
        self._unmapped.clear()
        result = None
        try:
            if self.frames and self.workers == 1:
                result = self.path if self.path.exists() and self._segments else None
            elif self.frames:
                parts = sorted(self._segments, key=lambda part: part[1])  # named by segment number
                if parts:
                    join_segments(parts, self.path, self.fps)
                    result = self.path
        finally:
            if self._parts is not None:
                shutil.rmtree(self._parts, ignore_errors=True)
        self._check()
        return result
