"""The video tool (``emonet-video``, ``demo_video.py``): arguments, scheduling and outputs around
:class:`emonet.pipeline.VideoPipeline`.

Frames come from a decoding process in chunks of ``--batch-size``. The loop is software-pipelined on a
GPU: a chunk's detection (on a stream of its own) runs while the previous chunk's EmoNet results, which
come back in one asynchronous copy, are read and written; only then is the chunk tracked and cropped, so
the result is the same as one chunk after the other. An annotated video's frames are handed, once the
next chunk is queued, to a drawing process (:class:`emonet.drawing.process.DrawingProcess`), which draws
them where they are, on the GPU, and hands them to encoding processes of their own: the analysis goes on
meanwhile.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch
from tqdm import tqdm

from ..drawing import PALETTE
from ..drawing.marks import TRAIL
from ..drawing.process import DrawingProcess, DrawnVideo, LocalDrawing
from ..io import nvdec
from ..io.atomic import AtomicFile
from ..io.images import InputError, check_writable_dir
from ..io.video import Frame, VideoReader
from ..io.writer import CODECS, check_video_name
from ..models.weights import UNTRAINED_LABEL
from ..pipeline import PendingChunk, Pipeline, VideoPipeline
from ..provenance import provenance, write_sidecar
from ..results import FaceResult, frame_fields, frame_row
from ..summary import VideoSummary
from ..runtime import select_device
from ..timing import LatencyTimer, StartupClock
from ..cli import ToolParser
from ..build import build_detector, build_engine
from .common import add_model_arguments, model_options, run_tool

# This process: emonet: track, crop, network; hand-over: the frames to the drawing process; drawing wait: for
# it, when it is behind. The drawing process: plan: what is drawn (NumPy, OpenCV); draw: drawing it (torch);
# to encoders: copying drawn frames out; encoder wait: for the encoders' free slots, when they are behind.
STAGES = ("decode", "detect", "emonet", "results", "hand-over", "drawing wait", "plan", "draw", "to encoders",
          "encoder wait", "encode")
# Frames drawn at once on a GPU (at least a chunk): each drawing call's host work is mostly a fixed number of
# tensor operations, spread over more frames; the frames wait on the GPU meanwhile (about 3 MB each at 720p).
DRAW_FRAMES = 32
# A video this long waits for the drawing process if it is not up once the model is loaded: the wait (a few
# seconds: Python and torch start) is repaid by drawing beside the analysis over about this many frames.
WAIT_FRAMES = 10_000


class RowWriter:
    """Per-face-per-frame rows to CSV and/or JSONL, flushed as they go, renamed into place on close."""

    def __init__(self, csv_path: Optional[str], jsonl_path: Optional[str], class_names, landmarks: bool,
                 untrained: bool = False) -> None:
        self.class_names = list(class_names)
        self.landmarks = landmarks
        self.fields = frame_fields(self.class_names, landmarks)
        # Untrained (random) weights: every row says so, as the photo tool's JSON does.
        self.extra = {"untrained": 1} if untrained else {}
        self.fields += list(self.extra)
        self.files: list[AtomicFile] = []
        self.csv = self.jsonl = None
        self.stdout = csv_path == "-"  # rows on standard output, as they come
        if csv_path:
            if not self.stdout:
                self.files.append(AtomicFile(csv_path))
            self.csv = csv.writer(sys.stdout if self.stdout else self.files[-1].file)
            self.csv.writerow(self.fields)
        if jsonl_path:
            self.files.append(AtomicFile(jsonl_path))
            self.jsonl = self.files[-1].file

    def frame(self, frame: Frame, faces: list[FaceResult]) -> None:
        """Rows of one frame; a frame with no face gets one row with empty values."""
        for face in faces or [None]:
            row = {**frame_row(face, frame.index, frame.timestamp, self.class_names, self.landmarks), **self.extra}
            if self.csv:
                self.csv.writerow([row.get(f, "") for f in self.fields])
            if self.jsonl:
                self.jsonl.write(json.dumps({f: row.get(f) for f in self.fields}) + "\n")

    def flush(self) -> None:
        """Push finished rows to disk, so an interruption keeps them."""
        for f in self.files:
            f.file.flush()
        if self.stdout:
            sys.stdout.flush()

    def close(self, keep: bool = True) -> None:
        """Finish the files and rename them into place (``keep=False``: delete them instead)."""
        for f in self.files:
            f.commit() if keep else f.abort()
        self.files = []


def _chunks(frames, size: int):
    chunk = []
    for frame in frames:
        chunk.append(frame)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _color(track_id: int):
    return PALETTE[(track_id + 1) % len(PALETTE)]


@dataclass
class Outputs:
    """Where one video's results go (None: not written)."""

    csv: Optional[str] = None
    jsonl: Optional[str] = None
    video: Optional[str] = None
    summary: Optional[VideoSummary] = None   # collects the figures of summary.json and the plot


class LazyPipeline:
    """``loader(frame_shape, frames)``: the engine and detector the arguments ask for, in one pipeline,
    built and warmed up on the first call (so bad input fails before the model loads) and reused after.

    ``job`` is the whole run's frame count where known (a collection's); otherwise the first call's
    ``frames`` (one video's) sizes the warm-up: a short clip does not repay CUDA graphs.
    """

    def __init__(self, args: argparse.Namespace, job: Optional[int] = None) -> None:
        self.args = args
        self.job = job
        self.pipeline: Optional[Pipeline] = None

    def __call__(self, shape: tuple, frames: Optional[int] = None) -> Pipeline:
        if self.pipeline is None:
            args = self.args
            buckets = sorted({1, 4, 16, 64, args.batch_size, 4 * args.batch_size})
            model = model_options(args)
            engine = build_engine(model, batch_sizes=tuple(b for b in buckets if b <= 4 * args.batch_size),
                                  job=self.job if self.job is not None else frames)
            detector = build_detector(model, engine, video=True, small_faces=args.small_faces)
            self.pipeline = Pipeline(engine, detector, max_faces=args.max_faces)
            self.pipeline.warmup(shape)
        return self.pipeline


class VideoJob:
    """State of one video's run: tracking, outputs, trails for drawing, and the time spent in each stage."""

    def __init__(self, args: argparse.Namespace, pipeline: Pipeline, reader: VideoReader, outputs: Outputs,
                 drawing: "Optional[DrawingProcess | LocalDrawing]" = None) -> None:
        self.args = args
        self.reader = reader
        self.outputs = outputs
        self.engine, self.detector, self.pipeline = pipeline.engine, pipeline.detector, pipeline
        self.video = VideoPipeline(pipeline, detect_every=args.detect_every, smooth=args.smooth,
                                   small_faces=args.small_faces)
        self.names = self.engine.class_names
        self.rows = RowWriter(outputs.csv, outputs.jsonl, self.names, args.landmarks, self.engine.untrained)
        self.trails: dict[int, deque] = {}  # face id -> its last (valence, arousal), for the drawn panel
        # Frames are drawn on the engine's device (by a process of its own, see _Drawers); encoding runs in
        # processes of theirs.
        self.drawing = drawing if outputs.video else None
        self.drawn: Optional[DrawnVideo] = None  # how the drawing and encoding went, once closed
        self.undrawn: list[tuple[Frame, list]] = []  # finished frames (rows written), not yet handed over
        self.draw_frames = max(args.batch_size, DRAW_FRAMES if self.engine.device.type == "cuda" else 1)
        if self.drawing is not None:
            banner = f"EmoNet: {UNTRAINED_LABEL}" if self.engine.untrained else None
            height, width = reader.frame_shape[:2]  # (the first frame's: the encoders' ring is made for it now)
            self.video_number = self.drawing.open(outputs.video, reader.fps, self.names, banner, codec=args.codec,
                                                  workers=args.video_workers, frame=(height, width) if height else None)
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.timer = LatencyTimer(self.engine.device)
        self.frames = self.faces = 0

    def _sync(self) -> None:
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)

    def detect(self, chunk: list[Frame]) -> tuple[list[bool], object]:
        """Queue the detector on the chunk's detection frames (needs nothing of the previous chunk's results)."""
        t0 = time.perf_counter()
        planned = self.video.detect(chunk)
        self.seconds["detect"] += time.perf_counter() - t0
        return planned

    def launch(self, chunk: list[Frame], flags: list[bool], handle) -> PendingChunk:
        """Track, crop and queue EmoNet for one chunk; the results come back without waiting for them."""
        t0 = time.perf_counter()
        with self.timer.measure(len(chunk)):
            pending = self.video.launch(chunk, flags, handle)
        self.seconds["emonet"] += time.perf_counter() - t0
        return pending

    def finish(self, pending: PendingChunk) -> None:
        """Wait for a chunk's results; write every frame's rows; keep its frames for drawing (:meth:`draw_some`)."""
        t0 = time.perf_counter()
        per_frame = self.video.finish(pending)
        t1 = time.perf_counter()
        self.seconds["emonet"] += t1 - t0
        for frame, faces in zip(pending.frames, per_frame):
            self.rows.frame(frame, faces)
            if self.outputs.summary is not None:
                self.outputs.summary.add(frame.timestamp, faces)
            self.faces += len(faces)
            self.frames += 1
        self.rows.flush()
        t2 = time.perf_counter()
        self.seconds["results"] += t2 - t1
        if self.drawing is None:
            for frame in pending.frames:
                frame.pixels = frame.ready = None  # done with: free the GPU copy now
            return
        for frame, results in zip(pending.frames, per_frame):
            snapshot = []
            for face in results:  # the trails move on; this frame's drawing must not
                trail = self.trails.setdefault(face.face_id, deque(maxlen=TRAIL))
                trail.append((face.valence, face.arousal))
                snapshot.append((face, list(trail)))
            self.undrawn.append((frame, snapshot))

    def draw_some(self) -> None:
        """Hand the finished frames over for drawing once ``draw_frames`` wait. Called after the next chunk is
        queued: the copy then runs behind that chunk's networks."""
        if len(self.undrawn) >= self.draw_frames:
            self.draw()

    def draw(self) -> None:
        """Hand the frames finished so far to the drawing process (on a GPU, a copy queued there)."""
        undrawn, self.undrawn = self.undrawn, []
        if not undrawn:
            return
        frames = [frame for frame, _ in undrawn]
        faces = [snapshot for _, snapshot in undrawn]
        t0 = time.perf_counter()
        waited = self.drawing.wait_seconds
        self.drawing.put(self.video_number, [frame.on_device(self.engine.device) for frame in frames],
                         [frame.index for frame in frames], faces,
                         [[_color(f.face_id) for f, _ in snapshot] for snapshot in faces])
        waited = self.drawing.wait_seconds - waited
        self.seconds["hand-over"] += time.perf_counter() - t0 - waited
        self.seconds["drawing wait"] += waited
        for frame in frames:
            frame.pixels = frame.ready = None  # copied: free the GPU copy now

    def close(self) -> Optional[Path]:
        """Finish every output; returns the video's path if one was written. No frame: nothing is kept."""
        self.rows.close(keep=self.frames > 0)
        if self.drawing is None:
            return None
        try:
            self.draw()  # every frame with rows is in the video too
        finally:
            self.drawn = self.drawing.finish(self.video_number)  # every frame handed over is drawn, encoded and kept
        if not self.drawn.apart:  # drawn within put(): the hand-over's time is the drawing's stages
            self.seconds["hand-over"] -= sum(v for k, v in self.drawn.seconds.items() if k != "encode")
        self.seconds.update(self.drawn.seconds)
        return self.drawn.path


class _Drawers:
    """Where the annotated videos are drawn: by a process of its own (:class:`DrawingProcess`: the analysis goes
    on meanwhile), started with the first one, if it is up by the time the model is loaded or the video is
    long enough to wait for it (``WAIT_FRAMES``); else in this process (:class:`LocalDrawing`). The choice,
    made for the first video, holds for the others."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.process: Optional[DrawingProcess] = None
        self.chosen: "Optional[DrawingProcess | LocalDrawing]" = None

    def start(self) -> None:
        """Start the drawing process, if not yet started or decided against."""
        if self.process is None and self.chosen is None:
            self.process = DrawingProcess(select_device(self.args.device, quiet=True))

    def warm(self, frame: tuple[int, int]) -> None:
        """Have the drawing process draw a frame of ``frame`` = (H, W) once, while the model loads."""
        if self.process is not None:
            self.process.warm(frame)

    def choose(self, frames: Optional[int]) -> "DrawingProcess | LocalDrawing":
        """The drawing for a video of ``frames`` (None: unknown, a camera's), once the model is loaded."""
        if self.chosen is None:
            if self.process.ready or not frames or frames >= WAIT_FRAMES:
                self.chosen = self.process
            else:
                self.process.close(now=True)
                self.chosen, self.process = LocalDrawing(self.process.device), None
        return self.chosen

    def close(self) -> None:
        """Finish every video still open, and end the process."""
        if self.chosen is not None:
            self.chosen.close()
        elif self.process is not None:
            self.process.close(now=True)


class _Stop:
    """Ctrl-C or SIGTERM during a run (SIGTERM as Ctrl-C: outputs are finished, not lost). Until frames
    flow, it stops at once; while they do (``flowing``), the first asks the run to stop once the chunk in
    hand is written everywhere (a frame is then in every output or in none), and a second stops at once."""

    def __init__(self) -> None:
        self.flowing = self.asked = False

    def _ask(self, signum, frame) -> None:
        if self.asked or not self.flowing:
            raise KeyboardInterrupt
        self.asked = True

    def install(self) -> "_Stop":
        """Take over Ctrl-C and SIGTERM (from the main thread)."""
        self._previous = {s: signal.signal(s, self._ask) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def restore(self) -> None:
        """Give them back to their previous handlers."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)


@dataclass
class VideoRun:
    """How one video's run ended."""

    job: Optional[VideoJob]
    wall: float                     # seconds from the first frame to the end
    video: Optional[Path]           # the annotated video, if one was written
    interrupted: bool
    cpu: dict                       # CPU-seconds meanwhile: this process, decoding, encoding
    error: Optional[InputError] = None  # decoding failed part-way: the frames before are kept
    source: str = ""
    shortfall: Optional[str] = None     # why the frames read are not the whole video (truncated, damaged)


@dataclass
class VideoTask:
    """One video to analyse: its source, where its results go, its reader if opened ahead, its progress label."""

    source: str
    outputs: Outputs
    reader: Optional[VideoReader] = None
    desc: Optional[str] = None


def _cpu_seconds() -> tuple[float, float]:
    """CPU-seconds so far of this process, and of its children that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def open_reader(args: argparse.Namespace, source: str) -> VideoReader:
    """The video's reader as the arguments ask (decoding starts at once, in a process of its own, or on NVDEC).

    With a GPU the frames are kept there only: detection, crops and drawing all read them there. NVDEC
    decodes where ``--decoder`` asks for it (``auto``: while an annotated video is written, x264 then has
    the cores PyAV's decoding would take).
    """
    use_nvdec = args.decoder == "nvdec" or (args.decoder == "auto" and bool(args.output))
    reader = VideoReader(source, start=args.start, end=args.end, max_frames=args.max_frames,
                         device=select_device(args.device, quiet=True), keep_host=False, use_nvdec=use_nvdec)
    if args.decoder == "nvdec" and reader.nvdec_refused:
        print(f"note: {source} is decoded on the CPU, not by NVDEC: {reader.nvdec_refused}", file=sys.stderr)
    return reader


class _Running:
    """One video while its chunks flow: its job, reader, progress bar and clocks."""

    def __init__(self, args: argparse.Namespace, task: VideoTask, reader: VideoReader, get_pipeline,
                 startup: Optional[StartupClock], drawers: "_Drawers") -> None:
        self.reader, self.startup, self.source = reader, startup, task.source
        self.error: Optional[InputError] = None
        self.ended = False
        height, width, _ = reader.frame_shape
        if startup is not None:
            startup.mark("opening the video")
        pipeline = get_pipeline((height or 720, width or 1280, 3), reader.expected_frames)  # cameras may not say
        if startup is not None:
            startup.mark("model, engine and warm-up")
        self.cpu0 = _cpu_seconds()  # before the job exists: its processes' CPU is counted from here
        drawing = drawers.choose(reader.expected_frames) if task.outputs.video else None
        self.job = VideoJob(args, pipeline, reader, task.outputs, drawing)
        self.wall0 = time.perf_counter()  # model loading and warm-up are reported on their own
        self.bar = tqdm(total=reader.expected_frames, unit="frame", file=sys.stderr, dynamic_ncols=True,
                        desc=task.desc)

    def finish(self, done: PendingChunk) -> None:
        """Read a chunk's results and write them everywhere."""
        self.job.finish(done)
        if self.startup is not None:
            self.startup.mark("first frames")
        self.bar.update(len(done.frames))
        self.bar.set_postfix(faces=self.job.faces, refresh=False)

    def complete(self, last: Optional[PendingChunk], interrupted: bool = False) -> VideoRun:
        """Read the video's last chunk (if any), then :meth:`end` it."""
        if last is not None:
            self.finish(last)
        return self.end(interrupted)

    def end(self, interrupted: bool) -> VideoRun:
        """Close the reader and every output (each finished frame kept); how the run went."""
        self.ended = True
        self.bar.close()
        video = None
        try:
            self.reader.close()
        finally:
            try:
                video = self.job.close()
            except InputError as exc:  # the annotated video could not be written: this video's error
                self.error = self.error or exc
        self.job._sync()
        own, children = (b - a for a, b in zip(self.cpu0, _cpu_seconds()))  # the reader's have ended
        drawn = self.job.drawn
        drawing, encoding = (drawn.cpu.get("drawing", 0.0), drawn.cpu["encoding"]) if drawn is not None else (0.0, 0.0)
        if drawn is not None and not drawn.apart:  # the encoders were this process's children
            children -= encoding
        cpu = {"this process": own, "decoding": children, "drawing": drawing, "encoding": encoding}
        return VideoRun(self.job, time.perf_counter() - self.wall0, video, interrupted, cpu, self.error, self.source,
                        None if interrupted else self.reader.shortfall)


def analyse_many(args: argparse.Namespace, tasks: Iterable[VideoTask], get_pipeline,
                 startup: Optional[StartupClock] = None) -> Iterator[VideoRun]:
    """Run videos through the pipeline one after the other, each video's :class:`VideoRun` given once its
    outputs are closed; ``get_pipeline(shape, frames)`` loads the pipeline on first use, ``startup`` (if
    given) is marked as it loads and the first results come.

    Software-pipelined on a GPU: chunk n's detection is queued, chunk n - 1's results are read while it runs
    (their landmarks place chunk n's crops), then chunk n is tracked, cropped and queued. Across videos
    nothing waits: the next video's first chunk, which needs nothing of the last, is queued before the last
    video's final chunk is read. Ctrl-C and SIGTERM end the run cleanly: every finished frame is kept in
    every output, and the video being read is given as interrupted, the last one.
    """
    stop = _Stop().install()
    # With the networks on a GPU, this process's CPU tensor work (the detector's box decoding) is small;
    # torch's default of a thread per core only competes with FFmpeg's decoding threads for the CPU.
    threads = torch.get_num_threads()
    current: Optional[_Running] = None
    previous: Optional[tuple[_Running, PendingChunk]] = None  # the last video's final chunk, not yet read
    drawers = _Drawers(args)
    try:
        for task in tasks:
            if task.outputs.video:  # the drawing process starts up while the video opens and the model loads
                drawers.start()
            reader = task.reader if task.reader is not None else open_reader(args, task.source)
            if task.outputs.video and reader.frame_shape[0]:
                drawers.warm(reader.frame_shape[:2])
            if reader.device is not None:
                torch.set_num_threads(min(4, threads))
            try:
                current = _Running(args, task, reader, get_pipeline, startup, drawers)
            except BaseException:
                reader.close()
                raise
            startup = None
            pending = None
            stop.flowing = True
            try:
                for chunk in _chunks(reader, args.batch_size):
                    flags, boxes = current.job.detect(chunk)
                    if pending is not None:
                        current.finish(pending)
                    if stop.asked:  # the chunk only queued is dropped: it is in no output
                        pending = None
                        break
                    launched = current.job.launch(chunk, flags, boxes)
                    current.job.draw_some()  # the chunk just read, while the GPU runs the one just queued
                    if previous is not None:  # the last video's final chunk, read while this one's first runs
                        done, previous = previous, None
                        yield done[0].complete(done[1])
                    pending = launched
            except InputError as exc:  # decoding failed part-way: the frames before it are kept
                current.error = exc
                pending = None
            if previous is not None:  # this video gave no chunk
                done, previous = previous, None
                yield done[0].complete(done[1])
            if stop.asked or pending is None:
                run, current = current.complete(pending, interrupted=stop.asked), None
                yield run
                if stop.asked:
                    return
            else:
                previous, current = (current, pending), None
        if previous is not None:
            done, previous = previous, None
            yield done[0].complete(done[1])
    except KeyboardInterrupt:
        # Stopped at once (a second Ctrl-C, or one before frames flowed): what is finished is kept; the
        # chunks still on the GPU are in no output.
        last = VideoRun(None, 0.0, None, True, {})
        for running in (previous[0] if previous else None, current):
            if running is not None and not running.ended:
                last = running.end(interrupted=True)
        yield last  # the run ends here, and says so
    finally:
        stop.restore()
        torch.set_num_threads(threads)
        for running in (previous[0] if previous else None, current):
            if running is not None and not running.ended:
                running.end(interrupted=True)
        drawers.close()


def no_frames(source: str) -> InputError:
    """The error of a video from which no frame could be read."""
    return InputError(f"{source}: no frame could be read (empty, corrupt, or a codec neither FFmpeg nor OpenCV decodes)")


def analyse(args: argparse.Namespace, source: str, outputs: Outputs, get_pipeline,
            desc: Optional[str] = None, startup: Optional[StartupClock] = None) -> VideoRun:
    """One video through the pipeline (see :func:`analyse_many`); a decoding error part-way is raised once the
    frames before it are written."""
    runs = list(analyse_many(args, [VideoTask(source, outputs, desc=desc)], get_pipeline, startup))
    if runs[-1].error is not None:
        raise runs[-1].error
    return runs[-1]


def run(args: argparse.Namespace) -> int:
    """Process the video; 0 when done (or interrupted cleanly), 2 on bad input."""
    if args.out_dir is not None:
        from .collection import run_collection
        return run_collection(args)
    startup = StartupClock()
    source = args.video[0]
    for path in (args.output, args.csv, args.jsonl):
        if path and path != "-":
            check_writable_dir(Path(path).parent if str(Path(path).parent) else Path("."))
    if args.output:
        check_video_name(args.output, args.codec)
    result = analyse(args, source, Outputs(args.csv, args.jsonl, args.output), LazyPipeline(args), startup=startup)
    job = result.job
    if job is None or job.frames == 0:
        if result.interrupted:
            print("interrupted before the first frame", file=sys.stderr)
            return 130
        raise no_frames(source)
    _summary(job, job.reader, result)
    rows = args.jsonl if args.csv in (None, "-") else args.csv
    if rows:  # what made these rows, and whether they are the whole video
        meta = write_sidecar(rows, provenance(job.engine), {
            "video": source, "frames": job.frames, "declared_frames": (job.reader.ending.declared or None)
            if job.reader.ending else None, "complete": not result.interrupted and result.shortfall is None,
            "warning": result.shortfall, "interrupted": result.interrupted})
        print(f"provenance: {meta}", file=sys.stderr)
    print(startup.format("first results"), file=sys.stderr)
    if result.shortfall:
        print(f"warning: {source}: {result.shortfall}; the outputs hold the frames that were read", file=sys.stderr)
    return 130 if result.interrupted else 1 if result.shortfall else 0


def _summary(job: VideoJob, reader: VideoReader, run: VideoRun) -> None:
    err = sys.stderr
    wall, video, interrupted = run.wall, run.video, run.interrupted
    job.seconds["decode"] = reader.decode_seconds
    print(f"\n{'interrupted: ' if interrupted else ''}{job.frames} frames, {job.faces} faces, "
          f"{job.frames / max(wall, 1e-9):.1f} frames/s end to end ({wall:.2f} s)", file=err)
    drawn = job.drawn
    shown = {k: v for k, v in job.seconds.items() if drawn is not None or k in STAGES[:4]}
    per = ", ".join(f"{k} {1e3 * v / max(job.frames, 1):.2f}" for k, v in shown.items())
    others = ""
    if drawn is not None:
        others = (f"{'; plan, draw, to encoders and encoder wait in the drawing process' if drawn.apart else ''}; "
                  f"encode in {drawn.workers} encoding process{'es' if drawn.workers > 1 else ''} (their time adds up)")
    where = "is NVDEC's, on the GPU" if reader.nvdec else "runs in a process of its own"
    print(f"time per frame by stage (ms; decode {where}{others}; the rest in this one, "
          f"EmoNet with tracking and crops): {per}", file=err)
    cores = sum(run.cpu.values()) / max(wall, 1e-9)
    print("CPU-seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in run.cpu.items() if v > 0)
          + f" ({cores:.1f} of {os.cpu_count()} cores busy on average)", file=err)
    if drawn is not None and drawn.resized:
        print("note: the video changed frame size; frames were resized to the first frame's size", file=err)
    for path, what in ((video, "annotated video"), (job.outputs.csv, "CSV"), (job.outputs.jsonl, "JSONL")):
        if path and path != "-":
            print(f"{what}: {path}", file=err)
    print(job.timer.summary().format(f"crop + EmoNet per batch (up to {job.args.batch_size} frames)", "frame"), file=err)
    if job.engine.untrained:
        print(f"note: {UNTRAINED_LABEL}", file=err)


EXAMPLES = """examples:
  %(prog)s --video clip.mp4 --output annotated.mp4 --csv frames.csv
  %(prog)s --video recordings/ --out-dir results/          # every video: rows, summary, plot; summary.csv
  torchrun --nproc-per-node 2 %(prog)s --video recordings/ --out-dir results/   # shared over 2 GPUs
  %(prog)s --video clip.mp4 --csv frames.csv --landmarks --start 10 --end 20
  %(prog)s --video clip.mp4 --jsonl frames.jsonl --weights random     # try it without the released weights
  %(prog)s --video 0                                                  # a camera: rows on the terminal
  %(prog)s --video 0 --csv camera.csv --output camera.mp4             # a camera, kept
"""


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The video tool's command line."""
    parser = ToolParser(
        prog=prog, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Stream a video (or camera) through face detection, tracking and EmoNet; write per-frame "
                    "results and an annotated video. Ctrl-C or SIGTERM stops cleanly, keeping every finished "
                    "frame.")
    parser.add_argument("--video", required=True, nargs="+", metavar="VIDEO",
                        help="video file, numbered images (\"frames/%%04d.png\") or a camera index such as 0; with "
                             "--out-dir: any number of files, folders and glob patterns")
    out = parser.add_argument_group("outputs (none given: the rows on standard output)")
    out.add_argument("--output", metavar="FILE", help="annotated video at the source's frame rate (.mp4; also .mov, "
                                                      ".mkv, .avi)")
    out.add_argument("--codec", choices=CODECS, default="h264",
                     help="h264 (default: yuv420p, index at the front, plays in browsers and players; needs "
                          "PyAV) or mp4v (MPEG-4 Part 2 through OpenCV, for setups without PyAV)")
    out.add_argument("--video-workers", type=int, default=None, metavar="N",
                     help="processes that encode the annotated video, each a segment at a time (default: 1, "
                          "with x264's frame threads on three quarters of the cores, up to 12; mp4v: 1)")
    out.add_argument("--csv", metavar="FILE", help="one row per face per frame (a frame with no face: one row "
                                                   "with empty values); - for standard output, the default "
                                                   "when nothing else is to be written")
    out.add_argument("--jsonl", metavar="FILE", help="the same rows as JSON lines")
    out.add_argument("--landmarks", action="store_true", help="add the 68 landmarks to the rows")
    many = parser.add_argument_group("many videos in one run (the model loads once; torchrun shares them over GPUs)")
    many.add_argument("--out-dir", metavar="DIR",
                      help="for each video STEM: DIR/STEM.csv (rows), DIR/STEM.summary.json, DIR/STEM.png (plot); "
                           "and DIR/summary.csv, one row per video and face")
    many.add_argument("--output-videos", action="store_true", help="with --out-dir: also DIR/STEM.mp4, annotated")
    many.add_argument("--force", action="store_true",
                      help="with --out-dir: redo videos whose outputs are complete (default: skip them)")
    out.add_argument("--no-video", action="store_true",
                     help="analysis only (the default without --output; kept for older scripts)")
    run_group = parser.add_argument_group("what to process")
    run_group.add_argument("--max-frames", type=int, default=None, help="stop after N frames")
    run_group.add_argument("--start", type=float, default=0.0, help="start at this time in seconds (default: 0)")
    run_group.add_argument("--end", type=float, default=None, help="stop at this time in seconds (default: the end)")
    run_group.add_argument("--batch-size", type=int, default=32,
                           help="frames whose faces go through EmoNet together (default: 32; smaller gives the "
                                "first rows sooner, larger adds little)")
    run_group.add_argument("--detect-every", type=int, default=5,
                           help="run the face detector every N frames, and whenever a face is lost; in between, "
                                "crop from the last landmarks (default: 5)")
    run_group.add_argument("--small-faces", action="store_true",
                           help="also find and keep faces under a tenth of the frame's long side (from about 40 px "
                                "in 1080p), and nothing else: the frame is searched in tiles every 60 frames, each "
                                "small face it follows is looked for in a view around it, and every candidate is "
                                "looked at again close up, as in photos (threshold 0.75: no flower or cat passes); "
                                "costs about 40 %% of the speed on a GPU (docs/PERFORMANCE.md, Face detection)")
    run_group.add_argument("--decoder", choices=("auto", "cpu", "nvdec"), default="auto",
                           help="where a video file is decoded: auto (default) decodes on the GPU's NVDEC while "
                                "an annotated video is written, if NVIDIA's PyNvVideoCodec is installed (x264 then "
                                "has the cores), else with FFmpeg on the CPU; cpu: always FFmpeg; nvdec: NVDEC "
                                "for analysis alone too (files NVDEC cannot decode, collections and --start: "
                                "the CPU)")
    run_group.add_argument("--max-faces", type=int, default=None, help="at most this many faces per frame")
    run_group.add_argument("--smooth", action=argparse.BooleanOptionalAction, default=True,
                           help="temporal smoothing per face, a weighted mean of the last 5 outputs (default: on)")
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("batch_size", "detect_every", "max_frames", "video_workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    if args.start < 0:
        parser.error(f"--start must be 0 or more seconds, not {args.start:g}")
    if args.end is not None and args.end <= args.start:
        parser.error(f"--end ({args.end:g} s) must come after --start ({args.start:g} s)")
    if args.decoder == "nvdec" and not nvdec.available():
        parser.error("--decoder nvdec needs NVIDIA's PyNvVideoCodec (pip install PyNvVideoCodec) and an NVIDIA GPU")
    if args.no_video and args.output:
        parser.error("--no-video and --output ask for opposite things: drop one")
    if args.small_faces and args.detector != "blazeface":
        parser.error(f"--small-faces needs --detector blazeface ({args.detector} searches each frame its own way)")
    if args.out_dir is not None:
        if args.output or args.csv or args.jsonl:
            parser.error("with --out-dir every output is named after its video: drop --output, --csv and --jsonl "
                         "(--output-videos adds the annotated videos)")
        return args
    if args.output_videos or args.force:
        parser.error("--output-videos and --force go with --out-dir")
    if len(args.video) > 1 or any(c in args.video[0] for c in "*?[") or Path(args.video[0]).is_dir():
        parser.error(f"{' '.join(args.video)}: several videos (or a folder or pattern) need --out-dir DIR")
    if not (args.output or args.csv or args.jsonl):
        args.csv = "-"  # nothing to keep asked for: the rows go to the terminal (a camera's first look)
    return args


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """``emonet-video`` / ``demo_video.py``."""
    args = parse_args(argv, prog)
    return run_tool(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
