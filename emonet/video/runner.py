"""The one loop every video goes through: chunks of frames from a source, through detect -> track -> crop ->
engine -> results, to the video's sinks; for a file, a camera, a collection or frames from Python alike.

:func:`run_videos` is software-pipelined on a GPU: chunk n's detection is queued (on a stream of its own),
chunk n - 1's results are read while it runs (their landmarks place chunk n's crops), then chunk n is
tracked, cropped and queued, and the sinks' :meth:`~emonet.video.sinks.Sink.idle` work (the annotated video's
hand-over) runs behind it. Across videos nothing waits: the next video's first chunk, which needs nothing of
the last, is queued before the last video's final chunk is read. It yields every frame with its faces
(:class:`~emonet.results.FrameFaces`) and, once a video's sinks are closed, its :class:`VideoRun`.
"""
from __future__ import annotations

import resource
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

import torch

from ..drawing.process import DrawnVideo
from ..engine.graphs import synchronize
from ..errors import HelperError, InputError, OutputError
from ..io.video import Frame
from ..log import progress_bar
from ..pipeline import Pipeline
from ..scheduler import PendingStep, SettledChunk
from ..session import VideoPipeline
from ..results import FaceResult, FrameFaces
from ..timing import LatencyTimer, StartupClock
from .config import GPU_RUN_THREADS, STAGES, VideoConfig
from .loading import PipelineLoader
from .sources import Source


class StopToken:
    """Asks a run to stop. :meth:`install` lets Ctrl-C and SIGTERM ask (SIGTERM as Ctrl-C: outputs are
    finished, not lost): until frames flow, a signal stops at once; while they do, the first asks the run to
    stop once the chunk in hand is written everywhere (a frame is then in every output or in none), and a
    second stops at once. :meth:`stop` asks from code (another thread, a server)."""

    def __init__(self) -> None:
        self.flowing = self.asked = False
        self._previous: dict = {}

    def stop(self) -> None:
        """Stop after the chunk in hand."""
        self.asked = True

    def _signal(self, signum, frame) -> None:
        if self.asked or not self.flowing:
            raise KeyboardInterrupt
        self.asked = True

    def install(self) -> "StopToken":
        """Take over Ctrl-C and SIGTERM (from the main thread; :meth:`restore` gives them back)."""
        self._previous = {s: signal.signal(s, self._signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def restore(self) -> None:
        """Give Ctrl-C and SIGTERM back to their previous handlers."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}


class Sink:
    """A consumer of one video's results (:mod:`emonet.video.sinks` has the tools' own); every step does
    nothing unless a sink says otherwise. The runner calls, in this order: ``prepare(source)`` once the
    source is open, before the model loads (start what takes time to start); ``open(run)`` once the model is
    loaded; ``add(frames, faces)`` for every chunk's results, in order; ``idle()`` after the next chunk is
    queued on the device (work that should run behind the network); ``close(run)`` when the video ends
    (``run`` says how): what it wrote is kept if the run read a frame, else removed."""

    keeps_frames = False  # holds the frames' pixels after add() (and frees them itself)

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}  # time by stage, reported with the run's (see config.STAGES)

    def prepare(self, source: Source) -> None:
        """The source is open; the model is about to load."""

    def open(self, run: "VideoRun") -> None:
        """The model is loaded; frames come next."""

    def add(self, frames: list[Frame], faces: list[list[FaceResult]]) -> None:
        """A chunk's frames and, per frame, its faces."""

    def idle(self) -> None:
        """The next chunk is queued on the device: a moment for work that runs behind it."""

    def close(self, run: "VideoRun") -> None:
        """The video has ended (``run`` says how); finish what was written."""


@dataclass
class VideoInput:
    """One video to run: its source (or a function that opens it: the model then loads while it opens), its
    sinks, and its progress bar (on standard error) with its label."""

    source: Union[Source, Callable[[], Source]]
    sinks: list[Sink] = field(default_factory=list)
    label: Optional[str] = None
    progress: bool = True
    name: str = ""  # how messages name it (default: the source's own name)


def _cpu_seconds() -> tuple[float, float]:
    """CPU-seconds so far of this process, and of its children that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class VideoRun:
    """One video's processing: its tracking (:class:`~emonet.session.VideoPipeline`), sinks, progress bar and
    clocks while its chunks flow; once :meth:`close`\\ d, how it went."""

    def __init__(self, video: VideoInput, source: Source, pipeline: Pipeline, config: VideoConfig) -> None:
        self.source, self.sinks, self.config = source, video.sinks, config
        self.name = video.name or str(source.source)
        self.pipeline, self.engine = pipeline, pipeline.engine
        self.tracking = VideoPipeline(pipeline, detect_every=config.detect_every, smooth=config.smooth)
        self.frames = self.faces = 0
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.timer = LatencyTimer(self.engine.device)
        # How it went, once closed.
        self.closed = False
        self.interrupted = False
        self.error: Optional[Exception] = None     # decoding or an output failed part-way: the frames before are kept
        self.shortfall: Optional[str] = None       # why the frames read are not the whole video (truncated, damaged)
        self.video_path: Optional[Path] = None     # the annotated video, if one was written
        self.drawn: Optional[DrawnVideo] = None    # how its drawing and encoding went
        self.wall = 0.0                            # seconds from the first frame to the end
        # (seconds, frames) from one chunk's results handed out to the next's: the wall clock's steady state (the
        # engine's timer holds its batches' GPU time only, not the host's waits for other work)
        self.intervals: list[tuple[float, int]] = []
        self._last_out: Optional[float] = None
        self.cpu: dict[str, float] = {}            # CPU-seconds meanwhile: this process, decoding, drawing, encoding
        self._keep_pixels = any(s.keeps_frames for s in self.sinks)
        self._cpu0 = _cpu_seconds()  # before the sinks open: their processes' CPU is counted from here
        opened = []
        try:
            for sink in self.sinks:
                sink.open(self)
                opened.append(sink)
        except BaseException:  # an output that cannot be opened: those opened before leave nothing behind
            for sink in opened:
                try:
                    sink.close(self)  # no frame: nothing kept
                except Exception:  # noqa: BLE001 - the first failure is the one said
                    pass
            raise
        self._wall0 = time.perf_counter()  # model loading and warm-up are reported on their own
        self.bar = (progress_bar(total=source.expected_frames, unit="frame", file=sys.stderr, dynamic_ncols=True,
                         desc=video.label) if video.progress else None)

    def detect(self, chunk: list[Frame]) -> tuple[list[bool], object]:
        """Queue the detector on the chunk's detection frames (needs nothing of the previous chunk's results)."""
        t0 = time.perf_counter()
        planned = self.tracking.detect(chunk)
        self.seconds["detect"] += time.perf_counter() - t0
        return planned

    def launch(self, chunk: list[Frame], flags: list[bool], handle) -> PendingStep:
        """Track, crop and queue EmoNet for one chunk; the results come back without waiting for them."""
        t0 = time.perf_counter()
        with self.timer.measure(len(chunk)):
            pending = self.tracking.launch(chunk, flags, handle)
        self.seconds["emonet"] += time.perf_counter() - t0
        return pending

    def settle(self, pending: PendingStep) -> SettledChunk:
        """Wait for a chunk's outputs and update its tracks: what the next chunk's launch needs of it."""
        t0 = time.perf_counter()
        settled = self.tracking.settle(pending)
        self.seconds["emonet"] += time.perf_counter() - t0
        return settled

    def deliver(self, settled: SettledChunk) -> list[FrameFaces]:
        """A settled chunk's results, given to every sink; the frames with their faces."""
        t0 = time.perf_counter()
        per_frame = self.tracking.results(settled)
        t1 = time.perf_counter()
        self.seconds["emonet"] += t1 - t0
        frames = settled.chunk.frames
        for sink in self.sinks:
            sink.add(frames, per_frame)
        self.seconds["results"] += time.perf_counter() - t1
        self.frames += len(frames)
        self.faces += sum(len(faces) for faces in per_frame)
        now = time.perf_counter()
        if self._last_out is not None:
            self.intervals.append((now - self._last_out, len(frames)))
        self._last_out = now
        if not self._keep_pixels:
            for frame in frames:
                frame.pixels = frame.ready = None  # done with: free the GPU copy now
        if self.bar is not None:
            self.bar.update(len(frames))
            self.bar.set_postfix(faces=self.faces, refresh=False)
        return [FrameFaces(f.index, f.timestamp, faces) for f, faces in zip(frames, per_frame)]

    def finish(self, pending: PendingStep) -> list[FrameFaces]:
        """Wait for a chunk's results and give them to every sink (:meth:`settle`, then :meth:`deliver`)."""
        return self.deliver(self.settle(pending))

    def idle(self) -> None:
        """The next chunk is queued: the sinks' work that runs behind it."""
        for sink in self.sinks:
            sink.idle()

    def close(self, interrupted: bool = False) -> "VideoRun":
        """End the video: close the source and every sink (each finished frame kept; an output that fails
        becomes :attr:`error`); returns itself, now saying how it went."""
        if self.closed:
            return self
        self.closed = True
        self.interrupted = interrupted
        if self.bar is not None:
            self.bar.close()
        try:
            self.source.close()
        finally:
            self.shortfall = None if interrupted else self.source.shortfall
            for sink in self.sinks:
                try:
                    sink.close(self)
                except (InputError, OutputError) as exc:  # this video's error; the others' outputs are kept
                    self.error = self.error or exc
        if self.engine.device.type == "cuda":
            synchronize(self.engine.device)
        for sink in self.sinks:
            self.seconds.update({k: self.seconds.get(k, 0.0) + v for k, v in sink.seconds.items()})
        self.seconds["decode"] = self.source.decode_seconds
        own, children = (b - a for a, b in zip(self._cpu0, _cpu_seconds()))  # the decoder's has ended
        drawn = self.drawn
        drawing, encoding = (drawn.cpu.get("drawing", 0.0), drawn.cpu["encoding"]) if drawn is not None else (0.0, 0.0)
        if drawn is not None and not drawn.apart:  # the encoders were this process's children
            children -= encoding
        self.cpu = {"this process": own, "decoding": children, "drawing": drawing, "encoding": encoding}
        self.wall = time.perf_counter() - self._wall0
        return self


# Fewer intervals than this between chunks' results are no steady state (a short video's first and last chunks).
STEADY_INTERVALS = 3


def steady_rate(intervals: list[tuple[float, int]]) -> Optional[float]:
    """Frames a second at the wall clock's steady state: the median time a frame took between two chunks' results
    (``(seconds, frames)`` each, :attr:`VideoRun.intervals`), inverted. The last interval is left out: the final
    chunk, read with nothing queued behind it, comes sooner than a chunk in the flow. None with fewer than
    STEADY_INTERVALS left."""
    per_frame = [seconds / frames for seconds, frames in intervals[:-1] if frames]
    if len(per_frame) < STEADY_INTERVALS:
        return None
    middle = statistics.median(per_frame)
    return 1.0 / middle if middle > 0 else None


def _chunks(frames: Source, size: int) -> Iterator[list[Frame]]:
    """Chunks of ``size`` frames; a source that fails part-way gives the frames read before it, then its error.
    A live source (a camera, a network stream) is not waited for: a chunk is what has come, up to ``size``."""
    chunk: list[Frame] = []
    live = frames.live
    try:
        for frame in frames:
            chunk.append(frame)
            if len(chunk) == size or (live and not frames.ready()):
                yield chunk
                chunk = []
    except (InputError, HelperError):  # decoding failed, or its process died: the frames read are kept
        if chunk:
            yield chunk
        raise
    if chunk:
        yield chunk


def _last_chunk(run: VideoRun, last: PendingStep) -> Iterator[Union[FrameFaces, VideoRun]]:
    """A video's final chunk read, then the video closed."""
    yield from run.finish(last)
    yield run.close()


def run_videos(videos: Iterable[VideoInput], config: VideoConfig,
               loader: Optional[Callable[[tuple], Pipeline]] = None,
               stop: Optional[StopToken] = None, startup: Optional[StartupClock] = None
               ) -> Iterator[Union[FrameFaces, VideoRun]]:
    """Run every video through the pipeline, one after the other; yield each frame with its faces as its
    chunk's results are read (after the sinks have them), and each video's :class:`VideoRun` once it is
    closed. ``loader(frame_shape)`` gives the pipeline, built on first use (default: a
    :class:`PipelineLoader` of ``config``); ``stop`` (installed by
    the caller for Ctrl-C and SIGTERM) ends the run cleanly: every finished frame is kept in every output,
    and the video being read ends as interrupted, the last one; ``startup``, where given, is marked as the
    model loads and the first results come.

    A failure reading a video part-way (:class:`~emonet.errors.InputError`) ends that video with it as its
    :attr:`VideoRun.error` (the frames before it kept) and the run goes on; one that cannot be opened (its
    source function raises) ends the run with that error.
    """
    inner = _run_videos(videos, config, loader, stop, startup)
    try:  # the start-up clock ends with the first frames handed out, whichever path they come by
        for item in inner:
            if startup is not None and isinstance(item, FrameFaces):
                startup.mark("first frames")
                startup = None
            yield item
    finally:
        inner.close()


def _run_videos(videos: Iterable[VideoInput], config: VideoConfig, loader: Optional[Callable[[tuple], Pipeline]],
                stop: Optional[StopToken], startup: Optional[StartupClock]) -> Iterator[Union[FrameFaces, VideoRun]]:
    """:func:`run_videos`, all but the start-up clock's mark of the first frames."""
    loader = loader or PipelineLoader(config)
    stop = stop or StopToken()
    threads = torch.get_num_threads()
    current: Optional[VideoRun] = None
    previous: Optional[tuple[VideoRun, PendingStep]] = None  # the last video's final chunk, not yet read

    try:
        for item in videos:
            if isinstance(loader, PipelineLoader):
                loader.start()  # (once) the model loads while the video opens
            source = item.source() if callable(item.source) else item.source
            try:
                for sink in item.sinks:
                    sink.prepare(source)
                if startup is not None:
                    startup.mark("opening the video")
                height, width, _ = source.frame_shape
                pipeline = loader((height or 720, width or 1280, 3))  # cameras may not say
                if startup is not None:
                    startup.mark("model, engine and warm-up")
                if source.device is not None:
                    torch.set_num_threads(min(GPU_RUN_THREADS, threads))
                current = VideoRun(item, source, pipeline, config)
            except BaseException:
                source.close()
                raise
            pending: Optional[PendingStep] = None
            stop.flowing = True
            try:
                for chunk in _chunks(source, config.batch_size):
                    flags, queued = current.detect(chunk)
                    # The previous chunk settled (its tracks have their landmarks), this one queued behind it, and
                    # only then the previous chunk's results made and handed out: that host work runs while the GPU
                    # reads this chunk instead of before it is queued.
                    settled = current.settle(pending) if pending is not None else None
                    pending = None  # held by `settled` now: handed out once, whatever happens next
                    if stop.asked:  # the chunk only queued for detection is dropped: it is in no output
                        if settled is not None:
                            yield from current.deliver(settled)
                        break
                    try:
                        launched = current.launch(chunk, flags, queued)
                    except BaseException:
                        if settled is not None:  # finished before: kept, though this chunk is lost
                            yield from current.deliver(settled)
                        raise
                    if settled is not None:
                        yield from current.deliver(settled)
                        if stop.asked:  # asked while it was handed out: the chunk just queued is dropped
                            break
                    current.idle()  # behind the chunk just queued
                    if previous is not None:  # the last video's final chunk, read while this one's first runs
                        (done, last), previous = previous, None
                        yield from _last_chunk(done, last)
                    pending = launched
            except (InputError, HelperError) as exc:  # decoding failed, or its process died, part-way: the
                current.error = exc                     # frames before it are kept
            if previous is not None:  # this video gave no chunk
                (done, last), previous = previous, None
                yield from _last_chunk(done, last)
            if stop.asked or pending is None:
                if pending is not None:
                    yield from current.finish(pending)
                run, current = current.close(interrupted=stop.asked), None
                yield run
                if stop.asked:
                    return
            else:
                previous, current = (current, pending), None
        if previous is not None:
            (done, last), previous = previous, None
            yield from _last_chunk(done, last)
    except KeyboardInterrupt:
        # Stopped at once (a second Ctrl-C, or one before frames flowed): what is finished is kept; the chunks
        # still on the GPU are in no output. The run being read ends as interrupted, the last one.
        last = None
        for running in (previous[0] if previous else None, current):
            if running is not None and not running.closed:
                last = running.close(interrupted=True)
        if last is None:
            raise
        yield last
    finally:
        if isinstance(loader, PipelineLoader):
            loader.settle()
        torch.set_num_threads(threads)
        for running in (previous[0] if previous else None, current):  # the caller stopped iterating
            if running is not None and not running.closed:
                running.close(interrupted=True)


def run_video(video: VideoInput, config: VideoConfig, loader: Optional[Callable[[tuple], Pipeline]] = None,
              stop: Optional[StopToken] = None, startup: Optional[StartupClock] = None) -> VideoRun:
    """One video through :func:`run_videos`, its frames given only to its sinks; its :class:`VideoRun`
    (interrupted when stopped, even at once)."""
    last: Optional[VideoRun] = None
    for item in run_videos([video], config, loader, stop, startup):
        if isinstance(item, VideoRun):
            last = item
    return last
