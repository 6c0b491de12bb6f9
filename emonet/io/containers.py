"""Opening and reading a video for the decoding process (:mod:`.decode_worker`): PyAV for files and network
streams, handed over as decoded (yuv420p planes); OpenCV for cameras, numbered images and what PyAV cannot hand
over as it is (BGR). Imports only PyAV, OpenCV and NumPy, each where it is used: the decoding process starts
without torch. The run's bounds (``--end``, ``--max-frames``) are reckoned here too, for both sides."""
from __future__ import annotations

import math
import os
import time
from typing import Optional

# What FFmpeg reads as a network stream: read as it comes (no buffering ahead, frames dropped when the
# analysis falls behind), and reported as stalled when no data comes for STALL_SECONDS.
LIVE_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "rtp", "srt", "udp", "tcp", "http", "https")
STALL_SECONDS = 10.0
LIVE_SLOTS = 3  # frames a live source holds decoded ahead


def is_stream_url(source) -> bool:
    """Whether ``source`` is a URL of a network stream (``rtsp://``, ``udp://``, ``tcp://``, ``http://`` ...)."""
    return isinstance(source, str) and source.split("://", 1)[0].lower() in LIVE_SCHEMES and "://" in source


def decoding_threads() -> int:
    """FFmpeg threads for decoding a file: up to 8. FFmpeg's own choice (one per core, up to 16) burned more CPU
    per frame than 8, for fewer frames/s; the cores left over analyse and encode."""
    return max(1, min(8, os.cpu_count() or 1))


def end_index(end: float, rate: float) -> int:
    """The first frame index at or past ``end`` seconds at ``rate`` frames a second: ``--end`` is exclusive (10 to
    20 s at 30 frames/s is 300 frames), and the progress bar counts the frames this way too."""
    return math.ceil(end * rate - 1e-9)


def in_run(produced: int, index: int, rate: float, max_frames: Optional[int], end: Optional[float]) -> bool:
    """Whether frame ``index``, the run's ``produced``-th (from 0), is still in the run: ``--max-frames``, and
    ``--end`` by the frame's time at ``rate``."""
    return (max_frames is None or produced < max_frames) and (end is None or index < end_index(end, rate))


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


class _OpenCV:
    """Frames as OpenCV reads them: BGR, decoded straight into the slot where they fit."""

    layout = "bgr"
    declared = 0  # OpenCV's frame count is an estimate from the duration: nothing to hold a file to
    damaged = False

    def __init__(self, capture, kind: str = "file") -> None:
        import cv2
        self.capture = capture
        self.kind = kind  # file | camera | images
        self.live = kind == "camera"
        self.fps = capture.get(cv2.CAP_PROP_FPS) or 0.0
        self.count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self.size: Optional[tuple] = None  # the last frame's (h, w): the next one's, most likely
        self.time: Optional[float] = None  # the last frame's presentation (a camera's: capture) time
        self._clock0: Optional[float] = None

    @staticmethod
    def shape(h: int, w: int) -> tuple:
        """The array of an ``h`` x ``w`` frame as handed over."""
        return (h, w, 3)

    @staticmethod
    def dims(frame) -> tuple:
        """``(h, w)`` of a frame as handed over."""
        return frame.shape[:2]

    def read(self, target):
        """The next frame, decoded into ``target(h, w)`` (a view of a slot) where it fits, or None at the end."""
        import cv2
        into = target(*self.size) if self.size is not None else None
        ok, frame = self.capture.read(into) if into is not None else self.capture.read()
        if not ok:
            return None
        self.size = frame.shape[:2]
        if self.kind == "camera":  # the capture time, on a clock that only goes forward
            now = time.monotonic()
            self._clock0 = now if self._clock0 is None else self._clock0
            self.time = now - self._clock0
        elif self.kind == "file":  # FFmpeg's backend: this frame's presentation time from the stream's start
            self.time = self.capture.get(cv2.CAP_PROP_POS_MSEC) / 1000.0
        return frame

    def close(self) -> None:
        self.capture.release()


class _PyAV:
    """Frames as FFmpeg decodes them, frame-threaded, handed over as I420 planes (no colour conversion here)."""

    def __init__(self, container, start: float, live: bool = False) -> None:
        import av
        self.error = (av.FFmpegError, OSError)  # what damaged data (or a stalled stream) raises
        self.container = container
        # A network stream without a duration is live (a file served over http is not): read as it comes.
        self.live = live and container.duration is None
        live = self.live
        stream = container.streams.video[0]
        if live:  # frame threads hold frames back (one per thread): slices only, for the least delay
            stream.thread_type = "SLICE"
        else:
            stream.thread_type = "FRAME"  # slice threads too ("AUTO") decoded less per second
            stream.codec_context.thread_count = decoding_threads()
        rate = stream.average_rate or stream.guessed_rate or 0
        self.fps = float(rate)
        self.count = self.declared = int(stream.frames or 0)
        self.damaged = False
        # Presentation times count from the stream's first (a container may start it past zero).
        self.t0 = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
        self.time: Optional[float] = None
        if not self.count and stream.duration and rate:
            self.count = int(stream.duration * stream.time_base * rate)
        self.start = start
        if start > 0:
            container.seek(int(start / stream.time_base), stream=stream, backward=True, any_frame=False)
        self.half = 0.5 / float(rate) if rate else 0.0
        self.frames = container.decode(stream)
        self.layout = "i420:601:limited"

    @staticmethod
    def shape(h: int, w: int) -> tuple:
        """The array of an ``h`` x ``w`` frame as handed over: its planes one after the other."""
        return (h * 3 // 2, w)

    @staticmethod
    def dims(frame) -> tuple:
        """``(h, w)`` of a frame as handed over."""
        return (frame.shape[0] * 2 // 3, frame.shape[1])

    def _next(self):
        for frame in self.frames:
            if self.start > 0 and frame.time is not None and frame.time < self.start - self.half:
                continue  # decoded from the key frame before the start
            if frame.format.name not in ("yuv420p", "yuvj420p"):
                frame = frame.reformat(format="yuv420p")
            self.time = frame.time - self.t0 if frame.time is not None else None
            return frame
        return None

    def first(self):
        """The first frame, which also says the layout (its colour matrix and range); None where OpenCV
        should read the video instead (nothing decoded, or a rotation to apply, which OpenCV does)."""
        try:
            frame = self._next()
        except self.error:
            return None
        if frame is not None and getattr(frame, "rotation", 0):
            return None
        if frame is not None:
            # Untagged video is BT.601, as FFmpeg (and OpenCV) convert it; JPEG-style yuvj420p is full range.
            matrix = "709" if int(frame.colorspace) == 1 else "601"
            full = frame.format.name == "yuvj420p" or int(frame.color_range) == 2
            self.layout = f"i420:{matrix}:{'full' if full else 'limited'}"
        return frame

    def read(self, target):
        """The next frame's planes copied into ``target(h, w)`` (a view of a slot) or a new array; None at the end."""
        try:
            frame = self._next()
        except self.error:  # damaged from here on: the frames so far are kept and the parent is told
            self.damaged = True
            return None
        return None if frame is None else self.planes(frame, target)

    @staticmethod
    def planes(frame, target):
        """``frame``'s yuv420p planes, one after the other, in ``target(h, w)`` or a new array."""
        import numpy as np
        h, w = frame.height, frame.width
        out = target(h, w)
        out = out if out is not None else np.empty((h * 3 // 2, w), np.uint8)
        flat = out.reshape(-1)
        at = 0
        for plane in frame.planes:
            rows = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, :plane.width]
            flat[at:at + rows.size].reshape(rows.shape)[...] = rows
            at += rows.size
        return out

    def close(self) -> None:
        self.container.close()


def open_pyav(source: str, start: float = 0.0):
    """PyAV's decoder of a file (or network stream) whose frames it can hand over as I420 as they are, or None
    (use OpenCV)."""
    try:
        import av
    except ImportError:
        return None
    live = is_stream_url(source)
    try:
        if live:  # read as it comes; a stream that sends nothing for STALL_SECONDS ends with an error
            # (FFmpeg's "nobuffer" flag cut the delay further, but lost whole MPEG-TS streams while probing.)
            options = {"rtsp_transport": "tcp"} if source.lower().startswith("rtsp") else {}
            container = av.open(source, options=options, timeout=(STALL_SECONDS, STALL_SECONDS))
        else:
            container = av.open(source)
    except (av.FFmpegError, OSError, ValueError):
        return None
    try:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width % 2 or height % 2 or not width:
            container.close()  # odd sides: OpenCV's BGR
            return None
        return _PyAV(container, start, live)
    except (IndexError, av.FFmpegError, ValueError, OSError):
        container.close()
        return None


def presentation_times(source: str) -> list:
    """The presentation time (seconds from the stream's start) of each frame of a file, in display order,
    from its packets alone (nothing is decoded): for decoders that do not say, such as NVDEC."""
    import av
    with av.open(source) as container:
        stream = container.streams.video[0]
        t0 = stream.start_time
        pts = sorted(p.pts for p in container.demux(stream) if p.pts is not None and p.size)
        t0 = pts[0] if t0 is None and pts else (t0 or 0)
        return [float((p - t0) * stream.time_base) for p in pts]


def open_video(video: dict):
    """``(reader, first frame as decoded, seconds it took)`` of one video; reader None: it cannot be opened.
    ``reader.time`` is the first frame's presentation time until the next read."""
    source = video["source"]
    reader = None
    if isinstance(source, str) and "%" not in source:
        reader = open_pyav(source, video["start"])
        if reader is None and is_stream_url(source):
            return None, None, 0.0  # FFmpeg could not open it (or nothing came): OpenCV would wait again
    if reader is not None:
        t0 = time.perf_counter()
        frame = reader.first()
        if frame is not None:
            return reader, reader.planes(frame, lambda h, w: None), time.perf_counter() - t0
        reader.close()  # PyAV opened it but decodes nothing, or the frames must be rotated: OpenCV
    capture = open_capture(source, video["start"])
    if not capture.isOpened():
        return None, None, 0.0
    kind = "camera" if isinstance(source, int) else "images" if "%" in source else "file"
    reader = _OpenCV(capture, kind)
    t0 = time.perf_counter()
    first = reader.read(lambda h, w: None)  # the slots are sized by the first frame itself (cameras may not say)
    return reader, first, time.perf_counter() - t0
