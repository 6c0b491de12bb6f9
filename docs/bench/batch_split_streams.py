"""Does splitting a large batch over concurrent CUDA streams (inside one graph) raise throughput?

python docs/bench/batch_split_streams.py BATCH   -> one JSON line per variant: whole, split2, split4, split2-prio, ...
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
from replay_rounds import round_rates  # docs/bench, beside this script

batch = int(sys.argv[1])
dev = configure(RuntimeConfig(device="cuda", cudnn_benchmark=True))
t = time.perf_counter()
engine = Engine(load_model("random", device="cpu"), dev,
                EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="default",
                             cuda_graphs=False, batch_sizes=(batch,), precompile=False,
                             cache_dir="/tmp/cc-split"), log=lambda m: None)
print("warm-up", round(time.perf_counter() - t, 1), "s", flush=True)
x = torch.randint(0, 256, (batch, 3, 256, 256), dtype=torch.uint8, device=dev)
fwd = engine._forward


def capture(parts, priorities):
    chunks = x.chunk(parts)
    streams = [torch.cuda.Stream(dev, priority=p) for p in priorities]
    main = torch.cuda.Stream(dev, priority=-1)

    def run():
        outs = []
        for s, c in zip(streams, chunks):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs.append(fwd(c))
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    with torch.cuda.stream(main), torch.inference_mode():
        for _ in range(2):
            ref = run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=main), torch.inference_mode():
        out = run()
    return g, out, ref


base = None
for name, parts, prios in [("whole", 1, [0]), ("split2", 2, [0, 0]), ("split2-prio", 2, [-1, 0]),
                           ("split4", 4, [0, 0, 0, 0]), ("split4-prio", 4, [-1, -1, 0, 0]),
                           ("whole-again", 1, [0])]:
    g, out, ref = capture(parts, prios)
    g.replay()
    torch.cuda.synchronize()
    if base is None:
        base = out.clone()
    same = float((out - base).abs().max())
    rs = round_rates(g.replay, batch)
    print(json.dumps({"variant": name, "batch": batch, "median": round(rs[2]), "runs": [round(r) for r in rs],
                      "max_diff_vs_whole": same}), flush=True)
    del g
