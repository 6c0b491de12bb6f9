"""``python -m emonet.bench`` (``emonet-bench``): the command line. Its flags pick one benchmark; without one it
runs the engine modes side by side (:mod:`.engines`).

The benchmarks live beside it, one module each: the engine modes (:mod:`.engines`), their kernels
(:mod:`.kernels`), cutting crops (:mod:`.warp`), a video end to end (:mod:`.video`), a photo from process start
(:mod:`.photo`), jobs of every length (:mod:`.sweep`) and a running ``emonet-serve`` under load (:mod:`.load`);
what they share is in :mod:`.common`. Their public names are importable from here too.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Callable, Optional

from ..cli import ToolParser
from .common import environment, show_report, save, startup_floor
from .engines import CPU_DEFAULT, GPU_DEFAULT, MODES, Mode, mode_report, process_start, run_child, run_modes
from .kernels import profile
from .load import WARMUP_SECONDS, ClipError, LoadError, serve_load_table
from .photo import RELEASED_PHOTO, photo_benchmark
from .sweep import job_sweep, repeat_clip, sweep_table
from .video import decode_loop, decode_only, make_clip, released_way, video_benchmark
from .warp import warp_benchmark

__all__ = ["CPU_DEFAULT", "EXAMPLES", "GPU_DEFAULT", "MODES", "Mode", "RELEASED_PHOTO", "decode_loop", "decode_only",
           "environment", "job_sweep", "main", "make_clip", "photo_benchmark", "process_start", "profile",
           "released_way", "repeat_clip", "run_child", "serve_load_table", "startup_floor", "sweep_table",
           "video_benchmark", "warp_benchmark"]

EXAMPLES = """examples:
  emonet-bench                                   # the released way and every engine mode, this GPU
  emonet-bench --device cpu --quick              # a first look on a CPU (2 cores: 40 s idle, minutes busy)
  emonet-bench --modes released,fp16-graph,compile-streams-graph --batch-sizes 8,128,512
  emonet-bench --photo --photo-repeat 3          # one photo, from process start, every way
  emonet-bench --video clip.mp4 --video-repeat 3 # a video end to end, analysis and annotated
  emonet-bench --sweep                           # what users wait for: clips of 10 s to 30 min, photo sets
  emonet-bench --serve-load http://127.0.0.1:8000 # concurrent streams against a running emonet-serve
  emonet-bench --profile fp16-graph:16           # the kernels of one mode at one batch size
  (python -m emonet.bench does the same)
"""


def _batch_sizes(text: str) -> list[int]:
    """``"8,32"`` -> ``[8, 32]``; anything else is a usage error (one line, exit 2)."""
    try:
        sizes = [int(b) for b in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers separated by commas, got {text!r}")
    return sizes


def _engines(text: str) -> list[str]:
    """``"auto,compiled"`` -> ``["auto", "compiled"]``; an unknown engine is a usage error."""
    from ..engine import PRESETS
    names = [e for e in text.split(",") if e]
    unknown = [e for e in names if e not in ("auto", *PRESETS)]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected engines among auto, {', '.join(PRESETS)}, got {text!r}")
    return names



# --warp, --serve-load, --sweep, --photo, --video and --profile each make one Markdown report: shown, and saved
# to --markdown.

def _warp(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--warp: crops cut by OpenCV against grid_sample on the device."""
    show_report(warp_benchmark(args.device), args.markdown)
    return 0


def _a_frame_or_more(seconds: float) -> bool:
    """Whether ``seconds`` is finite and at least a frame's time at --serve-load's 30 frames/s."""
    return math.isfinite(seconds) and seconds * 30 >= 1


def _serve_load(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--serve-load: a running emonet-serve under each count of concurrent streams."""
    try:
        counts = [int(v) for v in args.serve_streams.split(",") if v]
    except ValueError:
        parser.error(f"--serve-streams takes whole counts, as 1,8,32 (got {args.serve_streams!r})")
    if not counts or min(counts) < 1:
        parser.error("--serve-streams counts are at least 1")
    if not _a_frame_or_more(args.serve_seconds):
        parser.error(f"--serve-seconds is at least a frame's time at 30 frames/s (1/30 s), not "
                     f"{args.serve_seconds:g}")
    if not (args.serve_warmup == 0 or _a_frame_or_more(args.serve_warmup)):
        parser.error(f"--serve-warmup is 0 (none) or at least a frame's time at 30 frames/s (1/30 s), not "
                     f"{args.serve_warmup:g}")
    if not args.serve_load.startswith(("http://", "https://")):
        parser.error(f"--serve-load takes the service's URL, as http://127.0.0.1:8000 (got {args.serve_load!r})")
    if args.serve_clip is not None and not Path(args.serve_clip).is_file():
        what = "a folder, not a video file" if Path(args.serve_clip).is_dir() else "no such video file"
        parser.error(f"--serve-clip {args.serve_clip}: {what}")
    try:
        text, whole = serve_load_table(args.serve_load.rstrip("/"), counts, args.serve_seconds, clip=args.serve_clip,
                                       warmup=args.serve_warmup)
    except ClipError as exc:  # the local file's fault, not the server's
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except LoadError as exc:
        print(f"error: {args.serve_load}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {args.serve_load}: no emonet-serve answers there ({exc}); give the server's own address, "
              f"as http://127.0.0.1:8000", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    show_report(text, args.markdown)
    if not whole:
        print("error: not every stream ran as asked (the server refused some: see the table); the figures are of "
              "those that did", file=sys.stderr)
        return 1
    return 0


def _sweep(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--sweep: clips of every length and photo sets, each in a fresh process."""
    try:
        lengths = [int(v) for v in args.sweep.split(",") if v]
        sets = [int(v) for v in args.sweep_photos.split(",") if v]
    except ValueError:
        parser.error(f"--sweep takes whole seconds and --sweep-photos whole counts, as 10,60 (got {args.sweep!r}, "
                     f"{args.sweep_photos!r})")
    if not lengths or min(lengths) < 1 or any(v % min(lengths) for v in lengths) or any(v < 1 for v in sets):
        parser.error("--sweep lengths are whole seconds, each a multiple of the shortest (the clips repeat it); "
                     "photo sets at least 1")
    show_report(job_sweep(args.device, lengths, sets, repeat=args.sweep_repeat), args.markdown)
    return 0


def _photo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--photo: one photo from process start to exit, every way."""
    if args.photo:
        from ..errors import InputError
        from ..io.images import read_image
        try:  # here, so a bad photo is one line, not a table of failed processes
            read_image(args.photo)
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    show_report(photo_benchmark(args.photo or None, args.device, max(1, args.photo_repeat)), args.markdown)
    return 0


def _video(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--video: a clip end to end, against decoding alone and the released way."""
    from ..errors import InputError
    try:
        text = video_benchmark(args.video or None, args.device, args.video_engines, max(1, args.video_repeat))
    except InputError as exc:  # a missing or unreadable clip: one line, like the tools
        print(f"error: {exc}", file=sys.stderr)
        return 2
    show_report(text, args.markdown)
    return 0


def _profile(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--profile MODE:BATCH: the kernels of one mode at one batch size."""
    mode_name, _, batch = args.profile.partition(":")
    if mode_name not in {m.name for m in MODES}:
        parser.error(f"unknown mode {mode_name!r}")
    if not (batch or "1").isdigit() or int(batch or 1) < 1:
        parser.error(f"--profile expects MODE:BATCH with a positive whole batch size, got {args.profile!r}")
    show_report(profile(mode_name, int(batch or 1), args.device, args.weights), args.markdown)
    return 0


def _child(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--child MODE (internal): measure one mode in this process, for the comparison that spawned it."""
    result = run_child(args)
    Path(args.child_out).write_text(json.dumps(result))
    return 0


# The runs the flags choose, in the order they are looked at: where several are given, the first one here runs.
_Given = Callable[[argparse.Namespace], bool]
_Run = Callable[[argparse.Namespace, argparse.ArgumentParser], int]
_RUNS: list[tuple[_Given, _Run]] = [
    (lambda args: args.warp, _warp),
    (lambda args: args.serve_load is not None, _serve_load),
    (lambda args: args.sweep is not None, _sweep),
    (lambda args: args.photo is not None, _photo),  # a bare --photo (the sample photo) is ""
    (lambda args: args.video is not None, _video),  # and a bare --video (a made-up clip)
    (lambda args: bool(args.profile), _profile),
    (lambda args: bool(args.child), _child),
]


def _compare_modes(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Optional[list[str]]) -> int:
    """No flag choosing a run: every mode of --modes (or this device's default) side by side."""
    if args.weights not in ("random", "pretrained"):
        from ..models.weights import CheckpointError, read_state_dict
        try:  # once here, so a bad path is one line, not a failure in every child process
            read_state_dict(args.weights)
        except CheckpointError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    names = args.modes.split(",") if args.modes else (CPU_DEFAULT if args.device == "cpu" else GPU_DEFAULT)
    unknown = [n for n in names if n not in {m.name for m in MODES}]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; available: {', '.join(m.name for m in MODES)}")

    rows = run_modes(names, args)
    command = "python -m emonet.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    text, report = mode_report(rows, args, command)
    print(text)
    save(args.json, json.dumps(report, indent=2))
    save(args.markdown, text + "\n")
    failed = [r["mode"] for r in rows if "error" in r["cold"]]
    if failed:
        print(f"error: {len(failed)} mode(s) failed: {', '.join(failed)} (see the table)", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``python -m emonet.bench``."""
    parser = ToolParser(
        prog="emonet-bench", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Benchmark EmoNet: the released way (eager fp32, batch 1) against each engine mode. "
                    "Each mode runs in fresh processes, with cold then warm on-disk caches; each mode's "
                    "difference from true fp32 is measured on a well-conditioned checkpoint.")
    parser.add_argument("--device", default=None, help="cuda:0 (default when a GPU exists) or cpu")
    parser.add_argument("--weights", default="random",
                        help="checkpoint path, 'pretrained' or 'random' (default: random; timings do not "
                             "depend on the weights)")
    parser.add_argument("--nclasses", type=int, default=None, choices=[5, 8])
    parser.add_argument("--modes", default=None,
                        help=f"comma-separated; available: {', '.join(m.name for m in MODES)}")
    parser.add_argument("--batch-sizes", default=None, type=_batch_sizes,
                        help="throughput batch sizes, comma-separated (default 8,32,128,256)")
    parser.add_argument("--iters", type=int, default=None, help="timed batch-1 calls per mode (default 200)")
    parser.add_argument("--quick", action="store_true",
                        help="few iterations, batch 8 only, agreement on 8 crops: a first look (with --device cpu on "
                             "a 2-core machine: about 40 s with the cores idle, 80 s to 5 min while other work shares "
                             "them; docs/PERFORMANCE.md)")
    parser.add_argument("--no-warm-rerun", action="store_true",
                        help="skip the second, warm-cache process of compiled modes")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the mode benchmark's report as JSON to FILE")
    parser.add_argument("--markdown", default=None, metavar="FILE",
                        help="also write the Markdown report to FILE (--video, --warp and --profile too)")
    parser.add_argument("--profile", default=None, metavar="MODE:BATCH",
                        help="instead of benchmarking, profile one mode at one batch size (GPU), e.g. "
                             "compile-graph:1")
    parser.add_argument("--video", nargs="?", const="", default=None, metavar="CLIP",
                        help="instead: end-to-end video frames/s on CLIP (default: a synthetic 30-s 720p clip with "
                             "one face) for decoding alone, the released way and demo_video.py")
    parser.add_argument("--video-engines", default=["auto"], type=_engines, metavar="E[,E...]",
                        help="with --video: the demo_video.py engines to time, comma-separated (auto, fast, "
                             "compiled, max; default auto). A compiled engine's first run compiles (minutes)")
    parser.add_argument("--video-repeat", default=1, type=int, metavar="N",
                        help="with --video: run each analysis-only demo_video.py N times, report the median "
                             "(runs vary; default 1)")
    parser.add_argument("--photo", nargs="?", const="", default=None, metavar="PHOTO",
                        help="instead: one photo (default: the sample astronaut) and 149 tight face crops from "
                             "process start to exit, the released demo's way against demo.py, fresh processes")
    parser.add_argument("--photo-repeat", default=2, type=int, metavar="N",
                        help="with --photo: rounds, each running every way once (default 2)")
    parser.add_argument("--sweep", nargs="?", const="10,60,300,1800", default=None, metavar="SECONDS",
                        help="what users wait for: clips of these lengths (default 10,60,300,1800 s), analysed and "
                             "annotated, and photo sets of 1, 150 and 1,500, each in a fresh process beside the "
                             "floor process: wall time, first result, and the ratio to floor + model load + frames "
                             "at steady speed")
    parser.add_argument("--sweep-photos", default="1,150,1500", metavar="N[,N...]",
                        help="photo set sizes of --sweep (default 1,150,1500)")
    parser.add_argument("--sweep-repeat", default=3, type=int, metavar="N",
                        help="with --sweep: run the clips of up to a minute and the photo sets but the largest N "
                             "times, alternating, and report each one's median run (a process's start-up varies by "
                             "a second; default 3)")
    parser.add_argument("--serve-load", default=None, metavar="URL",
                        help="drive a running emonet-serve at URL (http://127.0.0.1:8000) with concurrent WebSocket "
                             "streams of 640x480 JPEG frames: lost and reordered frames, server latency p50/p99, "
                             "frames per step")
    parser.add_argument("--serve-clip", default=None, metavar="VIDEO",
                        help="--serve-load sends this video's frames as a 640x480 camera would (JPEG, the centre "
                             "cut to 4:3, then scaled; default: a made-up clip)")
    parser.add_argument("--serve-streams", default="1,8,16,32", metavar="N[,N...]",
                        help="stream counts of --serve-load (default 1,8,16,32)")
    parser.add_argument("--serve-seconds", default=10.0, type=float, metavar="S",
                        help="how long each count of --serve-load runs, 30 frames/s a stream (default 10)")
    parser.add_argument("--serve-warmup", default=WARMUP_SECONDS, type=float, metavar="S",
                        help="--serve-load first sends a stream to each of the server's loops for S seconds, not in "
                             "the table (a loop prepares for a frame size on its first frames): their first frame's "
                             f"round trip is said against their last second's (default {WARMUP_SECONDS:g}; 0: none)")
    parser.add_argument("--warp", action="store_true",
                        help="instead: time cutting face crops with OpenCV against grid_sample on the device")
    parser.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from ..log import install
    install()  # the library's messages: one line each on standard error

    import torch
    if args.device is None:
        args.device = "cuda:0" if torch.cuda.is_available() else "cpu"
    from ..runtime import DeviceError, select_device
    try:  # here, so a device this machine lacks is one line, not a failure in every mode's process
        select_device(args.device, quiet=True)
    except DeviceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cpu = args.device == "cpu"
    args.batch_sizes = args.batch_sizes or _batch_sizes("8" if args.quick or cpu else "8,32,128,256")
    args.iters = args.iters or (3 if args.quick else (10 if cpu else 200))

    for given, chosen in _RUNS:
        if given(args):
            return chosen(args, parser)
    return _compare_modes(args, parser, argv)


if __name__ == "__main__":
    sys.exit(main())
