"""Many videos in one run (``--video DIR|GLOB|FILE ... --out-dir OUT``): per video its rows, summary and
plot, then ``OUT/summary.csv``; resumable; shared over the GPUs of a machine (``--devices``) or of several
(``torchrun``).

The model loads and warms up once per process. Each process takes its share of the videos, balanced by
frame count (longest first, each to the least-loaded process). With ``--devices`` this process starts one
worker per device (forked: CUDA is never touched here) and gathers their results; under ``torchrun`` each
rank works on GPU ``LOCAL_RANK`` and rank 0 gathers. Either way ``summary.csv`` is written once every
process has finished, and the outputs are those of one process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from ..cli import plural
from ..distributed import Distributed, join
from ..errors import InputError
from ..io.images import check_writable_dir
from ..results import FrameFaces
from ..runtime import select_device
from ..summary import PlotProcess, write_summary_csv
from ..timing import StartupClock
from ..video import (AnnotatedSink, Drawers, PipelineLoader, RowSink, StopToken, SummarySink, VideoConfig,
                     VideoInput, open_sources, run_videos)
from ..video.sources import no_frames
from .collection_plan import collect_videos, output_paths, parse_devices, probe, shares

NOT_PROCESSED = "not processed (interrupted)"  # summary.csv's error for a video a stopped run never finished


def _report_together(flows: list[tuple[int, Optional[float], Optional[float]]]) -> None:
    """Every process's frames from the first frame to the last, as one throughput (rank 0, under torchrun)."""
    ran = [(frames, first, last) for frames, first, last in flows if first is not None]
    if not ran:
        return
    frames = sum(f for f, _, _ in ran)
    seconds = max(last for _, _, last in ran) - min(first for _, first, _ in ran)
    print(f"all {len(flows)} processes: {frames} frames, {frames / max(seconds, 1e-9):.1f} frames/s from the first "
          f"frame to the last ({seconds:.2f} s)", file=sys.stderr)


def run_collection(args: argparse.Namespace, config: VideoConfig) -> int:
    """Process every video given into ``--out-dir``; 0 when all are done, 1 when some failed, 2 on bad input,
    130 when interrupted (Ctrl-C or SIGTERM: the videos finished so far are complete)."""
    # One clock from the process's start to the first results, its stages marked as they end; a forked worker
    # carries it on (its own start is its fork, which would leave the job's first seconds out).
    startup = StartupClock()
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a folder")
    videos = collect_videos(args.video, exclude=out_dir)  # before the folder is made: bad input leaves nothing
    devices = parse_devices(getattr(args, "devices", None))
    check_writable_dir(out_dir)
    if len(devices) > 1:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise InputError("--devices starts its own workers: run it without torchrun (torchrun is for several "
                             "machines)")
        return _run_workers(args, config, out_dir, videos, devices, startup)
    if devices:
        args.device = devices[0]
        config = replace(config, model=replace(config.model, device=devices[0]))
    dist = join(args.device)
    if dist.world > 1:
        startup.mark("joining the job")
    try:
        if dist.device(args.device) != args.device:
            args.device = dist.device(args.device)
            config = replace(config, model=replace(config.model, device=args.device))
        return _run(args, config, out_dir, videos, dist, startup)
    finally:
        dist.close()


def _run(args: argparse.Namespace, config: VideoConfig, out_dir: Path, videos: list[Path], dist: Distributed,
         startup: StartupClock) -> int:
    plan = _plan(args, out_dir, videos, dist.world)
    startup.mark("reading the videos' headers")
    if dist.rank == 0:
        _say_plan(plan, dist.world)
    result = _process(args, config, out_dir, plan, dist.rank, dist.world, dist.barrier, startup)
    results = dist.gather(result)
    return _finish(args, out_dir, videos, results) if dist.rank == 0 else _exit_code(results)


@dataclass
class _Plan:
    """Which videos are done already, and each process's share of the rest with their headers."""

    done: list[Path]
    todo: list[Path]
    headers: list[tuple[int, Optional[tuple[int, int, int]]]]
    shares: list[list[int]]


@dataclass
class _Result:
    """What one process did: its failures, its videos read in part, its frames and when they flowed."""

    errors: dict
    flow: tuple                # (frames, first, last): wall-clock times of the first and last frame
    short: bool = False
    interrupted: bool = False


def _plan(args: argparse.Namespace, out_dir: Path, videos: list[Path], world: int) -> _Plan:
    done = [v for v in videos if not args.force and _complete(output_paths(out_dir, v, args.output_videos))]
    todo = [v for v in videos if v not in done]
    headers = [probe(v) for v in todo]
    return _Plan(done, todo, headers, shares([frames for frames, _ in headers], world))


def _say_plan(plan: _Plan, world: int) -> None:
    print(f"{plural(len(plan.done) + len(plan.todo), 'video')}: {len(plan.done)} skipped (outputs complete; --force "
          f"redoes them), {len(plan.todo)} to process" + (f" on {world} processes" if world > 1 else ""),
          file=sys.stderr)


def _process(args: argparse.Namespace, config: VideoConfig, out_dir: Path, plan: _Plan, rank: int, world: int,
             barrier, startup: StartupClock) -> _Result:
    """This process's share of the videos (``plan.shares[rank]``), written into ``out_dir``; ``startup``: the
    clock from the job's start to this process's first results."""
    err = sys.stderr
    interactive = err.isatty()
    share = plan.shares[rank]
    mine = [plan.todo[i] for i in share]
    counts = [plan.headers[i][0] for i in share]
    loader = PipelineLoader(config)
    errors: dict[str, str] = {}
    read: set[str] = set()  # the videos whose frames were all analysed (a failed plot may still fail one)
    errors_shortfall: dict[str, str] = {}  # videos read only in part: kept, but the run's exit code is 1

    def failed(video: str, message: str) -> None:  # one line, above a running progress bar; the others go on
        errors[video] = message
        tqdm.write(f"error: {message}", file=err)

    # One decoding process takes the videos one after the other, the next one's first frames decoded and
    # uploaded while this one's last are analysed (it starts now, while the model loads); each video's
    # plot is drawn by a process of its own.
    if args.decoder == "nvdec" and rank == 0:
        print("note: a collection's videos are decoded on the CPU, one after the other (--decoder nvdec: single "
              "videos)", file=err)
    device = select_device(args.device, quiet=True)
    sources = open_sources([str(v) for v in mine], config, device)
    plots = PlotProcess()
    drawers = Drawers(device) if args.output_videos else None
    if drawers is not None and mine:  # all this process's videos, together (a count not known: as long)
        drawers.start(sum(counts) if all(counts) else None)
    if world > 1:
        # Every process loads and warms up, then all start together: none waits on the others at the end
        # for a start-up it could have overlapped, and their frames/s add up.
        if mine:
            loader(plan.headers[share[0]][1] or (720, 1280, 3))
            startup.mark("model, engine and warm-up")
        barrier()
        startup.mark("waiting for the other processes")

    def inputs():
        for n, (video, source) in enumerate(zip(mine, sources), 1):
            if isinstance(source, InputError):
                failed(str(video), str(source))
                continue
            paths = output_paths(out_dir, video, args.output_videos)
            sinks = [RowSink(str(paths["csv"]), landmarks=config.landmarks)]
            if drawers is not None:
                sinks.append(AnnotatedSink(str(paths["video"]), drawers, config.codec))
            sinks.append(SummarySink(str(video), paths["summary"], paths["plot"], plots))
            # A progress bar redraws its line: in a log file (several processes' too) it is one line a video instead.
            yield VideoInput(source, sinks, f"[{n}/{len(mine)}] {video.name}", progress=interactive, name=str(video))

    frames = 0
    wall0 = time.perf_counter()
    first = last = None  # when the first video's first frame came, and when the last video ended
    interrupted = False
    stop = StopToken().install()
    if mine:
        plots.start()  # its imports overlap the model's load and the videos, not the end
    runs = run_videos(inputs(), config, loader, stop, startup)
    try:
        for run in runs:
            if isinstance(run, FrameFaces):  # in its sinks already
                continue
            if run.interrupted:
                interrupted = True
                print("interrupted: the video being processed is left incomplete (a rerun redoes it)", file=err)
                break
            if run.error is not None or run.frames == 0:
                failed(run.name, str(run.error or no_frames(run.name)))
                continue
            if run.shortfall:  # kept, said, and recorded in its summary and row
                errors_shortfall[run.name] = run.shortfall
                tqdm.write(f"warning: {run.name}: {run.shortfall}", file=err)
            if not interactive:
                print(f"{run.name}: {plural(run.frames, 'frame')}, {plural(run.faces, 'face')}, "
                      f"{run.frames / max(run.wall, 1e-9):.1f} frames/s", file=err)
            read.add(run.name)
            last = time.time()  # the wall clock: the processes' times are put side by side
            first = first if first is not None else last - run.wall
            frames += run.frames
    finally:
        stop.restore()
        runs.close()
        sources.close()
        if drawers is not None:
            drawers.close()
        failed_plots = plots.wait()  # whatever happened: the plotting process is never left running
    for path, why in failed_plots.items():  # a failed plot: that video's outputs are incomplete
        video = next((str(v) for v in mine if str(output_paths(out_dir, v, args.output_videos)["plot"]) == path),
                     path or "a video")
        errors[video] = f"{video}: the plot could not be written ({why})"
        print(f"error: {errors[video]}", file=err)
    wall = time.perf_counter() - wall0
    if mine and loader.pipeline is not None:
        where = f"rank {rank} ({loader.pipeline.engine.device}): " if world > 1 else ""
        flowing = (last - first) if first is not None else 0.0
        print(f"{where}{_tally(len(mine), len(read - set(errors)), len(errors))}; {plural(frames, 'frame')}: "
              f"{frames / max(flowing, 1e-9):.1f} frames/s from the first frame to the last ({flowing:.2f} s), "
              f"{frames / max(wall, 1e-9):.1f} frames/s with the model's load and warm-up ({wall:.1f} s)", file=err)
        print(startup.format("first results"), file=err)
    return _Result(errors, (frames, first, last), bool(errors_shortfall), interrupted)


def _worker(rank: int, device: str, args: argparse.Namespace, config: VideoConfig, out_dir: Path, plan: _Plan,
            barrier, results, startup: StartupClock) -> None:
    """A forked worker (see :func:`_run_workers`): its share on its device, its :class:`_Result` sent back; then
    it leaves at once (its device's teardown would only hold the job's end)."""
    import signal

    # Its own process group: Ctrl-C at the terminal reaches the parent only, which asks each worker once (a
    # second signal would stop a worker at once, its video left incomplete). Until it takes them over, the
    # signals do what they do in any Python process (not the parent's forwarding, inherited with the fork).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    os.setpgid(0, 0)
    workers = len(plan.shares)
    args.device = device
    config = replace(config, model=replace(config.model, device=device))
    if device.startswith("cuda"):
        import torch
        torch.cuda.set_device(device)  # work placed on "cuda" (graph capture too) goes to this worker's GPU
        # A forked worker keeps its parent's CPU threads (one per core, or what OMP_NUM_THREADS says): every
        # worker's CPU work (the model's build, its host side) then runs that many threads on the same cores, and
        # their spinning made each worker's start-up several times longer. They are shared out instead, never
        # raised (a GPU worker's numbers do not depend on its CPU threads; CPU workers keep theirs, whose numbers
        # might). Safe only because the parent runs no parallel CPU work before it forks (see _run_workers).
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))
    startup.mark("starting the worker")  # the fork, and its device's start-up where it has one

    def wait_for_all() -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:  # a worker failed before it: the others go on
            pass

    code = 0
    try:
        try:
            result = _process(args, config, out_dir, plan, rank, workers, wait_for_all, startup)
        except KeyboardInterrupt:
            result = _Result({}, (0, None, None), interrupted=True)
        results.put((rank, result))
        results.close()
        results.join_thread()  # written through to the parent before this process leaves
    except BaseException:  # noqa: BLE001 - said on standard error; the parent reports the worker's videos
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)


def _run_workers(args: argparse.Namespace, config: VideoConfig, out_dir: Path, videos: list[Path],
                 devices: list[str], startup: StartupClock) -> int:
    """One worker per device, forked from this process once the videos are planned, the videos shared by frame
    count; their results gathered here. Forked, a worker starts with torch and the package imported already
    (a spawned one, like torchrun's, imports them again: seconds); this process never initialises CUDA
    (:func:`torch.cuda.device_count` asks NVML), so each worker initialises its own, and runs no parallel CPU
    tensor work before forking (a forked child's OpenMP would hang on its first parallel region)."""
    import multiprocessing
    import signal
    from queue import Empty

    plan = _plan(args, out_dir, videos, len(devices))
    _say_plan(plan, len(devices))
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(len(devices)), ctx.Queue()
    startup.mark("reading the videos' headers")
    workers = [ctx.Process(target=_worker, args=(rank, device, args, config, out_dir, plan, barrier, queue, startup),
                           name=f"emonet-{device}") for rank, device in enumerate(devices)]
    asked = []

    def forward(signum, frame) -> None:  # each worker asked as the user asked this process
        asked.append(signum)
        for w in workers:
            if w.is_alive():
                os.kill(w.pid, signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    got: dict[int, _Result] = {}
    try:
        for w in workers:
            w.start()
        while len(got) < len(workers):
            try:
                rank, result = queue.get(timeout=0.5)
                got[rank] = result
            except Empty:  # see whether a worker died without a word
                dead = [r for r, w in enumerate(workers) if r not in got and not w.is_alive()]
                if dead and not queue.empty():
                    continue  # a result sent just before its worker left: read it first
                for rank in dead:
                    if not barrier.broken:
                        barrier.abort()
                    share = [plan.todo[i] for i in plan.shares[rank]]
                    why = f"the worker on {devices[rank]} stopped (exit code {workers[rank].exitcode})"
                    print(f"error: {why}", file=sys.stderr)
                    got[rank] = _Result({str(v): f"{v}: {why}" for v in share}, (0, None, None),
                                        interrupted=bool(asked))
        for w in workers:
            w.join()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return _finish(args, out_dir, videos, [got[r] for r in range(len(workers))])


def _exit_code(results: list[_Result]) -> int:
    if any(r.interrupted for r in results):
        return 130
    return 1 if any(r.errors or r.short for r in results) else 0


def _finish(args: argparse.Namespace, out_dir: Path, videos: list[Path], results: list[_Result]) -> int:
    """Every process's results together: the throughput of all, ``summary.csv``, the exit code."""
    err = sys.stderr
    all_errors: dict[str, str] = {}
    for r in results:
        all_errors.update(r.errors)
    if len(results) > 1:
        _report_together([r.flow for r in results])
    records = []
    for video in videos:
        if str(video) in all_errors:
            records.append({"video": str(video), "error": all_errors[str(video)]})
            continue
        summary = output_paths(out_dir, video, args.output_videos)["summary"]
        try:
            records.append(json.loads(summary.read_text()))
        except (OSError, ValueError):
            records.append({"video": str(video), "error": NOT_PROCESSED})
    names = next((r["class_names"] for r in records if r.get("class_names")), None)
    if names is None:
        from ..classes import class_names
        names = class_names(args.nclasses or 8)
    write_summary_csv(out_dir / "summary.csv", records, names)
    unfinished = sum(1 for r in records if r.get("error") == NOT_PROCESSED)
    failed = sum(1 for r in records if r.get("error")) - unfinished
    print(f"summary: {out_dir / 'summary.csv'} ({_tally(len(videos), len(videos) - failed - unfinished, failed)})",
          file=err)
    return _exit_code(results)


def _tally(videos: int, read: int, failed: int) -> str:
    """``3 videos: 2 read, 1 failed`` (and how many were not finished, when the run was stopped): every video
    counted, each in one of the parts; ``3 videos`` when all were read."""
    rest = videos - read - failed
    if read == videos:
        return plural(videos, "video")
    return (f"{plural(videos, 'video')}: {read} read" + (f", {failed} failed" if failed else "")
            + (f", {rest} not finished (interrupted)" if rest else ""))


def _complete(paths: dict[str, Path]) -> bool:
    """Every output of the video is there (they are renamed into place whole, so there means complete)."""
    return all(p.is_file() for p in paths.values())
