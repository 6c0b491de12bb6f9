"""Does an AOTInductor package load on this machine's torch? (Eleventh session.)

    python docs/bench/aoti_check.py small|emonet build|load DIR

``build`` exports a model with a dynamic batch and packages it (``torch._inductor.aoti_compile_and_package``)
into DIR; ``load``, in a fresh process, loads it (``torch._inductor.aoti_load_package``), runs batch 1 and
4 and compares with the eager model. ``small`` is a two-convolution network; ``emonet`` goes through the
engine (``EngineConfig(compile="aot")``, which needs EMONET_ALLOW_AOT_CUDA=1 on CUDA). Prints one line; a
crash shows as the process's exit status (-11: segmentation fault), so run each step in its own process.
"""
import faulthandler
import os
import sys
import time

import torch
from torch import nn

faulthandler.enable()
if len(sys.argv) != 4 or sys.argv[1] not in ("small", "emonet") or sys.argv[2] not in ("build", "load"):
    sys.exit("usage: python docs/bench/aoti_check.py small|emonet build|load DIR")
which, step, folder = sys.argv[1:]
os.makedirs(folder, exist_ok=True)
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
t0 = time.perf_counter()
if which == "small":
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 8, 3, padding=1)).eval().to(dev, torch.float16)
    path = os.path.join(folder, "small.pt2")
    x = torch.randn(4, 3, 32, 32, device=dev, dtype=torch.float16)
    if step == "build":
        with torch.no_grad():
            exported = torch.export.export(net, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
            torch._inductor.aoti_compile_and_package(exported, package_path=path)
        print(f"small: built {os.path.getsize(path)} bytes in {time.perf_counter() - t0:.1f} s", flush=True)
    else:
        package = torch._inductor.aoti_load_package(path)
        print(f"small: loaded in {time.perf_counter() - t0:.2f} s", flush=True)
        with torch.no_grad():
            for n in (1, 4):
                diff = (package(x[:n]).float() - net(x[:n]).float()).abs().max().item()
                print(f"small: batch {n} max |diff| {diff:.4f}", flush=True)
else:
    sys.path.insert(0, os.getcwd())
    from emonet.bench import real_face_crops
    from emonet.checkpoints import load_model
    from emonet.engine import Engine, EngineConfig, compare
    model = load_model("random", device="cpu")
    config = EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="aot", batch_sizes=(1, 4),
                          cache_dir=folder)
    engine = Engine(model, dev, config, log=lambda m: print(m, flush=True))
    print(f"emonet {step}: engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"emonet {step}: {compare(engine, model.to(dev), real_face_crops(4)).format()}", flush=True)
