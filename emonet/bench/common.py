"""What the benchmarks share: the start-up floor of a fresh process, the environment of a report, number
formats, and showing a report and saving it whole."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from typing import Optional

from ..io.atomic import write_text


def startup_floor(device: str) -> dict:
    """What any fresh process pays before EmoNet can start: Python with ``import torch``, and the CUDA context.

    Measured in a child that imports nothing of emonet, so "start to first result" can be read against it.
    """
    code = ("import json, sys, time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
            "d = torch.device(sys.argv[1]); torch.zeros(1, device=d); "
            "torch.cuda.synchronize(d) if d.type == 'cuda' else None; t2 = time.perf_counter(); "
            "print(json.dumps({'import_torch_s': t1 - t0, 'device_init_s': t2 - t1}))")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, device], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": wall}


def environment(device: str) -> dict:
    """Device and software versions for the report."""
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "platform": platform.platform(),
           "cpu_count": os.cpu_count(), "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def fmt(v: Optional[float], spec: str = ".2f", none: str = "–") -> str:
    """``v`` formatted by ``spec``, or ``none`` where there is no value."""
    return none if v is None else format(v, spec)


def fmt_rate(v: Optional[float]) -> str:
    """A throughput: whole units from 100 on, a decimal under (a slow CPU mode is not shown as 0)."""
    return fmt(v, ",.0f" if v is not None and v >= 100 else ".1f")


def save(path: Optional[str], content: str) -> None:
    """Write ``content`` to ``path`` whole or not at all (a temporary name, then a rename)."""
    if path:
        write_text(path, content)


def show_report(text: str, markdown: Optional[str]) -> None:
    """Print a Markdown report, and save it to ``markdown`` where one is named."""
    print(text)
    save(markdown, text + "\n")

