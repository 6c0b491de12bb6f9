"""Where a run's frames come from: one small interface (:class:`Source`) over every kind of input.

A file, a network stream (any URL FFmpeg opens: ``rtsp://``, ``udp://``, ``tcp://``, ``http(s)://``, ...), a
camera or numbered images are read by :class:`emonet.io.video.VideoReader` (decoding in a process of
its own, or on NVDEC); frames handed in from Python by :class:`ArraySource`. :func:`open_source` picks one;
:func:`open_sources` gives a collection's files, decoded one after the other without a pause between them.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional, Protocol, Sequence, Union

import numpy as np
import torch

from ..errors import InputError
from ..log import say
from ..io.video import Ending, Frame, VideoReader, VideoSequence
from .config import VideoConfig


class Source(Protocol):
    """Frames of one video, in order: :class:`~emonet.io.video.Frame` (index, presentation time, pixels; on a
    GPU already there), and what the run reports of the video."""

    source: Union[str, int]                   # what it was opened from, as the user gave it
    fps: float                                # the nominal rate (the annotated video's)
    frame_shape: tuple                        # (H, W, 3) of the first frame; zeros when unknown
    device: Optional[torch.device]            # where the frames' pixels are (None: host memory)
    decode_seconds: float                     # spent decoding, where the source measures it
    nvdec: bool                               # decoded by NVDEC on the GPU
    live: bool                                # frames as they come (a camera, a network stream): not waited for
    ending: Optional[Ending]                  # how the frames ended, once read to the end

    @property
    def expected_frames(self) -> Optional[int]: ...   # for the progress bar; None: unknown (a camera)

    @property
    def shortfall(self) -> Optional[str]: ...         # why the frames read are not the whole video, or None

    def ready(self) -> bool: ...                      # a frame is waiting: taking it would not wait

    def __iter__(self) -> Iterator[Frame]: ...

    def close(self) -> None: ...


def open_source(spec: Union[str, int], config: VideoConfig, device: Optional[torch.device],
                annotated: bool = False) -> VideoReader:
    """The source of a video file, camera index or numbered images (``"frames/%04d.png"``), decoding from now.

    With a GPU the frames are kept there only: detection, crops and drawing all read them there. NVDEC decodes
    where ``config.decoder`` asks for it (``auto``: while an annotated video is written, x264 then has the cores
    FFmpeg's decoding would take). Raises :class:`~emonet.errors.InputError` for what cannot be opened.
    """
    use_nvdec = config.decoder == "nvdec" or (config.decoder == "auto" and annotated)
    reader = VideoReader(spec, start=config.start, end=config.end, max_frames=config.max_frames,
                         device=device, keep_host=False, use_nvdec=use_nvdec)
    if config.decoder == "nvdec" and reader.nvdec_refused:
        say(f"note: {spec} is decoded on the CPU, not by NVDEC: {reader.nvdec_refused}")
    return reader


def open_sources(specs: Sequence[str], config: VideoConfig, device: Optional[torch.device]) -> Iterator[Union[VideoReader, InputError]]:
    """Each file's source in turn, decoded by one process one after the other (the next one's first frames
    are decoded while this one's last are analysed), or the :class:`InputError` of one that cannot be read.
    Take the next once the last one's frames are read; closing the iterator stops the decoding."""
    sequence = VideoSequence(specs, start=config.start, end=config.end, max_frames=config.max_frames,
                             device=device, keep_host=False)
    try:
        for _ in specs:
            try:
                yield sequence.next()
            except InputError as exc:
                yield exc
    finally:
        sequence.close()


def no_frames(source: Union[str, int]) -> InputError:
    """The error of a video from which no frame could be read."""
    return InputError(f"{source}: no frame could be read (empty, corrupt, or a codec neither FFmpeg nor OpenCV decodes)")


class ArraySource:
    """Frames handed in from Python: RGB ``(H, W, 3)`` uint8 arrays (or ``(array, timestamp)`` pairs), in
    order. Timestamps not given are ``index / fps``."""

    nvdec = False
    live = False
    ending: Optional[Ending] = None

    def __init__(self, frames: Iterable[Union[np.ndarray, tuple[np.ndarray, float]]], fps: float = 30.0,
                 source: str = "<frames>", count: Optional[int] = None) -> None:
        self.source, self.fps = source, float(fps)
        self.device: Optional[torch.device] = None
        self.decode_seconds = 0.0  # nothing is decoded here
        self.frame_shape: tuple = (0, 0, 3)
        self._frames = iter(frames)
        self._count = count if count is not None else (len(frames) if hasattr(frames, "__len__") else None)
        self._closed = False

    @property
    def expected_frames(self) -> Optional[int]:
        """The number of frames, when the iterable says."""
        return self._count

    @property
    def shortfall(self) -> Optional[str]:
        """Frames from Python are whole by definition."""
        return None

    def ready(self) -> bool:
        """Frames from Python are taken as the caller gives them."""
        return True

    def __iter__(self) -> Iterator[Frame]:
        index = 0
        for item in self._frames:
            if self._closed:
                return
            image, timestamp = item if isinstance(item, tuple) else (item, index / self.fps)
            image = np.asarray(image)
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise InputError(f"{self.source}: frame {index} is not an RGB (H, W, 3) uint8 image "
                                 f"(shape {image.shape}, {image.dtype})")
            if not self.frame_shape[0]:
                self.frame_shape = image.shape
            yield Frame(index, float(timestamp), np.ascontiguousarray(image))
            index += 1
        self.ending = Ending(index)

    def close(self) -> None:
        """Stop taking frames."""
        self._closed = True
