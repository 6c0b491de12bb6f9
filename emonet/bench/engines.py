"""The engine modes side by side (the default run of ``python -m emonet.bench``).

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
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import environment, fmt, fmt_rate, startup_floor


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
    Mode("auto", "the tools' GPU default: fp16-graph, every crop in a batch of 16 (halved until a crop gets the "
                 "same bits anywhere in it), its graph on 4 streams side by side, cudnn.benchmark off, graphs "
                 "captured in the background",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "cuda_graphs": True, "fixed_batch": 16,
          "check_batch": True, "lanes": 4, "background": True}, cudnn_benchmark=False),
    # The service's GPU default (engine_config("auto", ..., compiled=True); tests/test_bench.py holds them together).
    Mode("auto-compiled", "the service's GPU default (emonet-serve --compile): auto's one checked shape, from 8, "
                          "compiled for it by torch.compile (static shape, no side streams), on 4 streams",
         {"precision": "fp16", "channels_last": True, "fold_bn": True, "cuda_graphs": True, "fixed_batch": 8,
          "check_batch": True, "lanes": 4, "background": True, "compile": "default", "dynamic_batch": False,
          "streams": 0}, cudnn_benchmark=False, compiled=True),
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


def process_start() -> float:
    """The process's start on ``time.perf_counter``'s clock: warm starts count from it."""
    from ..timing import process_age

    return time.perf_counter() - (process_age() or 0.0)


# -- one mode, in this process ----------------------------------------------------------------

def run_child(args: argparse.Namespace) -> dict:
    """Measure one mode in this (fresh) process and return the numbers."""
    import torch
    from ..engine.graphs import synchronize
    from ..models.weights import load_model
    from ..engine import Engine, EngineConfig, compare, conditioned_model, real_face_crops, varied_face_crops
    from ..engine.invariance import BATCH_SIZES, batch_spread
    from ..runtime import RuntimeConfig, configure
    from ..timing import STEADY_CALLS, LatencyTimer, time_calls

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
    # No warm-up on a CPU, as the tools' CPU engines have none (emonet.engine.config): nothing to autotune or
    # capture there, so a warm-up would only add seconds the tools never spend.
    config = EngineConfig(**mode.engine, batch_sizes=tuple(batch_sizes), warmup=args.warmup and
                          bool(mode.engine) and device.type != "cpu", cache_dir=args.cache_dir)
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
        calls = STEADY_CALLS + 1 if args.quick else max(STEADY_CALLS, args.iters // 10) + 1
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
        # One answer per crop? Each crop alone against the same crop in batches of 1 to 512.
        sizes = (1, 3, 8) if args.quick else BATCH_SIZES
        result["batch_spread"] = batch_spread(lambda x: packed(check(x)), faces[1::2].to(device), sizes)
        result["batch_spread_sizes"] = list(sizes)
    return result


def packed(out: dict):
    """An engine's expression logits, valence and arousal as one float ``(N, K)`` tensor."""
    import torch
    return torch.cat([out["expression"].float(), out["valence"].float()[:, None], out["arousal"].float()[:, None]], 1)


# -- the whole comparison, one fresh process per measurement ------------------------------------

def _spawn(mode: str, args: argparse.Namespace, cache_dir: str) -> dict:
    """One mode measured in a fresh process (``--child``) and its wall time, or the line it failed with."""
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


def run_modes(names: list[str], args: argparse.Namespace) -> list[dict]:
    """Each named mode in fresh processes, a cold start then (compiled modes) a warm one: one row per mode."""
    from tqdm import tqdm

    from ..log import progress_bar
    rows = []
    with tempfile.TemporaryDirectory(prefix="emonet-bench-") as tmp:
        for name in progress_bar(names, desc="modes", unit="mode", leave=False):
            cache = str(Path(tmp) / name)  # empty: a cold start for this mode
            row = {"mode": name, "cold": _spawn(name, args, cache)}
            # Only compiled modes keep anything on disk; an eager mode's second start equals its first.
            compiled = next(m for m in MODES if m.name == name).compiled
            if compiled and not args.no_warm_rerun and "error" not in row["cold"]:
                row["warm"] = _spawn(name, args, cache)
            rows.append(row)
            cold = row["cold"]
            tqdm.write(f"{name}: " + (f"failed ({cold['error']})" if "error" in cold else
                                      f"batch 1 {fmt(cold.get('b1_median_ms'))} ms"), file=sys.stderr)
            if args.json:  # partial results survive an interrupted run
                Path(args.json).write_text(json.dumps({"partial": True, "modes": rows}, indent=2))
    return rows


def mode_report(rows: list[dict], args: argparse.Namespace, command: str) -> tuple[str, dict]:
    """The Markdown report of :func:`run_modes`'s rows, and the JSON one, with the environment and start-up floor."""
    env = environment(args.device)
    floor = startup_floor(args.device)
    spread_sizes = next((r["cold"]["batch_spread_sizes"] for r in rows if r.get("cold", {}).get("batch_spread_sizes")),
                        [])
    floor_line = (f"Start-up floor (a fresh process that only imports torch and touches {args.device}): "
                  f"import torch {floor['import_torch_s']:.2f} s, device init {floor['device_init_s']:.2f} s, "
                  f"whole process {floor['process_s']:.2f} s." if "error" not in floor
                  else f"Start-up floor: not measured ({floor['error']})")
    lines = [f"Command: `{command}`", "",
             f"Device: {env.get('gpu', 'CPU')} ({args.device}); torch {env['torch']}, CUDA {env['cuda']}, "
             f"cuDNN {env['cudnn']}, Python {env['python']}, {env['cpu_count']} CPU cores", "",
             *_table(rows), "",
             "vs fp32: the largest difference in valence or arousal from true fp32 (TF32 off) on real faces, with "
             "a checkpoint whose outputs spread over them; bf16 (8 bits of mantissa) is expected over 0.01. "
             "Spread over batches: the largest difference of any output (expression logits, valence, arousal) "
             f"of a crop run alone and in batches of {', '.join(map(str, spread_sizes))} (0: one answer per crop).",
             "",
             floor_line, ""]
    if any(b > 1 for b in args.batch_sizes):
        lines += ["Throughput (crops/s, steady state):", "", *_throughput_table(rows, args.batch_sizes), ""]
    for r in rows:
        if r["cold"].get("check"):
            lines.append(f"- {r['mode']}: {r['cold']['check']}")
    report = {"command": command, "environment": env, "startup_floor": floor, "modes": rows}
    return "\n".join(lines), report


def _table(rows: list[dict]) -> list[str]:
    """The modes' Markdown table: each mode's cold start, and its warm one where there was one."""
    head = ["mode", "first call cold (ms)", "warm-up cold (s)", "first call warm caches (ms)",
            "start→first result warm (s)", "b1 median (ms)", "b1 p90 (ms)", "best crops/s (batch)",
            "peak mem b1 (MB)", "held by allocator (MB)", "vs fp32", "spread over batches"]
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
            r["mode"], fmt(cold.get("first_call_ms")), fmt(cold.get("warmup_s")),
            fmt(warm.get("first_call_ms")), fmt(warm.get("time_to_first_result_s"), ".1f"),
            fmt(cold.get("b1_median_ms")), fmt(cold.get("b1_p90_ms")),
            f"{fmt_rate(best[1])} ({best[0]})" if best else "–", fmt(cold.get("peak_mem_b1_mb"), ".0f"),
            fmt(cold.get("held_mem_b1_mb"), ",.0f"), check, _spread(cold)]) + " |")
    return lines


def _spread(result: dict) -> str:
    """A mode's spread over batches: 0 exactly, or the largest difference."""
    spread = result.get("batch_spread")
    if spread is None:
        return "—"
    return "0" if spread == 0 else f"{spread:.2g}"


def _throughput_table(rows: list[dict], batch_sizes: list[int]) -> list[str]:
    """Each mode's crops/s at each batch size over 1, as a Markdown table."""
    bs = [b for b in batch_sizes if b > 1]
    lines = ["| mode | " + " | ".join(f"batch {b}" for b in bs) + " |", "|---|" + "---|" * len(bs)]
    for r in rows:
        tp = r.get("cold", {}).get("throughput") or {}
        lines.append(f"| {r['mode']} | " + " | ".join(fmt_rate(tp.get(str(b))) for b in bs) + " |")
    return lines

