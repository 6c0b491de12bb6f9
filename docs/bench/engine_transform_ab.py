"""A/B (seventh session): the compiled engine with and without one of its exact model transforms.

    python docs/bench/engine_transform_ab.py fold_stack_tails   # 1x1 convolutions composed
    python docs/bench/engine_transform_ab.py pad_stem_input     # a fourth, zero input channel
    python docs/bench/engine_transform_ab.py pointwise_max_pools
    python docs/bench/engine_transform_ab.py coordinate_descent_tuning  # an option compile_options sets
    python docs/bench/engine_transform_ab.py heatmaps   # an EngineConfig switch: "on" is True

Builds four engines in one process: the whole-model graph at batch 256 (``compile-graph``) and the
streamed graph at batch 1 (``compile-streams-graph``, the photo tool's), each with the transform ("on")
and with it replaced by the identity ("off"); every other transform stays as the engine has it. Then
measures them interleaved, twice, so drift of the machine shows, and checks each against fp32 eager on
32 real face crops. (The first runs, ``docs/bench/h100-tailfold.txt``, were made before
``pad_stem_input`` existed, as ``docs/bench/stack_tail_fold_ab.py``: this script with ``fold_stack_tails``.)
"""
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import emonet.engine as engine_module  # noqa: E402
from emonet.bench import real_face_crops  # noqa: E402
from emonet.checkpoints import load_model  # noqa: E402
from emonet.engine import Engine, EngineConfig, compare  # noqa: E402
from emonet.runtime import RuntimeConfig, configure  # noqa: E402
from emonet.timing import time_calls  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "fold_stack_tails"
dev = configure(RuntimeConfig(device="cuda", cudnn_benchmark=True))
net = load_model("random", device="cpu")
field = name in {f.name for f in dataclasses.fields(EngineConfig)}
transform = None if field else getattr(engine_module, name, None)
options = engine_module.compile_options
engines = {}
for fold in ("off", "on"):
    if transform is not None:
        setattr(engine_module, name, transform if fold == "on" else (lambda m, inplace=False: m))
    elif not field:  # an Inductor option that compile_options sets: forced off, or left as it is
        engine_module.compile_options = (options if fold == "on" else
                                         lambda config, device, piece="model": {**options(config, device, piece), name: False})
    for batch, streams in ((256, 0), (1, 8)):
        torch._dynamo.reset()
        config = EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="default",
                              streams=streams, cuda_graphs=True, batch_sizes=(batch,), precompile=False,
                              cache_dir=f"/tmp/{name}-{fold}", **({name: fold == "on"} if field else {}))
        engines[(fold, batch)] = Engine(net, dev, config, log=lambda m: None)
        print(f"built {fold} batch {batch}: warm-up {engines[(fold, batch)].warmup_ms / 1e3:.1f} s", flush=True)
if transform is not None:
    setattr(engine_module, name, transform)

crops = {b: real_face_crops(b).to(dev) for b in (1, 256)}
for rep in range(2):
    for batch in (256, 1):
        for fold in ("off", "on"):
            engine, x = engines[(fold, batch)], crops[batch]
            s = time_calls(lambda: engine(x), dev, 31 if batch > 1 else 501, n_items=batch, warmup=3)
            print(f"round {rep + 1} batch {batch:>3} {name} {fold:3s}: {s.median_ms:7.3f} ms median, "
                  f"{s.p90_ms:7.3f} p90, {s.throughput:8.1f} crops/s", flush=True)
reference = net.to(dev)
for (fold, batch), engine in engines.items():
    print(f"{name} {fold} batch {batch}: {compare(engine, reference, real_face_crops(32).to(dev)).format()}")
