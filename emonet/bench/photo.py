"""One photo, process start to exit, in fresh processes: the released demo's way against the photo tool's
(``python -m emonet.bench --photo``)."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from .common import startup_floor


# The released demo's way for images, in one process: load the checkpoint, cudnn.benchmark on, eager fp32,
# each image resized whole to 256x256 and run alone.
RELEASED_PHOTO = """
import sys, cv2, torch
from emonet.models import EmoNet
checkpoint, device, paths = sys.argv[1], torch.device(sys.argv[2]), sys.argv[3:]
torch.backends.cudnn.benchmark = True
state = torch.load(checkpoint, map_location="cpu", weights_only=True)
net = EmoNet(8)
net.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
net = net.to(device).eval()
for path in paths:
    image = cv2.cvtColor(cv2.resize(cv2.imread(path), (256, 256)), cv2.COLOR_BGR2RGB)
    x = torch.from_numpy(image).permute(2, 0, 1).float().div(255).unsqueeze(0).to(device)
    with torch.no_grad():
        out = net(x)
    print(path, int(out["expression"].argmax()), float(out["valence"].cpu()))
"""


def photo_benchmark(photo: Optional[str], device: str, repeat: int = 2, crops: int = 149) -> str:
    """One photo, and ``crops`` tight face crops, from process start to exit: the released demo's way
    against the photo tool's ways, fresh processes alternating, ``repeat`` rounds, and the floor of a
    process that only imports torch and touches the device."""
    import re
    import statistics
    import cv2
    import torch
    from ..engine.check import SAMPLE_PHOTO, real_face_crops
    from ..models.weights import load_model

    with tempfile.TemporaryDirectory(prefix="emonet-photo-") as tmp:
        tmp = Path(tmp)
        checkpoint = tmp / "emonet_8.pth"  # the same random weights for every way, in the released format
        torch.save({f"module.{k}": v for k, v in load_model("random").state_dict().items()}, checkpoint)
        image = str(Path(photo) if photo else SAMPLE_PHOTO)
        folder = tmp / "crops"
        folder.mkdir()
        for k, crop in enumerate(real_face_crops(crops).permute(0, 2, 3, 1).numpy()):
            cv2.imwrite(str(folder / f"crop{k:03d}.jpg"), cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
        crop_paths = sorted(map(str, folder.glob("*.jpg")))
        tool = [sys.executable, "-m", "emonet.apps.photo", "--weights", str(checkpoint), "--device", device]
        released = [sys.executable, "-c", RELEASED_PHOTO, str(checkpoint), device]
        ways = [("the released demo's way (load, cudnn.benchmark, eager fp32, one forward)", released + [image]),
                ("demo.py --detector none", tool + ["--image", image, "--detector", "none"]),
                ("demo.py (YuNet, the default)", tool + ["--image", image]),
                ("demo.py --engine eager", tool + ["--image", image, "--engine", "eager"]),
                (f"{crops} tight crops: the released way, one process", released + crop_paths),
                (f"{crops} tight crops: demo.py --detector none", tool + ["--image", str(folder), "--detector", "none"]),
                ("a process that only imports torch and touches the device", None)]
        times: dict[str, list[float]] = {name: [] for name, _ in ways}
        first: dict[str, list[str]] = {name: [] for name, _ in ways}
        failed: dict[str, str] = {}  # a way's last failure: its exit status and last line of output
        for _ in range(repeat):
            for name, cmd in ways:  # alternating: each round runs every way once
                if cmd is None:
                    floor = startup_floor(device)
                    times[name].append(floor.get("process_s", float("nan")))
                    continue
                t = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
                times[name].append(time.perf_counter() - t if proc.returncode == 0 else float("nan"))
                if proc.returncode != 0:
                    said = (proc.stderr.strip() or proc.stdout.strip() or "(no output)").splitlines()[-1]
                    failed[name] = f"exit {proc.returncode}: {said}"
                line = re.search(r"first result .*", proc.stderr)
                if line:
                    first[name].append(line.group(0))
    floor_s = statistics.median(times[ways[-1][0]])
    lines = [f"Photo: {image}; device {device}; {repeat} rounds, fresh processes, alternating", "",
             "| one photo, process start to exit | " + " | ".join(f"run {k + 1}" for k in range(repeat))
             + " | median | vs floor |", "|---|" + "---|" * (repeat + 2)]
    for name, _ in ways:
        if name in failed:  # no median of a way with a failed run
            lines.append(f"| {name} | " + " | ".join("failed" if t != t else f"{t:.2f} s" for t in times[name])
                         + " | failed | — |")
            continue
        mid = statistics.median(times[name])
        lines.append(f"| {name} | " + " | ".join(f"{t:.2f} s" for t in times[name])
                     + f" | {mid:.2f} s | {mid / floor_s:.2f}× |")
    lines.append("")
    lines += [f"- {name} failed ({why})" for name, why in failed.items()]
    for name, _ in ways:
        lines += [f"- {name}, run {k + 1}: {text}" for k, text in enumerate(first[name])]
    return "\n".join(lines)
