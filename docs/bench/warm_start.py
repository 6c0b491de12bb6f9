"""Where a warm start's seconds and a batch-1 engine's memory go, for an engine with graphs for many sizes.

    python docs/bench/warm_start.py CACHE_DIR [SIZES]      # one JSON line; SIZES default 1,8,32,128,256,512

Builds the engine (preset ``compiled`` unless PRESET says otherwise) without its load-time warm-up, then
warms it one batch size at a time, timing each step with the GPU synchronised: the first eager call
(loading the saved compiled code, cuDNN autotuning) and the graph's capture (two more runs, the capture,
one replay). Then the first real batch-1 call, the batch-1 median over 300 calls, the throughput at
batch 8, 256 and 512 (those configured), what the allocator holds and where its allocated bytes live
(weights, the graphs' input buffer, their outputs, the rest by memory pool). Run it once to fill CACHE_DIR, then again for a
warm start. Knobs (environment): BENCHMARK=0 turns cudnn.benchmark off; AUTOTUNE_STREAMED=1 turns it on
for the small batches of the streamed path too (``EngineConfig.autotune_streamed``, off since the tenth
session; it was on in warm_start.sh's runs); SHARE_POOL=0 gives each graph a memory pool of its own; EMPTY_CACHE=1
hands the allocator's unused cache back after the warm-up; cuDNN's own variables
(TORCH_CUDNN_USE_HEURISTIC_MODE_B) pass through. PROFILE=FILE writes a cProfile of the warm-up there (and
the raw stats to FILE.prof). Eleventh session: WARMUP=engine runs the engine's own ``warmup()`` instead of
the step-by-step one (no per-size steps then; its log line is kept); CUDNN_LIMIT=N sets
``torch.backends.cudnn.benchmark_limit``. (OVERLAP, PRETUNE and DYNAMIC_BLOCKS drove engine options
that were tried and not kept: docs/PERFORMANCE.md, eleventh session.)
"""
import os
import time

T0 = time.perf_counter()
import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import replace  # noqa: E402

r = {}
t = time.perf_counter()
import torch  # noqa: E402
r["import_torch_s"] = time.perf_counter() - t
sys.path.insert(0, os.getcwd())
from emonet.bench import process_age, real_face_crops  # noqa: E402
from emonet.checkpoints import load_model  # noqa: E402
from emonet.engine import PRESETS, Engine  # noqa: E402
from emonet.runtime import RuntimeConfig, configure  # noqa: E402
from emonet.timing import LatencyTimer, time_calls  # noqa: E402

r["import_emonet_s"] = time.perf_counter() - t - r["import_torch_s"]
if len(sys.argv) not in (2, 3) or not all(s.isdigit() and int(s) > 0 for s in (sys.argv[2:] or ["1"])[0].split(",")):
    sys.exit("usage: python docs/bench/warm_start.py CACHE_DIR [SIZES, e.g. 1,8,32]")
r["interpreter_s"] = round(process_age() - (time.perf_counter() - T0), 3)  # before this script's first line
cache = sys.argv[1]
sizes = tuple(int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32,128,256,512").split(","))
preset = os.environ.get("PRESET", "compiled")
r.update(preset=preset, sizes=sizes, benchmark=os.environ.get("BENCHMARK", "1") != "0",
         empty_cache=os.environ.get("EMPTY_CACHE") == "1", mode_b=os.environ.get("TORCH_CUDNN_USE_HEURISTIC_MODE_B"),
         pyc=os.environ.get("PYTHONPYCACHEPREFIX"))

t = time.perf_counter()
dev = configure(RuntimeConfig(device=os.environ.get("DEVICE", "cuda"), cudnn_benchmark=r["benchmark"]))
cuda = dev.type == "cuda"
sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)  # noqa: E731
torch.zeros(1, device=dev)
sync()
r["cuda_init_s"] = time.perf_counter() - t
t = time.perf_counter()
config = replace(PRESETS[preset], batch_sizes=sizes, warmup=False, cache_dir=cache,
                 autotune_streamed=os.environ.get("AUTOTUNE_STREAMED", "0") == "1",
                 share_graph_pool=os.environ.get("SHARE_POOL", "1") == "1")
if os.environ.get("CUDNN_LIMIT"):  # cuDNN algorithms timed per convolution (PyTorch's default: 10)
    torch.backends.cudnn.benchmark_limit = int(os.environ["CUDNN_LIMIT"])
r["engine"] = config.name
log = []
engine = Engine(load_model("random", device="cpu"), dev, config, log=log.append)
sync()
r["build_s"] = time.perf_counter() - t

steps = {}
profiler = None
if os.environ.get("PROFILE"):
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
t_warm = time.perf_counter()
for b in [] if os.environ.get("WARMUP") == "engine" else sorted(sizes, reverse=True):  # Engine.warmup's order
    x = torch.zeros(b, 3, 256, 256, dtype=torch.uint8, device=dev)
    t = time.perf_counter()
    with torch.inference_mode():
        engine._call_model(engine._prepare(x))
    sync()
    first = time.perf_counter() - t
    t = time.perf_counter()
    engine(x)  # captures the graph (two runs, the capture) and replays it
    sync()
    steps[b] = {"first_call_s": round(first, 3), "capture_s": round(time.perf_counter() - t, 3)}
    del x
if os.environ.get("WARMUP") == "engine":
    engine.warmup()
    r["engine_log"] = log[-1]
r["warmup_s"] = time.perf_counter() - t_warm
if profiler is not None:
    import io
    import pstats
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).sort_stats("cumulative")
    stats.print_stats(45)
    stats.sort_stats("tottime").print_stats(30)
    with open(os.environ["PROFILE"], "w") as fh:
        fh.write(text.getvalue())
    stats.dump_stats(os.environ["PROFILE"] + ".prof")
r["steps"] = steps
r["precompiled"] = engine.precompiled
if r["empty_cache"]:
    torch.cuda.empty_cache()

crop = real_face_crops(1).to(dev)
sync()
if cuda:
    torch.cuda.reset_peak_memory_stats(dev)
timer = LatencyTimer(dev)
with timer.measure(1):
    engine(crop)
sync()
r["time_to_first_result_s"] = process_age()
for _ in range(300):
    with timer.measure(1):
        engine(crop)
s = timer.summary()
r.update(first_call_ms=s.first_ms, b1_median_ms=s.median_ms, b1_p90_ms=s.p90_ms)
sync()
if cuda:
    r["peak_mem_b1_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    r["allocated_mb"] = torch.cuda.memory_allocated(dev) / 2**20
    r["held_mb"] = torch.cuda.memory_reserved(dev) / 2**20
    mb = lambda ts: sum(t.numel() * t.element_size() for t in ts) / 2**20  # noqa: E731
    r["weights_mb"] = mb(list(engine.model.parameters()) + list(engine.model.buffers()))
    r["static_inputs_mb"] = mb(engine._static_inputs.values())
    r["static_outputs_mb"] = mb(out for _, _, out in engine._graphs.values())
    by_pool = {}
    for seg in torch.cuda.memory_snapshot():
        if seg["device"] != dev.index:
            continue
        pool = "default" if tuple(seg["segment_pool_id"]) == (0, 0) else "graph"
        active = sum(bl["size"] for bl in seg["blocks"] if bl["state"] == "active_allocated")
        slot = by_pool.setdefault(pool, {"segments": 0, "reserved_mb": 0.0, "active_mb": 0.0, "largest_active": []})
        slot["segments"] += 1
        slot["reserved_mb"] += seg["total_size"] / 2**20
        slot["active_mb"] += active / 2**20
        slot["largest_active"] += [bl["size"] // 2**20 for bl in seg["blocks"]
                                   if bl["state"] == "active_allocated" and bl["size"] >= 2**20]
    for slot in by_pool.values():
        slot["largest_active"] = sorted(slot["largest_active"], reverse=True)[:12]
    r["by_pool"] = by_pool

time.sleep(0.5)  # a real first frame arrives after the GPU has idled
idle = LatencyTimer(dev)
with idle.measure(1):
    engine(crop)
r["call_after_idle_ms"] = idle.summary().first_ms
r["throughput"] = {}
for b in (8, 256, 512):
    if b in sizes:
        x = real_face_crops(b).to(dev)
        r["throughput"][b] = round(time_calls(lambda: engine(x), dev, 21, n_items=b, warmup=21).throughput)
print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
