"""GPU memory of an engine holding CUDA graphs for many batch sizes: one shared pool, or a pool per graph.

    python docs/bench/graph_memory.py [shared|separate] [PRESET]   # one JSON line; run each in its own process

Builds the engine (default preset ``fast``: no compilation, so it takes seconds) with graphs for batch
sizes 1 to 512, then reports what the caching allocator holds (``memory_reserved``) and the peak
allocated over 50 batch-1 calls, as ``python -m emonet.bench`` measures it. It then calls the engine
at every batch size in a scrambled order and compares each result with the same model run without
graphs (``max_diff``): with a shared pool a graph's replay must not overwrite a result already returned.
Since the tenth session the engine captures its graphs largest first (``Engine.warmup``), and a shared
pool is its default (``EngineConfig.share_graph_pool``).
"""
import json
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
from emonet.bench import real_face_crops
from emonet.checkpoints import load_model
from emonet.engine import PRESETS, Engine
from dataclasses import replace
from emonet.runtime import RuntimeConfig, configure

variant = sys.argv[1] if len(sys.argv) > 1 else "shared"
preset = sys.argv[2] if len(sys.argv) > 2 else "fast"
sizes = (1, 8, 32, 128, 256, 512)
dev = configure(RuntimeConfig(device="cuda", cudnn_benchmark=True))
engine = Engine(load_model("random", device="cpu"), dev,
                replace(PRESETS[preset], batch_sizes=sizes, share_graph_pool=variant == "shared"), log=lambda m: None)
crop = real_face_crops(1).to(dev)
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats(dev)
for _ in range(50):
    engine(crop)
torch.cuda.synchronize()
peak, held = torch.cuda.max_memory_allocated(dev) / 2**20, torch.cuda.memory_reserved(dev) / 2**20

x = real_face_crops(512).to(dev)
results = [(n, engine(x[:n])) for n in (512, 1, 256, 5, 128, 300, 32, 8, 1, 512)]  # kept, then checked
max_diff = 0.0
with torch.inference_mode():
    for n, got in results:
        batch = min(b for b in sizes if b >= n)
        padded = torch.cat([x[:n], x[n - 1:n].expand(batch - n, -1, -1, -1)])
        ref = engine._run_eager(padded)
        for key, value in got.items():
            max_diff = max(max_diff, float((value - ref[key][:n]).abs().max()))
print(json.dumps({"variant": variant, "preset": preset, "batch_sizes": sizes, "peak_mem_b1_mb": round(peak),
                  "held_mem_mb": round(held), "max_diff_vs_no_graph": max_diff}), flush=True)
