"""The video tool (``emonet-video``, ``demo_video.py``): its arguments, turned into a
:class:`~emonet.video.VideoConfig`, sources and sinks, drained through :func:`emonet.video.run_video` (one
video) or :mod:`.collection` (many); and what it reports.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from typing import TYPE_CHECKING

from ..cli import ToolParser
from ..log import say
from ..errors import EXIT_CODES
from ..io.containers import is_stream_url
from ..io.images import STDOUT, check_distinct_outputs, check_output_file
from ..io.writer import CODECS, check_video_name
from .common import add_model_arguments, exit_tool, model_options, run_tool

# (the video runtime and the model, which import torch, are imported where the tool runs: --help is quick)
if TYPE_CHECKING:
    from ..video import VideoConfig, VideoRun

UNTRAINED_VIDEO = ("untrained weights: predictions are meaningless, and their landmarks are noise, so the boxes "
                   "between detections, which follow the landmarks, jump: judge tracking with real weights")


def video_config(args: argparse.Namespace) -> "VideoConfig":
    """The run the command line asks for."""
    from ..video import VideoConfig

    return VideoConfig(model=model_options(args), batch_size=args.batch_size, detect_every=args.detect_every,
                       smooth=args.smooth, max_faces=args.max_faces,
                       start=args.start, end=args.end, max_frames=args.max_frames, decoder=args.decoder,
                       codec=args.codec, landmarks=args.landmarks)


def run(args: argparse.Namespace) -> int:
    """Process the video; 0 when done, 1 when read only in part, 130 when interrupted (the rest: exit codes of
    :mod:`emonet.errors`)."""
    from ..errors import InputError
    from ..io.video import source_problem
    from ..runtime import select_device
    from ..timing import StartupClock
    from ..video import Drawers, StopToken, VideoInput, open_source, run_video, sinks_for
    from ..video.sources import no_frames

    config = video_config(args)
    if args.out_dir is not None:
        from .collection import run_collection
        return run_collection(args, config)
    startup = StartupClock()
    source = args.video[0]
    problem = source_problem(source)
    if problem:  # before the weights' download or the device start: bad input is said first, and alone
        raise InputError(problem)
    check_distinct_outputs([("--output", args.output), ("--csv", args.csv), ("--jsonl", args.jsonl)])
    for path in (args.output, args.csv, args.jsonl):
        if path and path != STDOUT:
            check_output_file(path, [source])
    if args.output:
        check_video_name(args.output, args.codec)
    device = select_device(args.device, quiet=True)
    drawers = Drawers(device) if args.output else None

    def opened():
        opened_source = open_source(source, config, device, annotated=bool(args.output))
        if device.type == "cpu" and args.batch_size > 8:  # (said once the video opens: bad input is one line)
            # Not a smaller default on CPUs: a chunk's tracked frames take the last chunk's landmarks, so the same
            # command would give other rows on another machine.
            say(f"note: on a CPU rows come {args.batch_size} frames at a time (--batch-size), each chunk some "
                f"seconds; --batch-size 8 gives the first rows sooner (and rows that differ slightly: see --help)")
        return opened_source

    stop = StopToken().install()
    try:
        sinks = sinks_for(args.csv, args.jsonl, args.output, drawers, args.landmarks, args.codec)
        video = VideoInput(opened, sinks)
        result = run_video(video, config, stop=stop, startup=startup)
    finally:
        stop.restore()
        if drawers is not None:
            drawers.close()
    # The rows' file the provenance sidecar goes beside (rows on standard output have none).
    rows = next((path for path in (args.csv, args.jsonl) if path and path != STDOUT), None)
    # What made the rows, and whether they are the whole video (rows kept before a failure say they are not).
    meta = rows_sidecar(rows, source, result) if rows and result.frames else None
    if result.error is not None:
        raise result.error
    if result.frames == 0:
        if result.interrupted:
            print("interrupted before the first frame", file=sys.stderr)
            return 130
        raise no_frames(source)
    report(result, config)
    if meta is not None:
        print(f"provenance: {meta}", file=sys.stderr)
    print(startup.format("first results"), file=sys.stderr)
    if result.shortfall:
        print(f"warning: {source}: {result.shortfall}; the outputs hold the frames that were read", file=sys.stderr)
    return 130 if result.interrupted else 1 if result.shortfall else 0


def rows_sidecar(rows: str, source: str, run: "VideoRun") -> Path:
    """Write the provenance of a video's rows beside them: what made them, and whether they are the whole video."""
    from ..provenance import provenance, write_sidecar

    ending = run.source.ending
    extra = {"video": source, "frames": run.frames, "declared_frames": (ending.declared or None) if ending else None,
             "complete": run.error is None and not run.interrupted and run.shortfall is None,
             "warning": run.shortfall, "interrupted": run.interrupted,
             "dropped_frames": ending.dropped if ending else 0}
    if run.error is not None:
        extra["error"] = str(run.error)
    return write_sidecar(rows, provenance(run.engine), extra)


def report(run: "VideoRun", config: "VideoConfig") -> None:
    """How a video's run went: frames, speed, time by stage, CPU, outputs (standard error)."""
    from ..video.config import STAGES
    from ..video.runner import steady_rate

    err = sys.stderr
    wall, frames = run.wall, run.frames
    print(f"\n{'interrupted: ' if run.interrupted else ''}{frames} frames, {run.faces} faces, "
          f"{frames / max(wall, 1e-9):.1f} frames/s end to end ({wall:.2f} s)", file=err)
    drawn = run.drawn
    shown = {k: v for k, v in run.seconds.items() if drawn is not None or k in STAGES[:4]}
    per = ", ".join(f"{k} {1e3 * v / max(frames, 1):.2f}" for k, v in shown.items())
    others = ""
    if drawn is not None:
        planned = f"; the plan of {drawn.planned_apart:,} frames in a planning process" if drawn.planned_apart else ""
        others = (f"{'; plan, draw, to encoders and encoder wait in the drawing process' if drawn.apart else ''}"
                  f"{planned}; encode in the encoding process")
    where = ("is NVDEC's, on the GPU" if run.source.nvdec
             else "runs in a process of its own, its conversion to RGB in a thread of this one")
    print(f"time per frame by stage (ms; decode {where}{others}; the rest in this one, "
          f"EmoNet with tracking and crops): {per}", file=err)
    cores = sum(run.cpu.values()) / max(wall, 1e-9)
    print("CPU-seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in run.cpu.items() if v > 0)
          + f" ({cores:.1f} of {os.cpu_count()} cores busy on average)", file=err)
    if drawn is not None and drawn.resized:
        print("note: the video changed frame size; frames were resized to the first frame's size", file=err)
    outputs = [(run.video_path, "annotated video")]
    for sink in run.sinks:
        outputs += [(getattr(sink, "csv_path", None), "CSV"), (getattr(sink, "jsonl_path", None), "JSONL")]
    for path, what in outputs:
        if path and path != STDOUT:
            print(f"{what}: {path}", file=err)
    print(run.timer.summary().format(f"track, crop and queue EmoNet per batch (up to {config.batch_size} frames)",
                                     "frame"), file=err)
    rate = steady_rate(run.intervals)
    if rate is not None:
        print(f"  wall clock      {rate:9.1f} frames/s (steady state: the median time between two batches' results, "
              f"all stages and waits included)", file=err)
    ending = run.source.ending
    if ending is not None and ending.dropped:
        print(f"note: {ending.dropped} frames of the live source were dropped (read as they came while the "
              f"analysis was behind; {frames} analysed)", file=err)
    if run.engine.background_note:
        print(f"engine: {run.engine.background_note}", file=err)
    if run.engine.untrained:
        print(f"note: {UNTRAINED_VIDEO}", file=err)


EXAMPLES = """examples:
  %(prog)s --video clip.mp4 --output annotated.mp4 --csv frames.csv
  %(prog)s --video recordings/ --out-dir results/          # every video: rows, summary, plot; summary.csv
  %(prog)s --video recordings/ --out-dir results/ --devices all  # every GPU here, a worker each
  torchrun --nnodes 2 --nproc-per-node 8 ... -m emonet.apps.video --video recordings/ --out-dir results/  # machines
  %(prog)s --video clip.mp4 --csv frames.csv --landmarks --start 10 --end 20
  %(prog)s --video clip.mp4 --jsonl frames.jsonl --weights random     # try it without the released weights
  %(prog)s --video 0                                                  # a camera: rows on the terminal
  %(prog)s --video 0 --csv camera.csv --output camera.mp4             # a camera, kept
  %(prog)s --video rtsp://camera.local/stream --csv live.csv          # a network stream, until it ends or Ctrl-C
"""


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The video tool's command line."""
    parser = ToolParser(
        prog=prog, epilog=EXAMPLES + "\n" + EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Stream a video (or camera) through face detection, tracking and EmoNet; write per-frame "
                    "results and an annotated video. Ctrl-C or SIGTERM stops cleanly, keeping every finished "
                    "frame.")
    parser.add_argument("--video", required=True, nargs="+", action="extend", metavar="VIDEO",
                        help="a video file, numbered images (\"frames/%%04d.png\"), a camera index (0) or a stream "
                             "URL (rtsp://, udp://, http(s)://, ...); with --out-dir: files, folders, patterns, "
                             "one or more (--video may be repeated)")
    out = parser.add_argument_group("outputs (none given: the rows on standard output)")
    out.add_argument("--output", metavar="FILE", help="annotated video at the source's frame rate (.mp4; also "
                                                      ".m4v, .mov, .mkv, .avi)")
    out.add_argument("--codec", choices=CODECS, default="h264",
                     help="h264 (default: plays everywhere) or mp4v (through OpenCV, without PyAV)")
    out.add_argument("--csv", metavar="FILE", help="one row per face per frame (a frame with no face: empty "
                                                   "values); - for standard output (where the rows go when no "
                                                   "output is given)")
    out.add_argument("--jsonl", metavar="FILE", help="the same rows as JSON lines; - for standard output (one of "
                                                     "--csv and --jsonl)")
    out.add_argument("--landmarks", action="store_true",
                     help="add the 68 landmarks to the rows: CSV columns lm0_x, lm0_y, ..., lm67_y; in JSON lines "
                          "\"landmarks\": [[x, y], ...], as emonet-photo's JSON")
    many = parser.add_argument_group("many videos in one run (the model loads once; torchrun shares them over GPUs)")
    many.add_argument("--out-dir", metavar="DIR",
                      help="for each video STEM: DIR/STEM.csv (rows), DIR/STEM.summary.json, DIR/STEM.png (plot); "
                           "and DIR/summary.csv, one row per video and face")
    many.add_argument("--output-videos", action="store_true", help="with --out-dir: also DIR/STEM.mp4, annotated")
    many.add_argument("--devices", metavar="LIST",
                      help="with --out-dir: every GPU here (all) or a list (cuda:0,cuda:1), a worker each, the "
                           "videos shared by length")
    many.add_argument("--force", action="store_true",
                      help="with --out-dir: redo videos whose outputs are complete (default: skip them)")
    out.add_argument("--no-video", action="store_true",
                     help="analysis only (the default without --output; kept for older scripts)")
    run_group = parser.add_argument_group("what to process")
    run_group.add_argument("--max-frames", type=int, default=None, help="stop after N frames")
    run_group.add_argument("--start", type=float, default=0.0, help="start at this time in seconds (default: 0)")
    run_group.add_argument("--end", type=float, default=None,
                           help="stop before this time in seconds: --start 10 --end 20 reads 10 s (default: the end)")
    run_group.add_argument("--batch-size", type=int, default=32,
                           help="frames whose faces go through EmoNet together (default: 32); smaller gives the "
                                "first rows sooner, and tracked frames' crops from fresher landmarks (rows differ)")
    run_group.add_argument("--detect-every", type=int, default=5,
                           help="run the face detector every N frames and whenever a face is lost, following "
                                "faces by their landmarks between (default: 5)")
    # What --small-faces asked for is the default now: accepted, so that scripts written for it still run.
    run_group.add_argument("--small-faces", action="store_true", help=argparse.SUPPRESS)
    run_group.add_argument("--decoder", choices=("auto", "cpu", "nvdec"), default="auto",
                           help="auto (default: NVDEC, with PyNvVideoCodec, while an annotated video is written; "
                                "else FFmpeg on the CPU), cpu, or nvdec (always, where it can)")
    run_group.add_argument("--max-faces", type=int, default=None, help="at most this many faces per frame")
    run_group.add_argument("--smooth", action=argparse.BooleanOptionalAction, default=True,
                           help="temporal smoothing per face, a weighted mean of the last 5 outputs (default: on)")
    add_model_arguments(parser, video=True)
    args = parser.parse_args(argv)
    for name in ("batch_size", "detect_every", "max_frames"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    if args.start < 0:
        parser.error(f"--start must be 0 or more seconds, not {args.start:g}")
    if args.end is not None and args.end <= args.start:
        parser.error(f"--end ({args.end:g} s) must come after --start ({args.start:g} s)")
    if args.decoder == "nvdec" and not _nvdec_available():
        parser.error("--decoder nvdec needs NVIDIA's PyNvVideoCodec (pip install PyNvVideoCodec) and an NVIDIA GPU")
    if args.no_video and args.output:
        parser.error("--no-video and --output ask for opposite things: drop one")
    if args.small_faces:
        say("note: --small-faces is the default now (faces from about 40 px wide in 1080p, every candidate looked "
            "at close up): it can be dropped")
    if args.out_dir is not None:
        if args.output or args.csv or args.jsonl:
            parser.error("with --out-dir every output is named after its video: drop --output, --csv and --jsonl "
                         "(--output-videos adds the annotated videos)")
        return args
    if args.output_videos or args.force or args.devices:
        parser.error("--output-videos, --force and --devices go with --out-dir")
    pattern = any(c in args.video[0] for c in "*?[") and not is_stream_url(args.video[0])
    if len(args.video) > 1 or pattern or Path(args.video[0]).is_dir():
        parser.error(f"{' '.join(args.video)}: several videos (or a folder or pattern) need --out-dir DIR")
    if not (args.output or args.csv or args.jsonl):
        args.csv = "-"  # nothing to keep asked for: the rows go to the terminal (a camera's first look)
    return args


def _nvdec_available() -> bool:
    from ..io import nvdec

    return nvdec.available()


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """``emonet-video`` / ``demo_video.py``."""
    args = parse_args(argv, prog)
    return run_tool(lambda: run(args))


def cli() -> None:
    """``emonet-video``: :func:`main`, then the process ends at once (:func:`~emonet.apps.common.exit_tool`)."""
    exit_tool(main())


if __name__ == "__main__":
    cli()
