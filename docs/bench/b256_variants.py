"""Large-batch throughput of the compiled engine under one variant; optional full kernel table.

python docs/bench/b256_variants.py NAME BATCH [--profile] [--nograph]
env: CUDNN_LIMIT=n (torch.backends.cudnn.benchmark_limit), IC="key=value,..." (inductor config),
PATCH=1 (stem and hourglass outputs made .contiguous(channels_last) in the model code),
NOPW=1 (the engine's force_pointwise_cat turned back off: the engine before the sixth session),
STATIC=1 (EngineConfig(dynamic_batch=False): the graph specialised to BATCH),
SIZES=1,8,... (the engine's batch sizes, warmed up in that order; default BATCH alone), STREAMS=n,
PRECOMPILE=1 (Dynamo's tracing saved and loaded, as the tools run), REAL=1 (real face crops, not noise).
Also prints the throughput as ``python -m emonet.bench`` times it (``emonet.timing.time_calls``).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import torch
from emonet.checkpoints import load_model
from emonet.engine import Engine, EngineConfig
from emonet.runtime import RuntimeConfig, configure
from emonet.timing import time_calls
from replay_rounds import round_rates  # docs/bench, beside this script

name, batch = sys.argv[1], int(sys.argv[2])
dev = configure(RuntimeConfig(device="cuda", cudnn_benchmark=True))
if os.environ.get("CUDNN_LIMIT"):
    torch.backends.cudnn.benchmark_limit = int(os.environ["CUDNN_LIMIT"])
import torch._inductor.config as ic
for kv in filter(None, os.environ.get("IC", "").split(",")):
    k, v = kv.split("=")
    obj = ic
    *path, last = k.split(".")
    for p in path:
        obj = getattr(obj, p)
    setattr(obj, last, eval(v))
if os.environ.get("PATCH"):
    from emonet.models import emonet as M
    cl = torch.channels_last
    _hg, _stem = M.HourGlass.forward, M.EmoNet.stem
    M.HourGlass.forward = lambda self, x: _hg(self, x).contiguous(memory_format=cl)
    M.EmoNet.stem = lambda self, x: _stem(self, x).contiguous(memory_format=cl)
if os.environ.get("NOPW"):
    _compiler = Engine._compiler

    def _no_pointwise_cat(self):
        wrap = _compiler(self)
        ic.force_pointwise_cat = False
        return wrap
    Engine._compiler = _no_pointwise_cat
graphs = "--nograph" not in sys.argv
t = time.perf_counter()
engine = Engine(load_model("random", device="cpu"), dev,
                EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="default",
                             dynamic_batch=not os.environ.get("STATIC"), cuda_graphs=graphs,
                             batch_sizes=tuple(int(b) for b in os.environ.get("SIZES", str(batch)).split(",")),
                             streams=int(os.environ.get("STREAMS", "0")), precompile=bool(os.environ.get("PRECOMPILE")),
                             cache_dir=f"/tmp/cc-{name}"), log=lambda m: None)
warm = time.perf_counter() - t
if os.environ.get("REAL"):
    from emonet.bench import real_face_crops
    x = real_face_crops(batch).to(dev)
else:
    x = torch.randint(0, 256, (batch, 3, 256, 256), dtype=torch.uint8, device=dev)
rates = round_rates(lambda: engine(x), batch)
bench_loop = time_calls(lambda: engine(x), dev, 21, n_items=batch, warmup=21).throughput
print(json.dumps({"variant": name, "batch": batch, "warmup_s": round(warm, 1),
                  "crops_per_s_median": round(rates[2]), "runs": [round(r) for r in rates],
                  "bench_loop": round(bench_loop),
                  "peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20)}), flush=True)

if "--profile" in sys.argv:
    from torch.profiler import ProfilerActivity, profile
    steps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine(x)
        torch.cuda.synchronize()
    ks = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.device_time_total for e in ks) / steps / 1e3
    def cat(n):
        if n.startswith("triton"):
            return "triton"
        if "fprop" in n or "conv" in n.lower() or "xmma" in n or "cutlass" in n:
            return "conv"
        return "other"
    sums = {}
    for e in ks:
        c = cat(e.key)
        sums[c] = sums.get(c, 0) + e.device_time_total / steps / 1e3
    print(f"PROFILE {name} b{batch}: {sum(e.count for e in ks) / steps:.0f} kernels, {total:.3f} ms/forward; "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(sums.items())))
    for e in sorted(ks, key=lambda e: e.device_time_total, reverse=True):
        print(f"  {e.device_time_total / steps / 1e3:8.3f} ms  x{e.count / steps:4.0f}  {e.key[:150]}")
