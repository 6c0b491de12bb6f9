"""The Python API for those who embed emonet: read a video's faces frame by frame, and summarise them.

    import emonet

    reader = emonet.Reader(weights="random", device="cpu")     # loads and warms up once
    for frame in reader.video("clip.mp4"):                     # decoded, detected, tracked, read
        for face in frame.faces:                               # emonet.results.FaceResult
            print(frame.index, frame.timestamp, face.face_id, reader.class_names[face.expression])
    summary = emonet.summarize(reader.video("clip.mp4"), reader.class_names)   # per face id

The same path as the command-line tools (:mod:`emonet.pipeline`), without their outputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from .results import FaceResult
from .summary import VideoSummary


@dataclass
class FrameFaces:
    """One video frame's faces."""

    index: int                      # frame number in the video
    timestamp: float                # seconds
    faces: list[FaceResult] = field(default_factory=list)


class Reader:
    """EmoNet with a face detector, loaded once; :meth:`video` and :meth:`images` read faces with it."""

    def __init__(self, weights: str = "pretrained", device: Optional[str] = None, engine: str = "auto",
                 detector: str = "blazeface", min_score: Optional[float] = None, nclasses: Optional[int] = None,
                 batch_size: int = 8) -> None:
        from .build import ModelOptions, build_detector, build_engine
        from .pipeline import Pipeline

        options = ModelOptions(weights=weights, nclasses=nclasses, device=device, engine=engine, detector=detector,
                               min_score=min_score)
        self.batch_size = batch_size
        engine_ = build_engine(options, batch_sizes=tuple(sorted({1, 4, batch_size})))
        self.pipeline = Pipeline(engine_, build_detector(options, engine_))
        # Video frames are read as the video tool reads them (its detector: the whole frame, no close look;
        # with small_faces, as --small-faces: made on first use).
        self._video_pipeline = Pipeline(engine_, build_detector(options, engine_, video=True))
        self._small_faces_pipeline: Optional[Pipeline] = None
        self._small_faces_detector = lambda: build_detector(options, engine_, video=True, small_faces=True)
        self.class_names: list[str] = list(engine_.class_names)

    def images(self, images: Sequence[np.ndarray]) -> list[list[FaceResult]]:
        """Faces of each RGB ``(H, W, 3)`` uint8 image."""
        return self.pipeline(list(images))

    def video(self, source: Union[str, int], detect_every: int = 5, smooth: bool = True,
              max_frames: Optional[int] = None, small_faces: bool = False) -> Iterator[FrameFaces]:
        """Every frame of a video file (or camera index) with its faces, tracked with stable ids
        (``small_faces``: as ``emonet-video --small-faces``)."""
        from .io.video import VideoReader
        from .pipeline import Pipeline, VideoPipeline

        if small_faces and self._video_pipeline.detector.name != "blazeface":
            raise ValueError("small_faces needs the blazeface detector")
        if small_faces and self._small_faces_pipeline is None:
            self._small_faces_pipeline = Pipeline(self.pipeline.engine, self._small_faces_detector())
        pipeline = self._small_faces_pipeline if small_faces else self._video_pipeline
        video = VideoPipeline(pipeline, detect_every=detect_every, smooth=smooth, small_faces=small_faces)
        # Results only, never pixels: on a GPU the frames stay there (no host copy of each one is made).
        reader = VideoReader(source, max_frames=max_frames, device=self.pipeline.engine.device, keep_host=False)
        try:
            chunk: list = []
            for frame in reader:
                chunk.append(frame)
                if len(chunk) == self.batch_size:
                    yield from self._chunk(video, chunk)
                    chunk = []
            if chunk:
                yield from self._chunk(video, chunk)
        finally:
            reader.close()

    @staticmethod
    def _chunk(video, chunk: list) -> Iterator[FrameFaces]:
        flags, handle = video.detect(chunk)
        per_frame = video.finish(video.launch(chunk, flags, handle))
        for frame, faces in zip(chunk, per_frame):
            yield FrameFaces(frame.index, frame.timestamp, faces)


def summarize(frames: Iterable[FrameFaces], class_names: Sequence[str], fps: float = 0.0) -> list[dict]:
    """Per face id: frames, valence and arousal mean and standard deviation, the share of each expression
    (``share_<Class>``) and the dominant one: the figures of ``summary.csv``."""
    summary = VideoSummary("", class_names, fps)
    for frame in frames:
        summary.add(frame.timestamp, frame.faces)
    return summary.faces()
