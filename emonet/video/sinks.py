"""Where a run's results go: per-frame rows (CSV, JSON lines), the per-video summary and plot, the annotated
video, a Python callback. Each is a :class:`~emonet.video.runner.Sink` (the runner says when it calls what);
a video's sinks are given with its source (:class:`~emonet.video.runner.VideoInput`).
"""
from __future__ import annotations

import csv
import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Optional, TextIO, Union

import torch

from ..drawing import PALETTE
from ..errors import OutputError
from ..drawing.marks import TRAIL
from ..drawing.process import DrawingProcess, DrawnVideo, LocalDrawing
from ..io.atomic import AtomicFile
from ..io.images import STDOUT
from ..io.video import Frame
from ..models.weights import UNTRAINED_LABEL
from ..provenance import provenance
from ..results import N_LANDMARKS, FaceResult, frame_fields, frame_row
from ..summary import PlotProcess, VideoSummary
from .config import DRAW_FRAMES, WAIT_FRAMES
from .runner import Sink, VideoRun
from .sources import Source


class RowSink(Sink):
    """One row per face per frame (a frame without a face: one row of empty values) to CSV and/or JSON lines
    (either one, not both, may be ``"-"``: standard output, as they come), flushed chunk by chunk, files renamed
    into place at the end. Nothing is written, not even the CSV header, before the first frame's rows: a video
    that gives no frame leaves every output untouched. In JSON lines the landmarks are one ``"landmarks"``
    list of ``[x, y]`` pairs, as in the photo tool's JSON; the CSV has a column per coordinate."""

    def __init__(self, csv_path: Optional[str] = None, jsonl_path: Optional[str] = None, landmarks: bool = False) -> None:
        super().__init__()
        if csv_path == STDOUT and jsonl_path == STDOUT:
            raise ValueError("the CSV and the JSON lines cannot both go to standard output")
        self.csv_path, self.jsonl_path, self.landmarks = csv_path, jsonl_path, landmarks
        self.files: list[AtomicFile] = []
        self.csv = self.jsonl = None
        self.stdout = STDOUT in (csv_path, jsonl_path)
        self.header_due = False

    def open(self, run: VideoRun) -> None:
        self.class_names = list(run.engine.class_names)
        self.fields = frame_fields(self.class_names, self.landmarks)
        # Untrained (random) weights: every row says so, as the photo tool's JSON does.
        self.extra = {"untrained": 1} if run.engine.untrained else {}
        self.fields += list(self.extra)
        self.json_fields = (frame_fields(self.class_names, False) + (["landmarks"] if self.landmarks else [])
                            + list(self.extra))
        if self.csv_path:
            self.csv = csv.writer(self._stream(self.csv_path))
            self.header_due = True
        if self.jsonl_path:
            self.jsonl = self._stream(self.jsonl_path)

    def _stream(self, path: str) -> TextIO:
        if path == STDOUT:
            return sys.stdout
        self.files.append(AtomicFile(path))
        return self.files[-1].file

    def _json(self, row: dict) -> str:
        record = {f: row.get(f) for f in self.json_fields}
        if self.landmarks:  # the CSV's rounded values, in pairs; null for a frame with no face
            record["landmarks"] = ([[row[f"lm{i}_x"], row[f"lm{i}_y"]] for i in range(N_LANDMARKS)]
                                   if "lm0_x" in row else None)
        return json.dumps(record)

    def add(self, frames: list[Frame], faces: list[list[FaceResult]]) -> None:
        try:
            if self.header_due and frames:
                self.csv.writerow(self.fields)
                self.header_due = False
            for frame, found in zip(frames, faces):
                for face in found or [None]:
                    row = {**frame_row(face, frame.index, frame.timestamp, self.class_names, self.landmarks),
                           **self.extra}
                    if self.csv:
                        self.csv.writerow([row.get(f, "") for f in self.fields])
                    if self.jsonl:
                        self.jsonl.write(self._json(row) + "\n")
            for f in self.files:  # on disk chunk by chunk: an interruption keeps them
                f.file.flush()
            if self.stdout:
                sys.stdout.flush()
        except OSError as exc:  # a full disk, a file grown past its limit: said in one line, the run ends
            raise OutputError(f"{self._names()}: the rows could not be written ({exc.strerror or exc})") from None

    def close(self, run: VideoRun) -> None:
        failed = None
        for f in self.files:  # each file whole or not at all; one that fails does not keep the others back
            try:
                f.commit() if run.frames > 0 else f.abort()
            except OSError as exc:
                f.abort()
                failed = failed or OutputError(f"{f.path}: the rows could not be written ({exc.strerror or exc})")
        self.files = []
        if failed is not None:
            raise failed

    def _names(self) -> str:
        return ", ".join(str(f.path) for f in self.files) or "standard output"


class SummarySink(Sink):
    """The video's figures per face (:class:`~emonet.summary.VideoSummary`); with ``json_path``, written
    there once the video is complete (not interrupted, no error), and its plot by ``plots`` to ``plot_path``."""

    def __init__(self, video: str, json_path: Optional[Union[str, Path]] = None,
                 plot_path: Optional[Union[str, Path]] = None, plots: Optional[PlotProcess] = None) -> None:
        super().__init__()
        self.summary = VideoSummary(video, [], 0.0)
        self.json_path, self.plot_path, self.plots = json_path, plot_path, plots

    def open(self, run: VideoRun) -> None:
        self.summary.class_names, self.summary.untrained = list(run.engine.class_names), run.engine.untrained
        self.summary.fps = run.source.fps

    def add(self, frames: list[Frame], faces: list[list[FaceResult]]) -> None:
        for frame, found in zip(frames, faces):
            self.summary.add(frame.timestamp, found)

    def close(self, run: VideoRun) -> None:
        if self.json_path is None or run.interrupted or run.error is not None or run.frames == 0:
            return
        self.summary.note = run.shortfall
        self.summary.provenance = provenance(run.engine)
        self.summary.write_json(self.json_path)
        if self.plots is not None and self.plot_path is not None:
            self.plots.submit(self.summary, self.plot_path)


class CallbackSink(Sink):
    """``callback(frame, faces)`` for every frame, in order."""

    def __init__(self, callback: Callable[[Frame, list[FaceResult]], None]) -> None:
        super().__init__()
        self.callback = callback

    def add(self, frames: list[Frame], faces: list[list[FaceResult]]) -> None:
        for frame, found in zip(frames, faces):
            self.callback(frame, found)


class Drawers:
    """Where a run's annotated videos are drawn: by a process of its own (:class:`DrawingProcess`: the analysis
    goes on meanwhile), started as the first video opens if that video is long enough to wait for it
    (:data:`~emonet.video.config.WAIT_FRAMES`, or of unknown length: a camera's); else in this process
    (:class:`LocalDrawing`). The choice, made for the first video, holds for the others. Close it at the end.

    A shorter video never waited for the process (its Python and torch start outlast the model's load), and
    starting it anyway slowed the model's load beside it: such a video starts none."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.process: Optional[DrawingProcess] = None
        self.chosen: "Optional[DrawingProcess | LocalDrawing]" = None

    def start(self, frames: Optional[int] = None) -> None:
        """For the first video, of ``frames`` frames (None: unknown), as it opens, or a collection's videos
        together: start the drawing process, or choose to draw in this process (nothing, once decided)."""
        if self.process is None and self.chosen is None:
            if frames is None or frames >= WAIT_FRAMES:
                self.process = DrawingProcess(self.device)
            else:
                self.chosen = LocalDrawing(self.device)

    def warm(self, frame: tuple[int, int]) -> None:
        """Have the drawing process draw a frame of ``frame`` = (H, W) once, or this process make that size's
        panel sprites, while the model loads."""
        drawing = self.process or self.chosen
        if drawing is not None:
            drawing.warm(frame)

    def choose(self, frames: Optional[int]) -> "DrawingProcess | LocalDrawing":
        """The drawing for a video of ``frames`` (None: unknown, a camera's), once the model is loaded."""
        if self.chosen is None:
            self.start(frames)
            self.chosen = self.chosen or self.process
        return self.chosen

    def close(self) -> None:
        """Finish every video still open, and end the process."""
        if self.chosen is not None:
            self.chosen.close()
        elif self.process is not None:
            self.process.close(now=True)


def _color(track_id: int):
    return PALETTE[(track_id + 1) % len(PALETTE)]


class AnnotatedSink(Sink):
    """The annotated video at ``path`` (boxes, labels, a valence-arousal panel with trails), drawn where the
    frames are (on a GPU, there) by ``drawers``, handed over after the next chunk is queued."""

    keeps_frames = True

    def __init__(self, path: str, drawers: Drawers, codec: str = "h264") -> None:
        super().__init__()
        self.path, self.drawers, self.codec = path, drawers, codec
        self.trails: dict[int, deque] = {}  # face id -> its last (valence, arousal), for the drawn panel
        self.undrawn: list[tuple[Frame, list]] = []  # finished frames (rows written), not yet handed over
        self.drawn: Optional[DrawnVideo] = None  # how the drawing and encoding went, once closed
        self.drawing = None
        self.seconds = {"hand-over": 0.0, "drawing wait": 0.0}

    def prepare(self, source: Source) -> None:
        self.drawers.start(source.expected_frames)  # up while the model loads
        if source.frame_shape[0]:
            self.drawers.warm(source.frame_shape[:2])

    def open(self, run: VideoRun) -> None:
        self.device = run.engine.device
        self.draw_frames = max(run.config.batch_size, DRAW_FRAMES if self.device.type == "cuda" else 1)
        self.drawing = self.drawers.choose(run.source.expected_frames)
        banner = f"EmoNet: {UNTRAINED_LABEL}" if run.engine.untrained else None
        height, width = run.source.frame_shape[:2]  # (the first frame's: the encoder's ring is made for it now)
        self.number = self.drawing.open(self.path, run.source.fps, run.engine.class_names, banner, codec=self.codec,
                                        frame=(height, width) if height else None)

    def add(self, frames: list[Frame], faces: list[list[FaceResult]]) -> None:
        for frame, found in zip(frames, faces):
            snapshot = []
            for face in found:  # the trails move on; this frame's drawing must not
                trail = self.trails.setdefault(face.face_id, deque(maxlen=TRAIL))
                trail.append((face.valence, face.arousal))
                snapshot.append((face, list(trail)))
            self.undrawn.append((frame, snapshot))

    def idle(self) -> None:
        """Hand the finished frames over once ``draw_frames`` wait: the copy then runs behind the chunk just queued."""
        if len(self.undrawn) >= self.draw_frames:
            self._hand_over()

    def _hand_over(self) -> None:
        undrawn, self.undrawn = self.undrawn, []
        if not undrawn:
            return
        frames = [frame for frame, _ in undrawn]
        faces = [snapshot for _, snapshot in undrawn]
        t0 = time.perf_counter()
        waited = self.drawing.wait_seconds
        self.drawing.put(self.number, [frame.on_device(self.device) for frame in frames],
                         [frame.index for frame in frames], faces,
                         [[_color(f.face_id) for f, _ in snapshot] for snapshot in faces])
        waited = self.drawing.wait_seconds - waited
        self.seconds["hand-over"] += time.perf_counter() - t0 - waited
        self.seconds["drawing wait"] += waited
        for frame in frames:
            frame.pixels = frame.ready = None  # copied: free the GPU copy now

    def close(self, run: VideoRun) -> None:
        """Every frame with rows is in the video too; it is drawn, encoded and renamed into place (raises
        :class:`~emonet.errors.OutputError` if it could not be written)."""
        if self.drawing is None:
            return
        try:
            self._hand_over()
        finally:
            self.drawn = self.drawing.finish(self.number)
        if not self.drawn.apart:  # drawn within put(): the hand-over's time holds the drawing's stages
            self.seconds["hand-over"] -= (sum(v for k, v in self.drawn.seconds.items() if k != "encode")
                                          - self.drawn.not_in_put)
        self.seconds.update(self.drawn.seconds)
        run.video_path = self.drawn.path
        run.drawn = self.drawn


def sinks_for(csv_path: Optional[str] = None, jsonl_path: Optional[str] = None, video: Optional[str] = None,
              drawers: Optional[Drawers] = None, landmarks: bool = False,
              codec: str = "h264") -> list[Sink]:
    """The sinks of one video's rows and annotated video (those asked for)."""
    sinks: list[Sink] = []
    if csv_path or jsonl_path:
        sinks.append(RowSink(csv_path, jsonl_path, landmarks))
    if video:
        if drawers is None:
            raise ValueError("an annotated video needs Drawers")
        sinks.append(AnnotatedSink(video, drawers, codec))
    return sinks

