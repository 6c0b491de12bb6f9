"""The annotated video: frames drawn and encoded by worker processes, in segments, side by side.

Drawing a frame and encoding it cost more than reading its faces: in threads of the analysing process
they fought its Python work for the GIL. Here each frame's pixels go into a slot of a shared-memory
file and its results down a pipe to a worker process (:mod:`.draw_worker`), which draws the frame and
encodes it. With several workers, the video is cut into segments of a few dozen frames, handed out in
turn, each encoded on its own (starting with a key frame); on close the segments are joined, packets
copied in order with their timestamps, into one file whose index is at the front. One worker writes
the output file directly.
"""
from __future__ import annotations

import mmap
import os
import pickle
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional, Sequence, Union

import cv2
import numpy as np

from .images import InputError
from .writer import check_video_name, join_segments

SLOT_BUDGET = 512 << 20   # bytes of frames waiting for the workers, at most
# A frame's buffers (several MB each) would otherwise be mapped and unmapped by glibc at every frame, the
# kernel zeroing fresh pages each time: kept on the heap, they are reused.
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def default_workers(codec: str) -> int:
    """Drawing and encoding processes for this machine: a quarter of the cores, up to 4 (mp4v: one)."""
    if codec != "h264":
        return 1  # OpenCV's mp4v writer cannot have its segments joined without PyAV
    return max(1, min(4, (os.cpu_count() or 1) // 4))


class AnnotatedVideoWriter:
    """``put(index, image, faces, colors)`` frame after frame; ``close()`` finishes the video.

    ``faces``: the frame's ``(FaceResult, trail)`` pairs, drawn by :class:`emonet.drawing.FramePainter`.
    """

    def __init__(self, path: Union[str, Path], fps: float, class_names: Sequence[str], banner: Optional[str],
                 codec: str = "h264", workers: Optional[int] = None, segment_frames: Optional[int] = None,
                 encoder_threads: Optional[int] = None) -> None:
        check_video_name(path, codec)
        self.path = Path(path)
        self.fps = fps
        self.codec = codec
        self.workers = workers or default_workers(codec)
        if codec != "h264":
            self.workers = 1
        self.segment_frames = segment_frames
        self.encoder_threads = encoder_threads
        self.class_names = list(class_names)
        self.banner = banner
        self.frames = 0
        self.resized = False
        self.seconds = {"draw": 0.0, "encode": 0.0}
        self.cpu_seconds = {"user": 0.0, "system": 0.0}  # the workers', as they report at the end
        self._procs: list[subprocess.Popen] = []
        self._readers: list[threading.Thread] = []
        self._free: "queue.Queue[int]" = queue.Queue()
        self._segments: list[tuple[int, str]] = []   # (frames, path) as the workers finish them
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._shape: Optional[tuple[int, int]] = None
        self._parts: Optional[Path] = None
        self._slot_file: Optional[Path] = None

    # -- start, on the first frame (its size sizes the slots) --------------------------------------
    def _start(self, shape: tuple[int, int]) -> None:
        h, w = shape
        self._shape = shape
        slot_bytes = h * w * 3
        if self.segment_frames is None:
            # Enough frames per segment to keep every worker busy, within the memory budget.
            self.segment_frames = int(np.clip(SLOT_BUDGET // (slot_bytes * 2 * self.workers), 8, 60))
        slots = 2 * self.workers * self.segment_frames if self.workers > 1 else 2 * self.segment_frames
        folder = next((d for d in ("/dev/shm", tempfile.gettempdir())
                       if os.path.isdir(d) and shutil.disk_usage(d).free > 2 * slots * slot_bytes),
                      tempfile.gettempdir())
        fd, name = tempfile.mkstemp(prefix="emonet-draw-", dir=folder)
        self._slot_file = Path(name)
        os.ftruncate(fd, slots * slot_bytes)
        self._memory = mmap.mmap(fd, 0)
        os.close(fd)
        whole = np.frombuffer(self._memory, np.uint8)
        self._slots = [whole[i * slot_bytes:(i + 1) * slot_bytes] for i in range(slots)]
        for i in range(slots):
            self._free.put(i)
        if self.workers > 1:
            self._parts = Path(tempfile.mkdtemp(prefix=f".{self.path.stem}.{os.getpid()}.parts", dir=self.path.parent))
        threads = self.encoder_threads
        if threads is None:  # x264's frame threads: the cores shared out, half left for everything else
            threads = max(1, (os.cpu_count() or 1) // (2 * self.workers)) if self.workers > 1 else 0
        spec = {"slots_path": name, "slots": slots, "slot_bytes": slot_bytes, "class_names": self.class_names,
                "banner": self.banner, "fps": self.fps, "codec": self.codec, "threads": threads}
        worker = Path(__file__).resolve().with_name("draw_worker.py")
        for k in range(self.workers):
            proc = subprocess.Popen([sys.executable, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    env={**os.environ, **WORKER_ENV})
            self._procs.append(proc)
            self._send(k, ("open", spec))
            reader = threading.Thread(target=self._listen, args=(proc,), name=f"emonet-draw-{k}", daemon=True)
            reader.start()
            self._readers.append(reader)

    def _send(self, k: int, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._procs[k].stdin.write(struct.pack(">I", len(data)) + data)
            self._procs[k].stdin.flush()
        except (BrokenPipeError, OSError):
            self._fail(f"a drawing process ended unexpectedly (exit code {self._procs[k].poll()})")

    def _listen(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            kind, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
            if kind == "R":
                self._free.put(int(rest))
            elif kind == "S":
                frames, path = rest.split(" ", 1)
                with self._lock:
                    self._segments.append((int(frames), path))
            elif kind == "T":
                draw, encode, user, system = map(float, rest.split())
                with self._lock:
                    self.seconds["draw"] += draw
                    self.seconds["encode"] += encode
                    self.cpu_seconds["user"] += user
                    self.cpu_seconds["system"] += system
            elif kind == "E":
                self._fail(rest)
        if proc.wait() != 0:
            self._fail(f"a drawing process ended unexpectedly (exit code {proc.returncode})")

    def _fail(self, message: str) -> None:
        with self._lock:
            if message not in self._errors:
                self._errors.append(message)

    def _check(self) -> None:
        if self._errors:
            raise InputError(f"writing the annotated video failed: {self._errors[0]}")

    # -- frames ------------------------------------------------------------------------------
    def put(self, index: int, image: np.ndarray, faces: list, colors: list) -> None:
        """Hand over one frame (RGB) and its faces; blocks while every slot waits for a worker."""
        self._check()
        if self._shape is None:
            self._start(image.shape[:2])
        h, w = self._shape
        if image.shape[:2] != (h, w):
            # The source changed size: the video keeps the first frame's (results are in its pixels).
            sx, sy = w / image.shape[1], h / image.shape[0]
            image = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA)
            faces = [(_scaled(f, sx, sy), trail) for f, trail in faces]
            self.resized = True
        while True:
            try:
                slot = self._free.get(timeout=0.5)
                break
            except queue.Empty:
                self._check()
                if any(p.poll() is not None for p in self._procs):
                    self._fail("a drawing process ended unexpectedly")
                    self._check()
        self._slots[slot][: h * w * 3].reshape(h, w, 3)[...] = image
        segment = self.frames // self.segment_frames if self.workers > 1 else 0
        path = (str(self._parts / f"{segment:06d}.mp4") if self.workers > 1
                else str(self.path))
        self._send(segment % self.workers, ("frame", segment, path, slot, index, (h, w), faces, colors))
        self.frames += 1

    def close(self) -> Optional[Path]:
        """Let the workers finish every frame handed over, join their segments, and move the video into
        place; returns its path (None when no frame was written). Raises :class:`InputError` on a failure,
        after keeping what could be kept."""
        for k in range(len(self._procs)):
            self._send(k, ("end",))
        for proc, reader in zip(self._procs, self._readers):
            try:
                proc.stdin.close()
            except OSError:
                pass
            reader.join()
        self._procs, self._readers = [], []
        if self._slot_file is not None:
            self._slot_file.unlink(missing_ok=True)
            self._slots = []
            try:
                self._memory.close()
            except BufferError:
                pass
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


def _scaled(face, sx: float, sy: float):
    """A copy of a FaceResult in a frame resized by ``(sx, sy)``."""
    from dataclasses import replace

    scale = np.array([sx, sy])
    matrix = np.asarray(face.matrix, np.float64) @ np.diag([1 / sx, 1 / sy, 1.0])
    return replace(face, box=np.asarray(face.box) * np.tile(scale, 2), landmarks=face.landmarks * scale,
                   matrix=matrix)
