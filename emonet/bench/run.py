"""``python -m emonet.bench``: the released way of running EmoNet against each engine mode, side by side.

Every mode runs in fresh processes: once with empty on-disk caches (what a first-time user pays) and
once again with the caches the first run left (what every later start pays). Each process reports
start-up, warm-up, first-call latency, steady-state batch-1 latency (CUDA events), throughput at
several batch sizes, peak GPU memory, and how far its outputs are from true fp32 on real face crops, on a
well-conditioned checkpoint (emonet.engine.conditioned_model).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ..cli import ToolParser

EXAMPLES = """examples:
  emonet-bench                                   # the released way and every engine mode, this GPU
  emonet-bench --device cpu --quick              # a first look on a CPU (42 s on 2 idle cores)
  emonet-bench --modes released,fp16-graph,compile-streams-graph --batch-sizes 8,128,512
  emonet-bench --photo --photo-repeat 3          # one photo, from process start, every way
  emonet-bench --video clip.mp4 --video-repeat 3 # a video end to end, analysis and annotated
  emonet-bench --sweep                           # what users wait for: clips of 10 s to 30 min, photo sets
  emonet-bench --serve-load http://127.0.0.1:8000 # concurrent streams against a running emonet-serve
  emonet-bench --profile fp16-graph:16           # the kernels of one mode at one batch size
  (python -m emonet.bench does the same)
"""


def process_start() -> float:
    """The process's start on ``time.perf_counter``'s clock: warm starts count from it."""
    from ..timing import process_age

    return time.perf_counter() - (process_age() or 0.0)


@dataclass(frozen=True)
class Mode:
    """One way of running the network."""

    name: str
    description: str
    engine: dict = field(default_factory=dict)   # EngineConfig fields
    cudnn_benchmark: bool = True
    deterministic: bool = False
    compiled: bool = False


MODES = [
    Mode("released", "released way: eager fp32, cudnn.benchmark off", {}, cudnn_benchmark=False),
    Mode("released+bench", "eager fp32, cudnn.benchmark on", {}),
    Mode("released+determ", "eager fp32, deterministic mode", {}, deterministic=True),
    Mode("tf32", "eager tf32, cudnn.benchmark on", {"precision": "tf32"}),
    Mode("fp16-eager", "eager fp16, channels_last, folded", {"precision": "fp16", "channels_last": True,
                                                               "fold_bn": True}),
    Mode("fp32-eager", "eager fp32, channels_last, folded", {"channels_last": True, "fold_bn": True}),
    Mode("bf16-eager", "eager bf16, channels_last, folded", {"precision": "bf16", "channels_last": True,
                                                               "fold_bn": True}),
    Mode("fp16-graph", "fp16, channels_last, folded, CUDA graphs",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "cuda_graphs": True}),
    # The tools' GPU default (emonet.build.engine_config("auto", ...); tests/test_bench.py holds the two together).
    Mode("auto", "the tools' GPU default: fp16-graph, every crop in a batch of 16, cudnn.benchmark off, "
                 "graphs captured in the background",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "cuda_graphs": True, "fixed_batch": 16,
          "background": True}, cudnn_benchmark=False),
    Mode("fp16-graph-nobench", "fp16-graph with cudnn.benchmark off",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "cuda_graphs": True},
         cudnn_benchmark=False),
    Mode("fp16-graph-determ", "fp16-graph in deterministic mode",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "cuda_graphs": True}, deterministic=True),
    Mode("compile-graph", "torch.compile (default) fp16, channels_last, CUDA graphs",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "default",
          "cuda_graphs": True}, compiled=True),
    Mode("compile-static-graph", "compile-graph with one specialised graph per batch size",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "default",
          "dynamic_batch": False, "cuda_graphs": True}, compiled=True),
    Mode("compile-streams-graph", "compile-graph, hourglass skip branches on side CUDA streams up to batch 8",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "default", "streams": 8,
          "cuda_graphs": True}, compiled=True),
    Mode("compile-tuned-streams-graph", "compile-streams-graph, the whole-model graph's Triton kernels tuned on the "
                                        "device (engine preset 'tuned')",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "default", "streams": 8,
          "cuda_graphs": True, "tune_kernels": True}, compiled=True),
    Mode("compile-streams-graph-retrace", "compile-streams-graph without saved tracing: Dynamo traces at every start",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "default", "streams": 8,
          "cuda_graphs": True, "precompile": False}, compiled=True),
    Mode("compile-freeze-graph", "compile-graph with inductor freezing (no on-disk graph cache)",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "default", "freeze": True,
          "cuda_graphs": True}, compiled=True),
    Mode("aot-graph", "AOTInductor package fp16, channels_last, CUDA graphs (no tracing at start; "
                      "needs EMONET_ALLOW_AOT_CUDA=1 on CUDA)",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "aot", "cuda_graphs": True},
         compiled=True),
    Mode("max-autotune-graph", "torch.compile max-autotune fp16, channels_last, CUDA graphs",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "compile": "max-autotune",
          "cuda_graphs": True}, compiled=True),
]
GPU_DEFAULT = ["released", "released+bench", "released+determ", "tf32", "fp16-eager", "bf16-eager",
               "auto", "fp16-graph", "fp16-graph-nobench", "fp16-graph-determ", "compile-graph"]
CPU_DEFAULT = ["released", "fp32-eager", "bf16-eager"]


# -- one mode, in this process ----------------------------------------------------------------

def run_child(args: argparse.Namespace) -> dict:
    """Measure one mode in this (fresh) process and return the numbers."""
    import torch
    from ..engine.graphs import synchronize
    from ..models.weights import load_model
    from ..engine import Engine, EngineConfig, compare, conditioned_model, real_face_crops, varied_face_crops
    from ..runtime import RuntimeConfig, configure
    from ..timing import LatencyTimer, time_calls

    t0 = process_start()
    mode = next(m for m in MODES if m.name == args.child)
    result: dict = {"mode": mode.name, "description": mode.description}
    device = configure(RuntimeConfig(device=args.device, cudnn_benchmark=mode.cudnn_benchmark,
                                     deterministic=mode.deterministic))
    cuda = device.type == "cuda"
    sync = (lambda: synchronize(device)) if cuda else (lambda: None)
    result["import_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    model = load_model(args.weights, n_expression=args.nclasses, device="cpu")
    batch_sizes = sorted(set([1] + args.batch_sizes))
    config = EngineConfig(**mode.engine, batch_sizes=tuple(batch_sizes), warmup=args.warmup and
                          bool(mode.engine), cache_dir=args.cache_dir)
    engine = Engine(model, device, config, log=lambda msg: None)
    sync()
    result["load_s"] = time.perf_counter() - t
    result["warmup_s"] = (engine.warmup_ms or 0.0) / 1e3
    result["engine"] = engine.config.name
    result["precompiled"] = engine.precompiled  # on a warm start: all loaded, none compiled
    if mode.compiled and mode.engine.get("compile") != "aot":
        from torch._dynamo.utils import compile_times
        result["compile_times"] = compile_times(repr="str")  # where a warm start's seconds go

    crop = real_face_crops(1).to(device)
    sync()
    timer = LatencyTimer(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with timer.measure(1):
        engine(crop)
    sync()
    result["time_to_first_result_s"] = time.perf_counter() - t0
    engine.wait_for_graphs()  # the steady state is the graphs' (the first calls may run before them)
    for _ in range(args.iters):
        with timer.measure(1):
            engine(crop)
    s = timer.summary()
    result.update(first_call_ms=s.first_ms, b1_median_ms=s.median_ms, b1_p90_ms=s.p90_ms,
                  b1_mean_ms=s.mean_ms)
    if cuda:
        sync()
        result["peak_mem_b1_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        # What the caching allocator holds from the GPU: every captured graph's private pool included
        # (a graph keeps its intermediates' memory for its replays), which the peak above does not count.
        result["held_mem_b1_mb"] = torch.cuda.memory_reserved(device) / 2**20

    throughput = {}
    for bs in [b for b in batch_sizes if b > 1]:
        x = real_face_crops(bs).to(device)
        calls = 2 if args.quick else max(3, args.iters // 10) + 1
        # As many untimed calls first: the first calls at a new batch size run slower than the rounds
        # after them (docs/PERFORMANCE.md).
        throughput[str(bs)] = time_calls(lambda: engine(x), device, calls, n_items=bs,
                                         warmup=0 if args.quick else calls).throughput
    result["throughput"] = throughput

    if mode.engine:
        # Agreement where it shows: the same mode built on a checkpoint whose outputs spread over real faces
        # (random weights barely move between faces), against true fp32 on the crops it was not fitted to.
        faces = varied_face_crops(16 if args.quick else 64)
        conditioned = conditioned_model(faces[::2], device=device)
        check = Engine(conditioned, device, config, log=lambda msg: None)
        agreement = compare(check, conditioned, faces[1::2].to(device))
        result["check"] = agreement.format()
        result["check_ok"] = agreement.ok
        result["check_diff"] = max(agreement.max_valence_diff, agreement.max_arousal_diff)
    return result


def profile(mode_name: str, batch: int, device: str, weights: str = "random", steps: int = 20) -> str:
    """Kernel count per forward and the top CUDA kernels of one mode at one batch size (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    from ..models.weights import load_model
    from ..engine import Engine, EngineConfig, real_face_crops
    from ..engine.graphs import synchronize
    from ..runtime import RuntimeConfig, configure

    mode = next(m for m in MODES if m.name == mode_name)
    dev = configure(RuntimeConfig(device=device, cudnn_benchmark=mode.cudnn_benchmark,
                                  deterministic=mode.deterministic))
    engine = Engine(load_model(weights, device="cpu"), dev,
                    EngineConfig(**mode.engine, batch_sizes=(batch,)), log=lambda m: None)
    x = real_face_crops(batch).to(dev)
    for _ in range(3):
        engine(x)
    synchronize(dev)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine(x)
        synchronize(dev)
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    launches = sum(e.count for e in kernels) / steps
    total = sum(e.device_time_total for e in kernels) / steps
    rows = sorted(kernels, key=lambda e: e.device_time_total, reverse=True)[:12]
    lines = [f"{mode_name} at batch {batch}: {launches:.0f} kernels per forward, {total / 1e3:.3f} ms of "
             f"GPU time per forward", "", "| kernel | calls/forward | ms/forward | share |", "|---|---|---|---|"]
    for e in rows:
        name = e.key.replace("|", "/")[:90]
        lines.append(f"| `{name}` | {e.count / steps:.0f} | {e.device_time_total / steps / 1e3:.3f} | "
                     f"{e.device_time_total / max(total * steps, 1e-9):.0%} |")
    return "\n".join(lines)


# -- crops: OpenCV on the CPU against grid_sample on the device ---------------------------------

def warp_benchmark(device: str, repeats: int = 50) -> str:
    """Median ms to cut 1, 4 and 16 face crops from a 720p frame (uint8 in host memory, crops on the device)."""
    import statistics
    import cv2
    import torch
    from ..engine.graphs import synchronize
    from ..engine.check import SAMPLE_PHOTO
    from ..geometry import box_to_matrix, to_tensor, warp_crops, warp_crops_torch

    dev = torch.device(device)
    sync = (lambda: synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    frame = cv2.resize(cv2.imread(str(SAMPLE_PHOTO)),
                       (1280, 720))
    lines = [f"Crops from a 1280x720 frame on {device} (median of {repeats}; both include the copy to the device)",
             "", "| faces | OpenCV warpAffine (ms) | grid_sample on device (ms) | max |diff| (levels) |",
             "|---|---|---|---|"]
    for n in (1, 4, 16):
        mats = [box_to_matrix([300 + 40 * i, 200, 420 + 40 * i, 340]) for i in range(n)]
        def opencv():
            return to_tensor(warp_crops(frame, mats)).to(dev)
        def device_warp():
            return warp_crops_torch(torch.from_numpy(frame).to(dev).permute(2, 0, 1), mats)
        times = {}
        for name, fn in (("cv", opencv), ("torch", device_warp)):
            fn(), sync()
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = fn()
                sync()
                samples.append((time.perf_counter() - t0) * 1e3)
            times[name] = (statistics.median(samples), out)
        diff = int((times["cv"][1].int() - times["torch"][1].int()).abs().max())
        lines.append(f"| {n} | {times['cv'][0]:.3f} | {times['torch'][0]:.3f} | {diff} |")
    return "\n".join(lines)


# -- video: end to end, against the released demo's way of working ---------------------------

def make_clip(path: Path, width: int = 1280, height: int = 720, frames: int = 300, fps: float = 30.0,
              noise: bool = False) -> Path:
    """An H.264 clip with one face (the test photo) moving over a textured background.

    The background is smooth texture, as in filmed scenes; ``noise=True`` makes it per-pixel noise
    instead, the hardest content for an encoder (nothing in it can be predicted).
    """
    import cv2
    import numpy as np
    from ..engine.check import SAMPLE_PHOTO
    from ..io.writer import VideoWriter

    face = cv2.imread(str(SAMPLE_PHOTO))
    side = height // 2
    face = cv2.resize(face, (side, side))
    writer = VideoWriter(path, fps, (width, height))
    rng = np.random.default_rng(0)
    background = rng.integers(30, 90, (height, width, 3), dtype=np.uint8)
    if not noise:
        texture = cv2.GaussianBlur(rng.normal(0, 1, (height, width, 3)).astype(np.float32), (0, 0), 12)
        background = cv2.normalize(texture, None, 40, 200, cv2.NORM_MINMAX).astype(np.uint8)
    for i in range(frames):
        canvas = background.copy()
        x = int((width - side) * (0.5 + 0.45 * np.sin(i / 40)))
        y = int((height - side) * (0.5 + 0.3 * np.cos(i / 55)))
        canvas[y:y + side, x:x + side] = face
        writer.write(cv2.cvtColor(canvas, cv2.COLOR_BGR2RGB))
    writer.close()
    return path


def released_way(clip: Path, device: str, output: Optional[Path]) -> float:
    """Frames/s of the released demo's way: decode in the loop; every frame detect, crop, batch-1 fp32 EmoNet."""
    import cv2
    from ..engine.graphs import synchronize
    from ..models.weights import load_model
    from ..detection.blazeface import BlazeFaceDetector
    from ..drawing import annotate
    from ..engine import Engine, EngineConfig
    from ..pipeline import Pipeline
    from ..runtime import RuntimeConfig, configure
    from ..io.writer import VideoWriter

    dev = configure(RuntimeConfig(device=device, cudnn_benchmark=False))
    engine = Engine(load_model("random", device="cpu"), dev, EngineConfig(warmup=False), log=lambda m: None)
    pipeline = Pipeline(engine, BlazeFaceDetector(dev))
    cap = cv2.VideoCapture(str(clip))
    writer, frames = None, 0
    start = time.perf_counter()
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        faces = pipeline([rgb])[0][:1]  # one face per frame, as the released demo
        if output is not None:
            if writer is None:
                # The released way's writer: OpenCV's mp4v.
                writer = VideoWriter(output, 30.0, (rgb.shape[1], rgb.shape[0]), codec="mp4v")
            writer.write(annotate(rgb, faces, engine.class_names))
        frames += 1
    if dev.type == "cuda":
        synchronize(dev)
    elapsed = time.perf_counter() - start
    if writer:
        writer.close()
    return frames / elapsed


def decode_loop(clip: Path) -> float:
    """Frames/s of OpenCV decoding alone: ``VideoCapture.read`` in a loop, frames left as decoded (BGR), on
    the video tool's FFmpeg threads.

    The reference "what decoding allows": no colour conversion, copy or hand-over between threads.
    """
    from ..io.decode_worker import open_capture
    cap = open_capture(str(clip))
    n, start = 0, time.perf_counter()
    while cap.read()[0]:
        n += 1
    elapsed = time.perf_counter() - start
    cap.release()
    return n / elapsed


def decode_only(clip: Path, device: Optional[str] = None) -> float:
    """Frames/s of the video tool's reader alone: RGB host frames, or with ``device`` uploaded (RGB on the GPU)."""
    import torch
    from ..io.video import VideoReader
    reader = VideoReader(str(clip), device=torch.device(device) if device else None, keep_host=not device)
    start = time.perf_counter()
    n = sum(1 for _ in reader)
    elapsed = time.perf_counter() - start
    reader.close()
    return n / elapsed


def video_benchmark(clip: Optional[str], device: str, engines: list[str], repeat: int = 1) -> str:
    """The video table: decoding alone, the released way, and demo_video.py (analysis only with each engine,
    and with the annotated video), analysis and the default annotated video run ``repeat`` times."""
    import re
    import statistics
    with tempfile.TemporaryDirectory(prefix="emonet-video-") as tmp:
        path = Path(clip) if clip else make_clip(Path(tmp) / "clip720p.mp4", frames=900)
        reference = decode_loop(path)
        rows = [("decoding alone: OpenCV read loop, BGR (the reference)", [reference])]
        rows.append(("the tool's reader alone, RGB frames in host memory", [decode_only(path)]))
        if device.startswith("cuda"):
            rows.append(("the tool's reader alone, frames uploaded (RGB on the GPU)", [decode_only(path, device)]))
        rows.append(("released way, analysis only", [released_way(path, device, None)]))
        rows.append(("released way + annotated video", [released_way(path, device, Path(tmp) / "released.mp4")]))
        script = ["-m", "emonet.apps.video"]
        runs = [(f"demo_video.py --no-video --engine {e}", ["--no-video", "--csv", str(Path(tmp) / "f.csv"),
                                                           "--engine", e], repeat) for e in engines]
        # The default annotated video as often as analysis alone (their ratio is the cost of the video); then
        # decoded on the CPU (the default decodes on NVDEC where PyNvVideoCodec is installed), mp4v.
        for codec, decoder in (("h264", "auto"), ("h264", "cpu"), ("mp4v", "auto")):
            runs.append((f"demo_video.py --output (annotated video) --codec {codec} --decoder {decoder} "
                         f"--engine {engines[0]}",
                         ["--output", str(Path(tmp) / f"o-{codec}.mp4"), "--codec", codec, "--decoder", decoder,
                          "--engine", engines[0]],
                         repeat if (codec, decoder) == ("h264", "auto") else 1))
        notes = []
        for label, args, times in runs:
            cmd = [sys.executable, *script, "--video", str(path), "--weights", "random", "--device", device, *args]
            rates = []
            for _ in range(times):
                proc = subprocess.run(cmd, capture_output=True, text=True)
                m = re.search(r"([\d.]+) frames/s end to end", proc.stderr)
                rates.append(float(m.group(1)) if m else float("nan"))
                for pattern in (r"engine warm-up.*", r"time per frame by stage.*", r"CPU-seconds:.*"):
                    line = re.search(pattern, proc.stderr)
                    if line:
                        notes.append(f"{label}, run {len(rates)}: {line.group(0)}")
            rows.append((label, rates))
        import cv2
        cap = cv2.VideoCapture(str(path))
        size = f"{int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))}x{int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))}, " \
               f"{int(cap.get(cv2.CAP_PROP_FRAME_COUNT))} frames"
    released = {"analysis": rows[-len(runs) - 2][1][0], "video": rows[-len(runs) - 1][1][0]}
    lines = [f"Video clip: {size}", "",
             "| way | frames/s (median) | runs | vs released way | of decoding alone |", "|---|---|---|---|---|"]
    for name, rates in rows:
        mid = statistics.median(rates)
        each = ", ".join(f"{r:.1f}" for r in rates) if len(rates) > 1 else ""
        # Analysis against the released way's analysis; the annotated video against its annotated video.
        vs = f"{mid / released['video' if '--output' in name else 'analysis']:.1f}×" if name.startswith("demo_video") else ""
        lines.append(f"| {name} | {mid:.1f} | {each} | {vs} | {100 * mid / reference:.0f} % |")
    return "\n".join(lines + [""] + notes)


# -- photos: process start to exit, fresh processes -----------------------------------------------

# The released demo's way for images, in one process: load the checkpoint, cudnn.benchmark on, eager fp32,
# each image resized whole to 256x256 and run alone.
RELEASED_PHOTO = """
import sys, cv2, torch
from emonet.models import EmoNet
checkpoint, device, paths = sys.argv[1], torch.device(sys.argv[2]), sys.argv[3:]
torch.backends.cudnn.benchmark = True
state = torch.load(checkpoint, map_location="cpu", weights_only=True)
net = EmoNet(8)
net.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
net = net.to(device).eval()
for path in paths:
    image = cv2.cvtColor(cv2.resize(cv2.imread(path), (256, 256)), cv2.COLOR_BGR2RGB)
    x = torch.from_numpy(image).permute(2, 0, 1).float().div(255).unsqueeze(0).to(device)
    with torch.no_grad():
        out = net(x)
    print(path, int(out["expression"].argmax()), float(out["valence"].cpu()))
"""


# -- what users wait for: jobs of every length, each in a fresh process ---------------------------------

def repeat_clip(source: Path, times: int, path: Path) -> Path:
    """``source`` played ``times`` times over, into ``path`` (packets copied, timestamps shifted: no
    re-encoding, so a long clip is made in seconds)."""
    import av

    with av.open(str(source)) as first:
        stream_in = first.streams.video[0]
        frames = sum(1 for _ in first.demux(stream_in)) - 1  # (the demuxer's end-of-stream marker)
    with av.open(str(path), mode="w", options={"movflags": "+faststart"}) as out:
        with av.open(str(source)) as first:
            stream = out.add_stream_from_template(first.streams.video[0])
        for k in range(times):
            with av.open(str(source)) as part:
                video = part.streams.video[0]
                shift = int(round(k * frames / float(video.average_rate) / video.time_base))
                for packet in part.demux(video):
                    if packet.dts is None:
                        continue
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = stream
                    out.mux(packet)
    return path


def _timed_tool(argv: list[str], device: str) -> dict:
    """Run a tool in a fresh process: its wall time, and what its report says (first result, model load,
    frames/s end to end, steady-state images/s)."""
    import re

    cmd = [sys.executable, *argv, "--weights", "random", "--device", device]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    err = proc.stderr
    first = re.search(r"first results? ([\d.]+) s after the process started", err)
    load = re.search(r"model(?:, engine and warm-up|, engine and detector| and engine) ([\d.]+) s", err)
    rate = re.search(r"([\d.]+) frames/s end to end", err)
    images = re.search(r"per image latency.*?throughput\s+([\d.]+) images/s", err, re.S)
    graphs = re.search(r"CUDA graphs were ready ([\d.]+) s", err)
    return {"wall_s": wall, "first_result_s": float(first.group(1)) if first else None,
            "model_load_s": float(load.group(1)) if load else None,
            "frames_per_s": float(rate.group(1)) if rate else None,
            "images_per_s": float(images.group(1)) if images else None,
            "graphs_ready_s": float(graphs.group(1)) if graphs else None}


def job_sweep(device: str, seconds: Sequence[int] = (10, 60, 300, 1800), photos: Sequence[int] = (1, 150, 1500),
              released: bool = True, repeat: int = 3, short: float = 60) -> str:
    """Clips of each length in ``seconds`` (720p, 30 frames/s, made as :func:`make_clip` makes them) analysed
    and annotated, and photo sets of each size in ``photos``, each run in a fresh process beside a fresh
    floor process (one that only imports torch and touches the device): wall time, first result, and the
    ratio to floor + model load + the frames at steady speed (the speed of the longest job of its kind).

    A clip of up to ``short`` seconds, and every photo set but the largest, runs ``repeat`` times, alternating
    with the others: a process's start-up varies by a second or more from one to the next, which is most of a
    short job's ratio; its row gives the medians and each run's ratio."""
    import cv2
    import numpy as np
    from tqdm import tqdm

    def times(is_short: bool) -> int:
        return max(1, repeat) if is_short else 1

    if not seconds and not photos:
        raise ValueError("the sweep needs clip lengths or photo set sizes")
    with tempfile.TemporaryDirectory(prefix="emonet-sweep-") as tmp:
        tmp = Path(tmp)
        shortest = min(seconds, default=1)
        base = make_clip(tmp / "base.mp4", frames=30 * shortest)  # the longer clips repeat it (and photos are its frames)
        clips = {s: base if s == shortest else repeat_clip(base, s // shortest, tmp / f"clip{s}.mp4") for s in seconds}
        cap = cv2.VideoCapture(str(base))
        ok, frame = cap.read()
        cap.release()
        for n in photos:
            folder = tmp / f"photos{n}"
            folder.mkdir()
            for i in range(n):  # one clip frame each, shifted so no two are the same file
                cv2.imwrite(str(folder / f"{i:05d}.jpg"), np.roll(frame, 7 * i, axis=1))
        jobs = [("video, " + mode, f"{s // 60} min" if s >= 60 else f"{s} s", s * 30,
                 ["-m", "emonet.apps.video", "--video", str(clips[s]), "--csv", str(tmp / "rows.csv"),
                  *(["--no-video"] if mode == "analysis" else ["--output", str(tmp / "annotated.mp4")])], times(s <= short))
                for s in seconds for mode in ("analysis", "annotated")]
        jobs += [("photos", str(n), n, ["-m", "emonet.apps.photo", "--image", str(tmp / f"photos{n}"), "--json",
                                        str(tmp / "p.json")], times(n < max(photos))) for n in photos]
        order = [k for r in range(max(j[4] for j in jobs)) for k, job in enumerate(jobs) if r < job[4]]
        done: dict[int, list] = {k: [] for k in range(len(jobs))}  # job -> [(result, floor)]
        for k in tqdm(order, desc="jobs", unit="run", file=sys.stderr):  # round by round: repeats alternate
            floor = startup_floor(device).get("process_s")
            done[k].append((_timed_tool(jobs[k][3], device), floor))
            result = done[k][-1][0]  # each run as it ends (a long sweep's log keeps what it measured)
            tqdm.write(f"{jobs[k][0]}, {jobs[k][1]}: floor {_fmt(floor)} s, " + ", ".join(
                f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}" for key, value in result.items()),
                file=sys.stderr)
        released_rate = released_way(clips[shortest], device, None) if released and seconds else None
    lines = sweep_table([(kind, label, n) for kind, label, n, _, _ in jobs], [done[k] for k in range(len(jobs))])
    if released_rate:
        n = shortest * 30
        lines.append(f"The released way (decode, detect, crop, batch-1 fp32 EmoNet, frame by frame) on the "
                     f"{shortest}-s clip: {released_rate:.1f} frames/s, {n / released_rate:.1f} s for its frames "
                     f"after the model loaded.")
    return "\n".join(lines)


def sweep_table(jobs: Sequence[tuple[str, str, int]], runs: Sequence[Sequence[tuple[dict, Optional[float]]]]) -> list[str]:
    """The sweep's Markdown table: per job ``(kind, label, frames or images)``, its runs as ``(what
    :func:`_timed_tool` read, the floor process's seconds)``. A job run several times shows its median run (by
    the ratio) and every run's ratio. Steady speed: the first run of the last job of each kind."""
    steady: dict = {}
    for (kind, _, _), job_runs in zip(jobs, runs):  # the longest job of each kind comes last
        rate = job_runs[0][0].get("images_per_s" if kind == "photos" else "frames_per_s")
        if rate:
            steady[kind] = rate
    lines = ["| job | run | wall (s) | floor (s) | first result (s; after the floor) | model load (s) | "
             "frames at steady speed (s) | wall / (floor + load + frames) |", "|---|---|---|---|---|---|---|---|"]
    for (kind, label, n), job_runs in zip(jobs, runs):
        failed = [r for r, _ in job_runs if "error" in r]
        if failed:
            lines.append(f"| {kind} | {label} | failed: {failed[0]['error']} | | | | | |")
            continue
        frames_s = n / steady[kind] if steady.get(kind) else None
        ratios = [r["wall_s"] / ((floor or 0) + (r["model_load_s"] or 0) + (frames_s or 0)) for r, floor in job_runs]
        middle = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]
        result, floor = job_runs[middle]
        first = result["first_result_s"]
        unit = ("image" if kind == "photos" else "frame") + ("" if n == 1 else "s")
        which = f", the median of {len(ratios)} runs" if len(ratios) > 1 else ""
        each = f" ({', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""
        lines.append(f"| {kind} | {label} ({n} {unit}{which}) | {result['wall_s']:.2f} | {_fmt(floor)} | "
                     f"{_fmt(first)} ({_fmt(first - floor if first is not None and floor else None, '+.2f')}) | "
                     f"{_fmt(result['model_load_s'])} | {_fmt(frames_s)} | **{ratios[middle]:.2f}×**{each} |")
    lines += ["", "Steady speed (the longest job of its kind): "
              + ", ".join(f"{k} {v:.0f} {'images' if k == 'photos' else 'frames'}/s" for k, v in steady.items()) + "."]
    ready = [r["graphs_ready_s"] for job_runs in runs for r, _ in job_runs if r.get("graphs_ready_s") is not None]
    if ready:
        lines.append(f"The engine's CUDA graphs were ready {min(ready):.2f}–{max(ready):.2f} s after the model "
                     f"loaded (captured in the background; the first frames ran eagerly meanwhile).")
    return lines


def serve_load_table(url: str, counts: Sequence[int], seconds: float, fps: float = 30.0,
                     clip: Optional[str] = None) -> str:
    """The service at ``url`` under each count of concurrent streams (:func:`emonet.bench.load.run_load`), as a
    Markdown table: the client's round trip first, frames answered, dropped and never answered, the server's
    latency, GPU step sizes. ``clip``: a video whose frames (as 640x480 JPEG) are sent (default: a made-up clip
    of a real face)."""
    import json
    import urllib.request

    import av
    import cv2
    from .load import HEADER, run_load

    health = json.loads(urllib.request.urlopen(f"{url}/health", timeout=10).read())
    with tempfile.TemporaryDirectory(prefix="emonet-load-") as tmp:
        path = clip or make_clip(Path(tmp) / "clip.mp4", width=640, height=480, frames=30)
        with av.open(str(path)) as container:
            frames = [cv2.imencode(".jpg", cv2.resize(f.to_ndarray(format="bgr24"), (640, 480)))[1].tobytes()
                      for _, f in zip(range(300), container.decode(video=0))]
    lines = [f"Service: {url}, {health.get('engine')} on {health.get('device')}, JPEG decoded by "
             f"{health.get('jpeg_decoder', '?')}; 640x480 JPEG frames of {clip or 'a made-up clip of a real face'} "
             f"({sum(map(len, frames)) // len(frames) // 1024} KB), {fps:g} frames/s a stream paced by the clock, "
             f"{seconds:g} s each. Round trip: from the client's send to its answer.", "", HEADER]
    for n in counts:
        result = run_load(url, frames, n, fps, seconds)
        lines.append(result.row())
        if result.errors:
            lines.append(f"<!-- {n} streams: {len(result.errors)} errors, first: {result.errors[0]} -->")
    return "\n".join(lines)


def photo_benchmark(photo: Optional[str], device: str, repeat: int = 2, crops: int = 149) -> str:
    """One photo, and ``crops`` tight face crops, from process start to exit: the released demo's way
    against the photo tool's ways, fresh processes alternating, ``repeat`` rounds, and the floor of a
    process that only imports torch and touches the device."""
    import re
    import statistics
    import cv2
    import torch
    from ..engine.check import SAMPLE_PHOTO, real_face_crops
    from ..models.weights import load_model

    with tempfile.TemporaryDirectory(prefix="emonet-photo-") as tmp:
        tmp = Path(tmp)
        checkpoint = tmp / "emonet_8.pth"  # the same random weights for every way, in the released format
        torch.save({f"module.{k}": v for k, v in load_model("random").state_dict().items()}, checkpoint)
        image = str(Path(photo) if photo else SAMPLE_PHOTO)
        folder = tmp / "crops"
        folder.mkdir()
        for k, crop in enumerate(real_face_crops(crops).permute(0, 2, 3, 1).numpy()):
            cv2.imwrite(str(folder / f"crop{k:03d}.jpg"), cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
        crop_paths = sorted(map(str, folder.glob("*.jpg")))
        tool = [sys.executable, "-m", "emonet.apps.photo", "--weights", str(checkpoint), "--device", device]
        released = [sys.executable, "-c", RELEASED_PHOTO, str(checkpoint), device]
        ways = [("the released demo's way (load, cudnn.benchmark, eager fp32, one forward)", released + [image]),
                ("demo.py --detector none", tool + ["--image", image, "--detector", "none"]),
                ("demo.py (BlazeFace)", tool + ["--image", image]),
                ("demo.py --engine eager", tool + ["--image", image, "--engine", "eager"]),
                (f"{crops} tight crops: the released way, one process", released + crop_paths),
                (f"{crops} tight crops: demo.py --detector none", tool + ["--image", str(folder), "--detector", "none"]),
                ("a process that only imports torch and touches the device", None)]
        times: dict[str, list[float]] = {name: [] for name, _ in ways}
        first: dict[str, list[str]] = {name: [] for name, _ in ways}
        for _ in range(repeat):
            for name, cmd in ways:  # alternating: each round runs every way once
                if cmd is None:
                    floor = startup_floor(device)
                    times[name].append(floor.get("process_s", float("nan")))
                    continue
                t = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
                times[name].append(time.perf_counter() - t if proc.returncode == 0 else float("nan"))
                line = re.search(r"first result .*", proc.stderr)
                if line:
                    first[name].append(line.group(0))
    floor_s = statistics.median(times[ways[-1][0]])
    lines = [f"Photo: {image}; device {device}; {repeat} rounds, fresh processes, alternating", "",
             "| one photo, process start to exit | " + " | ".join(f"run {k + 1}" for k in range(repeat))
             + " | median | vs floor |", "|---|" + "---|" * (repeat + 2)]
    for name, _ in ways:
        mid = statistics.median(times[name])
        lines.append(f"| {name} | " + " | ".join(f"{t:.2f} s" for t in times[name])
                     + f" | {mid:.2f} s | {mid / floor_s:.2f}× |")
    lines.append("")
    for name, _ in ways:
        lines += [f"- {name}, run {k + 1}: {text}" for k, text in enumerate(first[name])]
    return "\n".join(lines)


# -- the whole comparison, one fresh process per measurement ------------------------------------

def _spawn(mode: str, args: argparse.Namespace, cache_dir: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, "-m", "emonet.bench", "--child", mode, "--child-out", out,
           "--device", args.device, "--weights", args.weights, "--iters", str(args.iters),
           "--batch-sizes", ",".join(map(str, args.batch_sizes)), "--cache-dir", cache_dir]
    if args.quick:
        cmd.append("--quick")
    if args.nclasses:
        cmd += ["--nclasses", str(args.nclasses)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    try:
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or ["no output"]
            # The exception line, not a warning printed after it.
            errors = [l for l in lines if not l.startswith(" ") and ("Error" in l or "Exception" in l)]
            return {"mode": mode, "error": (errors or lines)[-1][:300], "process_s": wall}
        result = json.loads(Path(out).read_text())
        result["process_s"] = wall
        return result
    finally:
        Path(out).unlink(missing_ok=True)


def startup_floor(device: str) -> dict:
    """What any fresh process pays before EmoNet can start: Python with ``import torch``, and the CUDA context.

    Measured in a child that imports nothing of emonet, so "start to first result" can be read against it.
    """
    code = ("import json, sys, time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
            "d = torch.device(sys.argv[1]); torch.zeros(1, device=d); "
            "torch.cuda.synchronize(d) if d.type == 'cuda' else None; t2 = time.perf_counter(); "
            "print(json.dumps({'import_torch_s': t1 - t0, 'device_init_s': t2 - t1}))")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, device], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": wall}


def _fmt(v, spec=".2f", none="–") -> str:
    return none if v is None else format(v, spec)


def _rate(v: Optional[float]) -> str:
    """A throughput: whole units from 100 on, a decimal under (a slow CPU mode is not shown as 0)."""
    return _fmt(v, ",.0f" if v is not None and v >= 100 else ".1f")


def _table(rows: list[dict]) -> list[str]:
    head = ["mode", "first call cold (ms)", "warm-up cold (s)", "first call warm caches (ms)",
            "start→first result warm (s)", "b1 median (ms)", "b1 p90 (ms)", "best crops/s (batch)",
            "peak mem b1 (MB)", "held by allocator (MB)", "vs fp32"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cold, warm = r.get("cold", {}), r.get("warm", {})
        if "error" in cold:
            lines.append(f"| {r['mode']} | failed: {cold['error']} |" + " |" * (len(head) - 2))
            continue
        tp = cold.get("throughput") or {}
        best = max(tp.items(), key=lambda kv: kv[1]) if tp else None
        check = "—" if "check_diff" not in cold else (f"{cold['check_diff']:.4f}"
                                                      + ("" if cold["check_ok"] else " (over 0.01)"))
        lines.append("| " + " | ".join([
            r["mode"], _fmt(cold.get("first_call_ms")), _fmt(cold.get("warmup_s")),
            _fmt(warm.get("first_call_ms")), _fmt(warm.get("time_to_first_result_s"), ".1f"),
            _fmt(cold.get("b1_median_ms")), _fmt(cold.get("b1_p90_ms")),
            f"{_rate(best[1])} ({best[0]})" if best else "–", _fmt(cold.get("peak_mem_b1_mb"), ".0f"),
            _fmt(cold.get("held_mem_b1_mb"), ",.0f"), check]) + " |")
    return lines


def _throughput_table(rows: list[dict], batch_sizes: list[int]) -> list[str]:
    bs = [b for b in batch_sizes if b > 1]
    lines = ["| mode | " + " | ".join(f"batch {b}" for b in bs) + " |", "|---|" + "---|" * len(bs)]
    for r in rows:
        tp = r.get("cold", {}).get("throughput") or {}
        lines.append(f"| {r['mode']} | " + " | ".join(_rate(tp.get(str(b))) for b in bs) + " |")
    return lines


def environment(device: str) -> dict:
    """Device and software versions for the report."""
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "platform": platform.platform(),
           "cpu_count": os.cpu_count(), "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


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
    parser.add_argument("--quick", action="store_true", help="few iterations, batch 8 only, agreement on 8 crops: a first look (42 s on 2 idle CPU "
                             "cores)")
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
                             "streams of 640x480 JPEG frames: lost and reordered frames, server latency p50/p99, GPU "
                             "batch sizes")
    parser.add_argument("--serve-clip", default=None, metavar="VIDEO",
                        help="--serve-load sends this video's frames (as 640x480 JPEG; default: a made-up clip)")
    parser.add_argument("--serve-streams", default="1,8,16,32", metavar="N[,N...]",
                        help="stream counts of --serve-load (default 1,8,16,32)")
    parser.add_argument("--serve-seconds", default=10.0, type=float, metavar="S",
                        help="how long each count of --serve-load runs, 30 frames/s a stream (default 10)")
    parser.add_argument("--warp", action="store_true",
                        help="instead: time cutting face crops with OpenCV against grid_sample on the device")
    parser.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

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

    # --warp, --video and --profile make one Markdown report: shown, and saved to --markdown.
    if args.warp:
        _report(warp_benchmark(args.device), args.markdown)
        return 0
    if args.serve_load is not None:
        try:
            counts = [int(v) for v in args.serve_streams.split(",") if v]
        except ValueError:
            parser.error(f"--serve-streams takes whole counts, as 1,8,32 (got {args.serve_streams!r})")
        if not counts or min(counts) < 1 or args.serve_seconds <= 0:
            parser.error("--serve-streams counts are at least 1, and --serve-seconds positive")
        try:
            text = serve_load_table(args.serve_load.rstrip("/"), counts, args.serve_seconds, clip=args.serve_clip)
        except OSError as exc:
            print(f"error: {args.serve_load}: no emonet-serve answers there ({exc})", file=sys.stderr)
            return 2
        _report(text, args.markdown)
        return 0
    if args.sweep is not None:
        try:
            lengths = [int(v) for v in args.sweep.split(",") if v]
            sets = [int(v) for v in args.sweep_photos.split(",") if v]
        except ValueError:
            parser.error(f"--sweep takes whole seconds and --sweep-photos whole counts, as 10,60 (got {args.sweep!r}, "
                         f"{args.sweep_photos!r})")
        if not lengths or min(lengths) < 1 or any(v % min(lengths) for v in lengths) or any(v < 1 for v in sets):
            parser.error("--sweep lengths are whole seconds, each a multiple of the shortest (the clips repeat it); "
                         "photo sets at least 1")
        _report(job_sweep(args.device, lengths, sets, repeat=args.sweep_repeat), args.markdown)
        return 0
    if args.photo is not None:
        if args.photo:
            from ..errors import InputError
            from ..io.images import read_image
            try:  # here, so a bad photo is one line, not a table of failed processes
                read_image(args.photo)
            except InputError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        _report(photo_benchmark(args.photo or None, args.device, max(1, args.photo_repeat)), args.markdown)
        return 0
    if args.video is not None:
        from ..errors import InputError
        try:
            text = video_benchmark(args.video or None, args.device, args.video_engines, max(1, args.video_repeat))
        except InputError as exc:  # a missing or unreadable clip: one line, like the tools
            print(f"error: {exc}", file=sys.stderr)
            return 2
        _report(text, args.markdown)
        return 0
    if args.profile:
        mode_name, _, batch = args.profile.partition(":")
        if mode_name not in {m.name for m in MODES}:
            parser.error(f"unknown mode {mode_name!r}")
        if not (batch or "1").isdigit() or int(batch or 1) < 1:
            parser.error(f"--profile expects MODE:BATCH with a positive whole batch size, got {args.profile!r}")
        _report(profile(mode_name, int(batch or 1), args.device, args.weights), args.markdown)
        return 0
    if args.child:
        result = run_child(args)
        Path(args.child_out).write_text(json.dumps(result))
        return 0

    if args.weights not in ("random", "pretrained"):
        from ..models.weights import CheckpointError, read_state_dict
        try:  # once here, so a bad path is one line, not a failure in every child process
            read_state_dict(args.weights)
        except CheckpointError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    names = args.modes.split(",") if args.modes else (CPU_DEFAULT if cpu else GPU_DEFAULT)
    unknown = [n for n in names if n not in {m.name for m in MODES}]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; available: {', '.join(m.name for m in MODES)}")

    from tqdm import tqdm
    rows = []
    with tempfile.TemporaryDirectory(prefix="emonet-bench-") as tmp:
        for name in tqdm(names, desc="modes", unit="mode", file=sys.stderr, leave=False):
            cache = str(Path(tmp) / name)  # empty: a cold start for this mode
            row = {"mode": name, "cold": _spawn(name, args, cache)}
            # Only compiled modes keep anything on disk; an eager mode's second start equals its first.
            compiled = next(m for m in MODES if m.name == name).compiled
            if compiled and not args.no_warm_rerun and "error" not in row["cold"]:
                row["warm"] = _spawn(name, args, cache)
            rows.append(row)
            cold = row["cold"]
            tqdm.write(f"{name}: " + (f"failed ({cold['error']})" if "error" in cold else
                                      f"batch 1 {_fmt(cold.get('b1_median_ms'))} ms"), file=sys.stderr)
            if args.json:  # partial results survive an interrupted run
                Path(args.json).write_text(json.dumps({"partial": True, "modes": rows}, indent=2))

    env = environment(args.device)
    floor = startup_floor(args.device)
    floor_line = (f"Start-up floor (a fresh process that only imports torch and touches {args.device}): "
                  f"import torch {floor['import_torch_s']:.2f} s, device init {floor['device_init_s']:.2f} s, "
                  f"whole process {floor['process_s']:.2f} s." if "error" not in floor
                  else f"Start-up floor: not measured ({floor['error']})")
    command = "python -m emonet.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"Command: `{command}`", "",
             f"Device: {env.get('gpu', 'CPU')} ({args.device}); torch {env['torch']}, CUDA {env['cuda']}, "
             f"cuDNN {env['cudnn']}, Python {env['python']}, {env['cpu_count']} CPU cores", "",
             *_table(rows), "",
             "vs fp32: the largest difference in valence or arousal from true fp32 (TF32 off) on real faces, with "
             "a checkpoint whose outputs spread over them; bf16 (8 bits of mantissa) is expected over 0.01.", "",
             floor_line, ""]
    if any(b > 1 for b in args.batch_sizes):
        lines += ["Throughput (crops/s, steady state):", "", *_throughput_table(rows, args.batch_sizes), ""]
    for r in rows:
        if r["cold"].get("check"):
            lines.append(f"- {r['mode']}: {r['cold']['check']}")
    text = "\n".join(lines)
    print(text)
    report = {"command": command, "environment": env, "startup_floor": floor, "modes": rows}
    _save(args.json, json.dumps(report, indent=2))
    _save(args.markdown, text + "\n")
    failed = [r["mode"] for r in rows if "error" in r["cold"]]
    if failed:
        print(f"error: {len(failed)} mode(s) failed: {', '.join(failed)} (see the table)", file=sys.stderr)
    return 1 if failed else 0


def _save(path: Optional[str], content: str) -> None:
    """Write ``content`` to ``path`` whole or not at all (a temporary name, then a rename)."""
    if path:
        tmp_path = Path(f"{path}.tmp")
        tmp_path.write_text(content)
        os.replace(tmp_path, path)


def _report(text: str, markdown: Optional[str]) -> None:
    print(text)
    _save(markdown, text + "\n")


if __name__ == "__main__":
    sys.exit(main())
