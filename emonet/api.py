"""The Python API for those who embed emonet: read a video's faces frame by frame, and summarise them.

    import emonet

    reader = emonet.Reader(weights="random", device="cpu")     # loads and warms up once
    for frame in reader.video("clip.mp4"):                     # decoded, detected, tracked, read
        for face in frame.faces:                               # emonet.results.FaceResult
            print(frame.index, frame.timestamp, face.face_id, reader.class_names[face.expression])
    summary = emonet.summarize(reader.video("clip.mp4"), reader.class_names)   # per face id

The same path as the command-line tools: :meth:`Reader.video` is the video runtime's runner
(:func:`emonet.video.run_videos`) with no sinks, so it gives the rows ``emonet-video`` writes.
"""
from __future__ import annotations

import itertools
import warnings
from typing import Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from .choices import DEFAULT_DETECTOR
from .results import FaceResult, FrameFaces
from .summary import VideoSummary

__all__ = ["Reader", "FrameFaces", "summarize"]


class Reader:
    """EmoNet with a face detector, loaded once; :meth:`video` and :meth:`images` read faces with it."""

    def __init__(self, weights: str = "pretrained", device: Optional[str] = None, engine: str = "auto",
                 detector: str = DEFAULT_DETECTOR, min_score: Optional[float] = None, nclasses: Optional[int] = None,
                 batch_size: int = 32) -> None:
        from .build import ModelOptions, build_pipeline

        self.options = ModelOptions(weights=weights, nclasses=nclasses, device=device, engine=engine,
                                    detector=detector, min_score=min_score)
        self.batch_size = batch_size  # a video's chunk: the video tool's default, so the rows are the same
        # photos' and videos' alike
        self.pipeline = build_pipeline(self.options, batch_sizes=tuple(sorted({1, 4, batch_size})))
        self.class_names: list[str] = list(self.pipeline.engine.class_names)

    def images(self, images: Sequence[np.ndarray]) -> list[list[FaceResult]]:
        """Faces of each RGB ``(H, W, 3)`` uint8 image."""
        return self.pipeline(list(images))

    def video(self, source: Union[str, int, Iterable[np.ndarray]], detect_every: int = 5, smooth: bool = True,
              max_frames: Optional[int] = None, fps: float = 30.0, small_faces: Optional[bool] = None) -> Iterator[FrameFaces]:
        """Every frame of a video file, camera index or numbered images (``"frames/%04d.png"``), or of RGB
        ``(H, W, 3)`` uint8 frames handed in (timestamps ``index / fps``), with its faces, tracked with stable
        ids; the rows ``emonet-video`` writes for it. (``small_faces`` is the default now, and ignored.)"""
        from .video import ArraySource, VideoConfig, VideoInput, open_source, run_videos

        if small_faces is not None:
            warnings.warn("small_faces is the default now (faces from about 40 px wide in 1080p): drop it",
                          DeprecationWarning, stacklevel=2)

        pipeline = self.pipeline
        config = VideoConfig(model=self.options, batch_size=self.batch_size, detect_every=detect_every,
                             smooth=smooth, max_frames=max_frames)
        if isinstance(source, (str, int)):
            # Results only, never pixels: on a GPU the frames stay there (no host copy of each one is made).
            opened = lambda: open_source(source, config, pipeline.engine.device)  # noqa: E731
        else:
            frames = source if max_frames is None else itertools.islice(source, max_frames)
            opened = ArraySource(frames, fps=fps)
        for item in run_videos([VideoInput(opened, progress=False)], config, lambda shape: pipeline):
            if isinstance(item, FrameFaces):
                yield item


def summarize(frames: Iterable[FrameFaces], class_names: Sequence[str], fps: float = 0.0) -> list[dict]:
    """Per face id: frames, valence and arousal mean and standard deviation, the share of each expression
    (``share_<Class>``) and the dominant one: the figures of ``summary.csv``."""
    summary = VideoSummary("", class_names, fps)
    for frame in frames:
        summary.add(frame.timestamp, frame.faces)
    return summary.faces()
