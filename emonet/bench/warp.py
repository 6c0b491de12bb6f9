"""Cutting face crops: OpenCV on the CPU against grid_sample on the device (``python -m emonet.bench --warp``)."""
from __future__ import annotations

import time


def warp_benchmark(device: str, repeats: int = 50) -> str:
    """Median ms to cut 1, 4 and 16 face crops from a 720p frame (uint8 in host memory, crops on the device)."""
    import statistics
    import cv2
    import torch
    from ..engine.graphs import synchronize
    from ..engine.check import SAMPLE_PHOTO
    from ..geometry import box_to_matrix, to_tensor, warp_crops, warp_crops_torch

    dev = torch.device(device)
    sync = (lambda: synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    frame = cv2.resize(cv2.imread(str(SAMPLE_PHOTO)),
                       (1280, 720))
    lines = [f"Crops from a 1280x720 frame on {device} (median of {repeats}; both include the copy to the device)",
             "", "| faces | OpenCV warpAffine (ms) | grid_sample on device (ms) | max |diff| (levels) |",
             "|---|---|---|---|"]
    for n in (1, 4, 16):
        mats = [box_to_matrix([300 + 40 * i, 200, 420 + 40 * i, 340]) for i in range(n)]
        def opencv():
            return to_tensor(warp_crops(frame, mats)).to(dev)
        def device_warp():
            return warp_crops_torch(torch.from_numpy(frame).to(dev).permute(2, 0, 1), mats)
        times = {}
        for name, fn in (("cv", opencv), ("torch", device_warp)):
            fn(), sync()
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = fn()
                sync()
                samples.append((time.perf_counter() - t0) * 1e3)
            times[name] = (statistics.median(samples), out)
        diff = int((times["cv"][1].int() - times["torch"][1].int()).abs().max())
        lines.append(f"| {n} | {times['cv'][0]:.3f} | {times['torch'][0]:.3f} | {diff} |")
    return "\n".join(lines)
