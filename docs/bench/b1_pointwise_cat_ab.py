"""Batch-1 latency of the streamed compiled engine (batch-1 graph only); NOPW=1 turns force_pointwise_cat back off.

python docs/bench/b1_pointwise_cat_ab.py NAME   (run from the repository root)
"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
import emonet.engine as E
from emonet.checkpoints import load_model
from emonet.runtime import RuntimeConfig, configure
from emonet.bench import real_face_crops
if os.environ.get("NOPW"):
    orig = E.Engine._compiler
    def patched(self):
        wrap = orig(self)
        import torch._inductor.config as c
        c.force_pointwise_cat = False
        return wrap
    E.Engine._compiler = patched
name = sys.argv[1]
dev = configure(RuntimeConfig(device="cuda", cudnn_benchmark=True))
t = time.perf_counter()
eng = E.Engine(load_model("random", device="cpu"), dev, E.EngineConfig(
    precision="fp16", channels_last=True, fold_bn=True, compile="default", streams=8, cuda_graphs=True,
    batch_sizes=(1,), precompile=False, cache_dir=f"/tmp/b1-{name}"), log=lambda m: None)
warm = time.perf_counter() - t
x = real_face_crops(1).to(dev)
for _ in range(20):
    eng(x)
ts = []
for _ in range(500):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); eng(x); b.record(); b.synchronize()
    ts.append(a.elapsed_time(b))
ts.sort()
print(json.dumps({"variant": name, "warmup_s": round(warm, 1), "median_ms": round(ts[250], 3), "p90_ms": round(ts[450], 3)}))
