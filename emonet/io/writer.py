"""Video writing: :class:`VideoWriter`, one file through one encoder (x264's frame threads use the cores).

Torch-free, so the encoding workers (:mod:`.encode_worker`) start fast. Every file is encoded under a
temporary name and renamed on close, so an output is either a playable video or absent; closing in a
``finally`` (also on Ctrl-C or SIGTERM) keeps every frame written so far.
"""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Optional, Union

import cv2
import numpy as np

from ..errors import InputError
from .atomic import AtomicPath

CODECS = ("h264", "mp4v")
QP = 20  # x264's constant quantiser for the annotated video (lower: better and larger)
_CONTAINERS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska", ".avi": "avi"}


def check_video_name(path: Union[str, Path], codec: str) -> None:
    """Raise :class:`InputError` unless ``path``'s extension names a container ``codec`` can be written in."""
    if codec not in CODECS:
        raise InputError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    suffix = Path(path).suffix.lower()
    if suffix not in _CONTAINERS or (codec == "mp4v" and suffix == ".mkv"):
        raise InputError(f"{path}: the annotated video needs a .mp4, .mov, .m4v, .avi"
                         f"{'' if codec == 'mp4v' else ' or .mkv'} name")


class VideoWriter:
    """An annotated video, written under a temporary name and renamed on close.

    ``h264`` (default): H.264 in yuv420p through PyAV's FFmpeg (libx264), the index (moov) at the front of
    an .mp4 so it plays while it downloads, in every browser and player; the encoder uses all cores.
    ``mp4v``: MPEG-4 Part 2 through OpenCV, for setups without PyAV (many browsers do not play it).
    Frames are placed by their index in the source (``pts``), at the source's frame rate.
    """

    def __init__(self, path: Union[str, Path], fps: float, size: tuple[int, int], codec: str = "h264",
                 threads: int = 0) -> None:
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        check_video_name(self.path, codec)
        self.codec = codec
        # yuv420p halves the chroma planes: H.264 needs even sides, so an odd side gets one black line.
        self.size = size
        self.coded = (size[0] + size[0] % 2, size[1] + size[1] % 2)
        self.frames = 0
        self.resized = False
        self._yuv: Optional[np.ndarray] = None
        self._first_pts: Optional[int] = None
        self._last_pts = -1
        # The container is named explicitly, not taken from the temporary name.
        self._place = AtomicPath(self.path, keep_suffix=True)
        self.tmp = self._place.tmp
        try:
            if codec == "mp4v":
                self._open_opencv(fps)
            else:
                self._open_pyav(fps, _CONTAINERS[suffix], threads)
        except InputError:
            self._place.abort()
            raise

    def _open_opencv(self, fps: float) -> None:
        self._cv = cv2.VideoWriter(str(self.tmp), cv2.VideoWriter_fourcc(*"mp4v"), fps, self.size)
        self._av = None
        if not self._cv.isOpened():
            raise InputError(f"{self.path}: OpenCV cannot write an mp4v video there (use a .mp4 or .avi name "
                             f"in a writable folder)")

    def _open_pyav(self, fps: float, container: str, threads: int) -> None:
        try:
            import av
        except ImportError:
            raise InputError("H.264 output needs PyAV (pip install av); or pass --codec mp4v") from None
        self._cv = None
        options = {"movflags": "+faststart"} if container in ("mp4", "mov") else {}
        try:
            self._av = av.open(str(self.tmp), mode="w", format=container, options=options)
        except (OSError, av.FFmpegError) as exc:
            raise InputError(f"{self.path}: cannot write there ({exc})") from None
        self.rate = Fraction(fps).limit_denominator(1001 * 1000)
        try:
            stream = self._av.add_stream("libx264", rate=self.rate)
        except (ValueError, av.FFmpegError):
            self._av.close()
            raise InputError("this PyAV's FFmpeg has no libx264 encoder; pass --codec mp4v") from None
        stream.width, stream.height = self.coded
        stream.pix_fmt = "yuv420p"
        # ultrafast: the encoder must keep up with analysis. A constant quantiser, not a constant rate factor:
        # CRF weighs every frame's cost on a half-size copy first (the lookahead), which held x264's frame
        # threads back; QP 20 gave the annotated frames the quality (PSNR) CRF 23, x264's default, gave them,
        # in files about 5 % larger.
        stream.options = {"preset": "ultrafast", "qp": str(QP)}
        stream.codec_context.thread_count = threads  # 0: x264 picks (frame threads on every core)
        stream.codec_context.thread_type = "FRAME"
        # What OpenCV's RGB -> I420 conversion produces (BT.601, limited range), said in the stream.
        stream.codec_context.colorspace = av.video.reformatter.Colorspace.ITU601
        stream.codec_context.color_range = av.video.reformatter.ColorRange.MPEG
        stream.codec_context.time_base = 1 / self.rate
        self._stream = stream

    def write(self, rgb: np.ndarray, index: Optional[int] = None) -> None:
        """Append one RGB frame, the source's frame ``index`` placing it in time (resized if the source changed size)."""
        if (rgb.shape[1], rgb.shape[0]) != self.size:
            rgb = cv2.resize(rgb, self.size, interpolation=cv2.INTER_AREA)
            self.resized = True
        if self.coded != self.size:
            rgb = cv2.copyMakeBorder(rgb, 0, self.coded[1] - self.size[1], 0, self.coded[0] - self.size[0],
                                     cv2.BORDER_CONSTANT)
        # OpenCV's conversion (SIMD, GIL released) is several times faster than swscale's from rgb24.
        self._yuv = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420, dst=self._yuv)  # one buffer, reused
        self.write_i420(self._yuv, index)

    def write_i420(self, yuv: np.ndarray, index: Optional[int] = None) -> None:
        """Append one frame already in I420 (yuv420p planes one after the other, BT.601 limited range) at the
        coded size (even sides), as :class:`emonet.drawing.VideoCanvas` draws them."""
        width, height = self.coded
        yuv = yuv.reshape(height * 3 // 2, width)
        if self._cv is not None:
            bgr = cv2.cvtColor(yuv, cv2.COLOR_YUV2BGR_I420)
            self._cv.write(bgr[:self.size[1], :self.size[0]])
        else:
            self._encode(yuv, index)
        self.frames += 1

    def _encode(self, yuv: np.ndarray, index: Optional[int]) -> None:
        import av

        frame = None
        if yuv.shape[0] % 6 == 0:
            # The frame wraps the caller's buffer, no copy: x264 copies the picture into its own before the
            # encode call returns (that second copy was the encoding process's serial limit). PyAV derives
            # the height as rows // 6 * 4, right only for heights that are multiples of 4; older PyAV
            # cannot wrap yuv420p at all: a copy then.
            try:
                frame = av.VideoFrame.from_numpy_buffer(yuv, format="yuv420p")
            except (AttributeError, ValueError):
                frame = None
        if frame is None:
            frame = av.VideoFrame.from_ndarray(yuv, format="yuv420p")  # a copy
        frame.colorspace = av.video.reformatter.Colorspace.ITU601
        frame.color_range = av.video.reformatter.ColorRange.MPEG
        if self._first_pts is None:
            self._first_pts = index or 0
        # The first frame at 0, the others by their index (no index: the next one); always forward.
        frame.pts = self._last_pts + 1 if index is None else max(index - self._first_pts, self._last_pts + 1)
        self._last_pts = frame.pts
        for packet in self._stream.encode(frame):
            self._av.mux(packet)

    def close(self) -> Optional[Path]:
        """Finish the file and move it into place; a video with no frame is removed instead."""
        if self._cv is not None:
            self._cv.release()
        elif self._av is not None:
            if self.frames:
                for packet in self._stream.encode(None):  # the frames still inside the encoder
                    self._av.mux(packet)
            self._av.close()  # writes the index, moved to the front (faststart)
            self._av = None
        if self.frames == 0:
            self._place.abort()
            return None
        return self._place.commit()
