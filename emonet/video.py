"""Video I/O: frames decoded in a background thread (memory stays flat), and a writer that leaves a whole file.

The reader streams: a bounded queue holds a few frames, so a video of any length uses the same memory.
The writer encodes to a temporary name and renames on close, so an output is either a playable video
or absent; closing it in a ``finally`` (also on Ctrl-C or SIGTERM) keeps every frame written so far.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import cv2
import numpy as np
import torch

from .images import InputError

# FFmpeg's own messages ("moov atom not found", ...) would precede our one-line errors; OpenCV reads
# this when its FFmpeg backend starts. -8 is AV_LOG_QUIET.
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")


@dataclass
class Frame:
    """One decoded frame: its index in the video, its time in seconds, its pixels (and an RGB copy on the GPU)."""

    index: int
    timestamp: float
    host: np.ndarray                              # (H, W, 3) uint8 in host memory: RGB, or BGR if host_is_bgr
    pixels: Optional[torch.Tensor] = None         # (H, W, 3) uint8 RGB on the GPU, uploaded by the reader
    ready: Optional["torch.cuda.Event"] = None    # recorded when that upload has finished
    host_is_bgr: bool = False                     # as OpenCV decodes it: converted only if someone asks

    @property
    def shape(self) -> tuple:
        """``(H, W, 3)``."""
        return self.host.shape

    @property
    def image(self) -> np.ndarray:
        """The RGB pixels in host memory (converted from the decoder's BGR on first use)."""
        if self.host_is_bgr:
            self.host, self.host_is_bgr = cv2.cvtColor(self.host, cv2.COLOR_BGR2RGB), False
        return self.host

    def on_device(self, device: torch.device, stream: Optional["torch.cuda.Stream"] = None) -> torch.Tensor:
        """The frame as an ``(H, W, 3)`` uint8 RGB tensor on ``device``, ordered on ``stream`` (default: the current one)."""
        if self.pixels is not None and self.pixels.device == device:
            stream = stream or torch.cuda.current_stream(device)
            stream.wait_event(self.ready)
            self.pixels.record_stream(stream)  # the reader's stream allocated it; this one reads it
            return self.pixels
        return torch.from_numpy(self.image).to(device, non_blocking=True)


class VideoReader:
    """Iterate over ``Frame``s of a file or camera (``"0"``), decoded ahead in a thread."""

    def __init__(self, source: Union[str, int], start: float = 0.0, end: Optional[float] = None,
                 max_frames: Optional[int] = None, queue_size: int = 32,
                 device: Optional[torch.device] = None) -> None:
        self.source = source
        # With a GPU, the decoding thread also uploads each frame (from pinned memory, on a stream of its
        # own), so the copy overlaps the main thread's work instead of adding to it.
        self.device = device if device is not None and torch.device(device).type == "cuda" else None
        camera = isinstance(source, int) or (isinstance(source, str) and source.isdigit())
        if not camera and not Path(source).is_file():
            raise InputError(f"{source}: no such video file")
        previous = cv2.utils.logging.getLogLevel()
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)  # our one line says what is wrong
        try:
            self.capture = cv2.VideoCapture(int(source) if camera else str(source))
        finally:
            cv2.utils.logging.setLogLevel(previous)
        if not self.capture.isOpened():
            if camera:
                raise InputError(f"camera {source} could not be opened (no camera there, or it is in use)")
            raise InputError(f"{source}: not a video OpenCV can open (not a video, corrupt, or an unknown codec)")
        self.fps = self.capture.get(cv2.CAP_PROP_FPS) or 0.0
        if not (0 < self.fps < 1000):
            self.fps = 30.0  # cameras and some files report nothing usable
        self.frame_count = int(self.capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        # (H, W, 3) as the container says (zeros where it does not); the decoder updates it if frames change size.
        self.frame_shape = (int(self.capture.get(cv2.CAP_PROP_FRAME_HEIGHT)), int(self.capture.get(cv2.CAP_PROP_FRAME_WIDTH)), 3)
        self.start, self.end, self.max_frames = start, end, max_frames
        self.first_index = 0
        if start > 0:
            self.capture.set(cv2.CAP_PROP_POS_MSEC, start * 1000.0)
            self.first_index = int(round(start * self.fps))
        self.decode_seconds = 0.0
        self._queue: "queue.Queue[Optional[Frame]]" = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        # Started on the first iteration, not here: decoding then neither competes with the model's
        # loading and warm-up for the CPU nor counts their time as its own.
        self._thread = threading.Thread(target=self._run, name="emonet-decode", daemon=True)

    @property
    def expected_frames(self) -> Optional[int]:
        """How many frames the run will see, when the container says (for the progress bar)."""
        if not self.frame_count:
            return self.max_frames
        last = self.frame_count if self.end is None else min(self.frame_count, int(self.end * self.fps))
        n = max(0, last - self.first_index)
        return min(n, self.max_frames) if self.max_frames else n

    def _run(self) -> None:
        index = self.first_index
        produced = 0
        stream = torch.cuda.Stream(self.device) if self.device is not None else None
        try:
            while not self._stop.is_set():
                if self.max_frames is not None and produced >= self.max_frames:
                    break
                t0 = time.perf_counter()
                if stream is not None:
                    # Decoded straight into pinned memory, uploaded as it is and turned into RGB on the
                    # GPU: no CPU colour conversion (a third of the decoding time at 720p, measured on the
                    # H100 machine) and no staging copy. The host copy stays BGR until drawing asks.
                    pinned = torch.empty(self.frame_shape, dtype=torch.uint8, pin_memory=True)
                    buffer = pinned.numpy()
                    ok, bgr = self.capture.read(buffer)
                    if not ok:
                        break
                    if bgr.ctypes.data != buffer.ctypes.data:  # a new size: OpenCV decoded elsewhere
                        self.frame_shape = bgr.shape
                        pinned = torch.from_numpy(bgr).pin_memory()
                    with torch.cuda.stream(stream):
                        pixels = pinned.to(self.device, non_blocking=True).flip(-1)
                        ready = torch.cuda.Event()
                        ready.record(stream)
                    frame_args = dict(host=pinned.numpy(), pixels=pixels, ready=ready, host_is_bgr=True)
                else:
                    ok, bgr = self.capture.read()
                    if not ok:
                        break
                    frame_args = dict(host=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
                self.decode_seconds += time.perf_counter() - t0
                # From the index, not CAP_PROP_POS_MSEC: some backends report the *next* frame's time.
                timestamp = index / self.fps
                if self.end is not None and timestamp > self.end:
                    break
                while not self._stop.is_set():
                    try:
                        self._queue.put(Frame(index, timestamp, **frame_args), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                index += 1
                produced += 1
        except BaseException as exc:  # reported to the consumer, never lost in the thread
            self._error = exc
        finally:
            self._put_end()

    def _put_end(self) -> None:
        while True:
            try:
                self._queue.put(None, timeout=0.1)
                return
            except queue.Full:
                if self._stop.is_set():
                    return

    def __iter__(self) -> Iterator[Frame]:
        if self._thread.ident is None:  # not started yet
            self._thread.start()
        while True:
            item = self._queue.get()
            if item is None:
                if self._error is not None:
                    raise InputError(f"{self.source}: decoding failed ({self._error})")
                return
            yield item

    def close(self) -> None:
        """Stop the decoding thread and release the file or camera."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.1)
        self.capture.release()


class VideoWriter:
    """mp4v (MPEG-4 Part 2) video, written under a temporary name and renamed on close."""

    def __init__(self, path: Union[str, Path], fps: float, size: tuple[int, int]) -> None:
        self.path = Path(path)
        self.size = size
        # Same folder and extension: OpenCV picks the container from the name; the rename is atomic.
        self.tmp = self.path.with_name(f".{self.path.stem}.partial{self.path.suffix or '.mp4'}")
        self.writer = cv2.VideoWriter(str(self.tmp), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
        if not self.writer.isOpened():
            self.tmp.unlink(missing_ok=True)
            raise InputError(f"{self.path}: OpenCV cannot write an mp4v video there (use a .mp4 or .avi name "
                             f"in a writable folder)")
        self.frames = 0
        self.resized = False

    def write(self, rgb: np.ndarray) -> None:
        """Append one RGB frame (resized to the video's size if the source changed size)."""
        if (rgb.shape[1], rgb.shape[0]) != self.size:
            rgb = cv2.resize(rgb, self.size, interpolation=cv2.INTER_AREA)
            self.resized = True
        self.writer.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        self.frames += 1

    def close(self) -> Optional[Path]:
        """Finish the file and move it into place; a video with no frame is removed instead."""
        self.writer.release()
        if self.frames == 0:
            self.tmp.unlink(missing_ok=True)
            return None
        os.replace(self.tmp, self.path)
        return self.path
