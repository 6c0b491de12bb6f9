"""The kernels of one engine mode at one batch size (``python -m emonet.bench --profile MODE:BATCH``)."""
from __future__ import annotations

from .engines import MODES


def profile(mode_name: str, batch: int, device: str, weights: str = "random", steps: int = 20) -> str:
    """Kernel count per forward and the top CUDA kernels of one mode at one batch size (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    from ..models.weights import load_model
    from ..engine import Engine, EngineConfig, real_face_crops
    from ..engine.graphs import synchronize
    from ..runtime import RuntimeConfig, configure

    mode = next(m for m in MODES if m.name == mode_name)
    dev = configure(RuntimeConfig(device=device, cudnn_benchmark=mode.cudnn_benchmark,
                                  deterministic=mode.deterministic))
    engine = Engine(load_model(weights, device="cpu"), dev,
                    EngineConfig(**mode.engine, batch_sizes=(batch,)), log=lambda m: None)
    x = real_face_crops(batch).to(dev)
    for _ in range(3):
        engine(x)
    synchronize(dev)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine(x)
        synchronize(dev)
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    launches = sum(e.count for e in kernels) / steps
    total = sum(e.device_time_total for e in kernels) / steps
    rows = sorted(kernels, key=lambda e: e.device_time_total, reverse=True)[:12]
    lines = [f"{mode_name} at batch {batch}: {launches:.0f} kernels per forward, {total / 1e3:.3f} ms of "
             f"GPU time per forward", "", "| kernel | calls/forward | ms/forward | share |", "|---|---|---|---|"]
    for e in rows:
        name = e.key.replace("|", "/")[:90]
        lines.append(f"| `{name}` | {e.count / steps:.0f} | {e.device_time_total / steps / 1e3:.3f} | "
                     f"{e.device_time_total / max(total * steps, 1e-9):.0%} |")
    return "\n".join(lines)
