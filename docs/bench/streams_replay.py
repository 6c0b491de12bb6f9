"""Graph-replay latency at batch 1: whole-model compiled graph against side streams, normal and high-priority capture.

Usage (on a GPU, from the repository root): python docs/bench/streams_replay.py CACHE_DIR LABEL
Output of the third session on an H100: docs/bench/h100-streams-replay.txt
"""
import sys

import torch
from emonet.checkpoints import load_model
from emonet.engine import Engine, EngineConfig
from emonet.runtime import RuntimeConfig, configure
dev = configure(RuntimeConfig(device="cuda:0"))
cache = sys.argv[1]
eng = Engine(load_model("random", device="cpu"), dev,
             EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="default", streams=1,
                          cuda_graphs=False, batch_sizes=(1,), cache_dir=cache), log=print)
x = eng._prepare(torch.zeros(1, 3, 256, 256, dtype=torch.uint8, device=dev))
def capture(fn, prio):
    s = torch.cuda.Stream(dev, priority=prio)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.inference_mode():
        for _ in range(3): fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s), torch.inference_mode():
        out = fn(x)
    return g, out
def bench(g, n=300):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2]
variants = {"whole": capture(eng._forward, 0), "streamed": capture(eng._streamed, 0),
            "streamed-hiprio": capture(eng._streamed, -1), "whole-hiprio": capture(eng._forward, -1)}
res = {k: [] for k in variants}
for r in range(5):
    for k, (g, _) in variants.items():
        res[k].append(bench(g))
for k, v in res.items():
    print(f"{sys.argv[2]} {k}: b1 median per round (ms) " + " ".join(f"{t:.3f}" for t in v))
o1, o2 = variants["whole"][1], variants["streamed-hiprio"][1]
print("max diff valence", float((o1["valence"] - o2["valence"]).abs().max()))
