"""``emonet-serve``: the model loaded once and kept warm, behind HTTP, a WebSocket stream and a browser page."""
from __future__ import annotations

import argparse
import signal
import socket
import sys
import warnings
from typing import TYPE_CHECKING, Optional

from ..cli import ToolParser, plural
from ..errors import InputError
from ..serve import STREAM_MAX_AGE
from .common import add_model_arguments, model_options, run_tool

if TYPE_CHECKING:
    import torch

    from ..build import ModelOptions

EXAMPLES = """examples:
  %(prog)s --weights random                      # http://127.0.0.1:8000/ : the webcam page
  %(prog)s --host 0.0.0.0 --port 8080 --max-streams 64 --max-batch 16   # more streams, each more often dropped
  %(prog)s --no-compile                          # no compiling at start; emonet-video's numbers for a face
  curl -F image=@photo.jpg http://127.0.0.1:8000/v1/analyze
  curl http://127.0.0.1:8000/health ; curl http://127.0.0.1:8000/metrics

endpoints:
  GET  /             the browser page: webcam -> /v1/stream -> boxes, labels, circumplex, latency; CSV
  GET  /health       200 with what it runs, once the model is loaded
  POST /v1/analyze   multipart field "image" (JPEG or PNG) -> {"faces": [...]} as emonet-photo's JSON
  WS   /v1/stream    binary JPEG/PNG frames in; per frame {"frame", "timestamp", "faces", "latency_ms", ...}
                     out, in order; {"frame", "dropped": true} for a frame newer ones pushed out
  GET  /metrics      Prometheus text: requests, streams, batch sizes, latencies

exit codes: 2 bad input or options (a port in use, a checkpoint the loop cannot load); 130 stopped by Ctrl-C or
  SIGTERM, after a clean shutdown (as every emonet tool interrupted; a systemd unit: SuccessExitStatus=130)
"""


MAX_LOOPS = 16  # GPU loops a service runs at most


def parse_args(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The service's command line."""
    parser = ToolParser(
        prog=prog, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve EmoNet over HTTP and WebSocket: the model loads once per analysis loop and stays warm; "
                    "every request and stream is a session of the video runtime's scheduler in one loop, which steps "
                    "its sessions together on the service's device. Needs pip install \"emonet[serve]\".")
    net = parser.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 for every one)")
    net.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    limits = parser.add_argument_group("limits and batching")
    limits.add_argument("--max-streams", type=int, default=None, metavar="N",
                        help="WebSocket streams open at once; the next is refused with a message (default: 16 a GPU "
                             "loop, so 32 with two: a few percent of their frames dropped, where 64 had half dropped; "
                             "2 on a CPU, where even one stream is read at a few frames/s)")
    limits.add_argument("--max-image-mb", type=float, default=20.0, metavar="MB",
                        help="largest encoded image or frame taken (default: 20)")
    limits.add_argument("--loops", type=int, default=None, metavar="N",
                        help="analysis loops (processes) sharing the streams and requests, each session in one: on a "
                             "GPU, at a few dozen streams one loop's host work and waits, not the GPU's arithmetic, "
                             "set the pace; each holds its own copy of the model (default: 2 on a GPU of 16 GB or "
                             "more, else 1; docs/PERFORMANCE.md has the figures, a CPU's too)")
    limits.add_argument("--max-batch", type=int, default=64, metavar="N",
                        help="frames per step, every stream's of a loop together (default: 64; at 64 "
                             "streams, 16 halved the latency's tail: docs/PERFORMANCE.md)")
    limits.add_argument("--detect-every", type=int, default=5, metavar="N",
                        help="streams: run the detector every N frames and follow faces between, as emonet-video "
                             "(default: 5)")
    limits.add_argument("--max-age-ms", type=float, default=STREAM_MAX_AGE * 1000, metavar="MS",
                        help="streams, on a GPU: a frame already this old when its turn comes is answered dropped, "
                             "so an overloaded server answers fresh frames rather than late ones; 0: never for its "
                             "age (default: %(default)g; on a CPU, where a step takes longer, never)")
    limits.add_argument("--smooth", action=argparse.BooleanOptionalAction, default=True,
                        help="temporal smoothing per face in streams (default: on)")
    add_model_arguments(parser, video=True, compile_help=(
        "with --engine auto on a GPU (not --deterministic): its one batch shape compiled by torch.compile (one "
        "answer per crop in any batch; on the H200 measured, its graph of 8 crops in about half the time), so "
        "many streams wait less; the first start compiles for tens of seconds, later ones load the result from "
        "$EMONET_HOME (default ~/.cache/emonet) where this torch can save it. Its kernels round differently: "
        "--no-compile gives emonet-video's numbers for a crop (default: on)"))
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, not {args.port}")
    for name in ("max_streams", "max_batch", "detect_every", "loops"):
        if getattr(args, name) is None:
            continue
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.loops is not None and args.loops > MAX_LOOPS:
        parser.error(f"--loops takes at most {MAX_LOOPS} (each loop is a process with its own copy of the model), "
                     f"not {args.loops}")
    if args.max_image_mb <= 0:
        parser.error("--max-image-mb must be positive")
    if args.max_age_ms < 0:
        parser.error(f"--max-age-ms must be 0 or more, not {args.max_age_ms:g}")
    return args


def run(args: argparse.Namespace) -> int:
    """Load the model, then serve until Ctrl-C or SIGTERM: 130 once it has stopped (as the other tools, interrupted)."""
    try:
        import uvicorn

        from ..serve.app import ServeConfig, create_app, default_max_streams, live_config
        from ..serve.pool import LoopPool
    except ImportError as exc:
        raise InputError(f"emonet-serve needs its extra: pip install \"emonet[serve]\" ({exc.name} is missing)") from None
    with socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET) as probe:
        try:  # before the model loads: a port in use is one line, at once
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))
        except OSError as exc:
            raise InputError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}); choose another --port "
                             f"or --host") from None
    options = model_options(args)
    device = _device(options)
    loops = args.loops if args.loops is not None else default_loops(device)
    gpu = device is not None and device.type == "cuda"
    max_streams = args.max_streams if args.max_streams is not None else default_max_streams(gpu, loops)
    config = ServeConfig(max_streams=max_streams, max_image_bytes=int(args.max_image_mb * (1 << 20)),
                         max_batch=args.max_batch, detect_every=args.detect_every, smooth=args.smooth,
                         max_age=args.max_age_ms / 1000 if args.max_age_ms > 0 else None)
    # Stopped while the loops load (SIGTERM as Ctrl-C): they are ended and it says so, none left behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # The model loads (and warms) in the loops' own processes; a checkpoint they cannot load is one line here.
    loop = LoopPool(options, live_config(config), gpu_decode=config.gpu_decode, loops=loops)
    app = create_app(loop, config)
    from ..runtime import freeze_loaded

    freeze_loaded()  # what is loaded now lives as long as the service: the collector's full passes skip it
    print(f"emonet-serve: http://{args.host}:{args.port}/ (the page), /v1/analyze, /v1/stream, /health, /metrics; "
          f"{loop.about.get('device')}, {plural(loops, 'analysis loop')}, at most {plural(max_streams, 'stream')}; "
          f"Ctrl-C stops it", file=sys.stderr, flush=True)
    # uvicorn (0.55's Server.capture_signals) stops gracefully on Ctrl-C or SIGTERM, then raises each signal it caught
    # again for the handler it found: these note it, so the process neither dies of the signal nor looks as if it
    # ended by itself. The service says it stopped and exits 130, as every tool does when interrupted.
    # One that comes before uvicorn has taken the signals (the app's lifespan not begun: the loops just loaded) stops
    # the service there, as while the loops loaded; noted only, it would be lost and the service go on.
    stopped_by: list[int] = []

    def stop(signum: int, _frame) -> None:
        stopped_by.append(signum)
        if not hasattr(app.state, "stopped_at_once"):
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    # A WebSocket message may be an image of the largest size taken, and a client may have two frames in
    # flight: beyond, its reading waits (what a client makes the server hold stays bounded).
    # (uvicorn's newer "websockets-sansio" has no queue bound yet: the legacy one, and its notice silenced.)
    warnings.filterwarnings("ignore", message="The `websockets` implementation is deprecated")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, ws="websockets",
                    # Frames are JPEG or PNG already: compressing them again costs a client ~2 ms a 40 KB frame for
                    # nothing (a client sending many streams falls seconds behind), so the extension is declined.
                    ws_per_message_deflate=False,
                    ws_max_size=config.max_image_bytes + (64 << 10), ws_max_queue=2)
    except KeyboardInterrupt:  # stopped before uvicorn.run began (within it, it returns)
        pass
    if not hasattr(app.state, "stopped_at_once"):  # stopped before serving: the lifespan never closed the loops
        loop.close()
    at_once = getattr(app.state, "stopped_at_once", False)
    print("emonet-serve: stopped at once (a second Ctrl-C)" if at_once else "emonet-serve: stopped", file=sys.stderr)
    return 130 if stopped_by else 0


def _device(options: ModelOptions) -> Optional[torch.device]:
    """The device the loops will run on, for the defaults; None where it cannot be had (the loops say why, in
    their one line)."""
    from ..runtime import DeviceError, select_device
    try:
        return select_device(options.device, quiet=True)
    except DeviceError:
        return None


def default_loops(device: Optional[torch.device]) -> int:
    """``--loops`` left out: 2 on a GPU of 16 GB or more (each loop holds a few GB: its model and CUDA graphs),
    else 1: on a CPU each stream is read at a few frames/s whatever the loops (two loops on two cores answered a
    quarter more frames of two streams than one, both dropping nine in ten), and each loop holds a copy of the model."""
    import torch

    if device is None or device.type != "cuda":
        return 1
    return 2 if torch.cuda.get_device_properties(device).total_memory >= 16 << 30 else 1


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """``emonet-serve``."""
    args = parse_args(argv, prog)
    return run_tool(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
