"""Eighth session: does ``torch._addmm_activation`` (emonet.models.emonet.Conv1x1ReLU) take cuBLASLt's
bias + ReLU epilogue at the stack end's shape, and what does it cost against conv + ReLU?

    python docs/bench/addmm_relu_check.py [BATCH]

Times both (CUDA events, median of 200 after warm-up) and prints the kernels each launches.
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from emonet.models.emonet import Conv1x1ReLU  # noqa: E402
from emonet.timing import time_calls  # noqa: E402

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 256
dev = torch.device("cuda")
torch.backends.cudnn.benchmark = True
x = torch.randn(batch, 256, 64, 64, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
conv = torch.nn.Conv2d(256, 256, 1).to(dev, torch.float16).to(memory_format=torch.channels_last)
fused = Conv1x1ReLU(conv.weight.detach(), conv.bias.detach()).to(dev)
with torch.no_grad():
    ref, out = F.relu(conv(x)), fused(x)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"batch {batch}: relative difference {err:.2e}, output channels_last: "
          f"{out.is_contiguous(memory_format=torch.channels_last)}")
    for name, fn in (("conv + relu", lambda: F.relu(conv(x))), ("Conv1x1ReLU", lambda: fused(x))):
        s = time_calls(fn, dev, 200, warmup=20)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [f"{e.key[:90]} ({e.device_time_total / 1e3:.3f} ms)" for e in prof.key_averages()
                   if e.device_type.name == "CUDA"]
        print(f"{name:12s}: {s.median_ms:.3f} ms median; kernels: {'; '.join(kernels)}")
