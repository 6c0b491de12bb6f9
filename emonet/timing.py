"""Honest latency: CUDA events on the GPU, perf_counter on the CPU; the first call kept apart.

GPU work is asynchronous, so a host clock read right after a launch measures the launch, not the work.
On CUDA each timed region is bracketed by events and the host synchronises only when the numbers are
read. The first call is reported on its own: it pays one-off costs the steady state does not.
"""
from __future__ import annotations

import contextlib
import copy
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from .cli import plural
from torch import nn

FIRST_CALL_NOTE = ("the first call pays one-off costs: cuDNN autotuning for each new input shape "
                   "(with cudnn.benchmark on), lazy CUDA/cuDNN start-up and kernel loading, and "
                   "the caching allocator's first allocations")
FIRST_CALL_NOTE_CPU = ("the first call pays one-off costs: oneDNN kernel selection and the first "
                       "memory allocations")


# Calls after the first that a steady state is figured from: one or two are a sample, not a state.
STEADY_CALLS = 3


@dataclass
class LatencySummary:
    """First-call latency against steady-state statistics, in milliseconds; throughput in items/s."""

    first_ms: Optional[float]
    median_ms: Optional[float]
    p90_ms: Optional[float]
    mean_ms: Optional[float]
    throughput: Optional[float]
    calls: int
    items: int
    device: str

    def as_dict(self) -> dict:
        """Plain dict, for JSON reports."""
        return asdict(self)

    def format(self, what: str = "EmoNet forward", unit: str = "crop") -> str:
        """A short human-readable report, a sentence on the first call included."""
        if self.first_ms is None:
            return f"{what}: not timed"
        lines = [f"{what} latency on {self.device}:",
                 f"  first call      {self.first_ms:9.2f} ms   "
                 f"({FIRST_CALL_NOTE if self.device.startswith('cuda') else FIRST_CALL_NOTE_CPU})"]
        if self.median_ms is None:
            after = self.calls - 1
            lines.append("  steady state    only one call was made; no steady-state figure" if not after else
                         f"  steady state    {plural(after, 'call')} after the first: too few for a steady-state "
                         f"figure ({STEADY_CALLS} or more)")
        else:
            lines.append(f"  steady state    {self.median_ms:9.2f} ms median, {self.p90_ms:.2f} ms p90, "
                         f"{self.mean_ms:.2f} ms mean over {plural(self.calls - 1, 'call')}")
            lines.append(f"  throughput      {self.throughput:9.1f} {unit}s/s (steady state)")
        return "\n".join(lines)


class LatencyTimer:
    """Times regions of device work; ``with timer.measure(n_items): model(x)``."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._pending: list[tuple[object, object, int]] = []  # CUDA event pairs not read yet
        self._ms: list[float] = []
        self._items: list[int] = []

    @contextlib.contextmanager
    def measure(self, n_items: int = 1) -> Iterator[None]:
        """Time the enclosed device work; ``n_items`` is how many crops (frames, ...) it processed."""
        if self._cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(self.device))
            yield
            end.record(torch.cuda.current_stream(self.device))
            self._pending.append((start, end, n_items))
        else:
            t0 = time.perf_counter()
            yield
            self._ms.append((time.perf_counter() - t0) * 1e3)
            self._items.append(n_items)

    def record(self, ms: float, n_items: int = 1) -> None:
        """Add a region timed by the caller: host clocks around work whose results the host already holds."""
        self._collect()  # in order: regions measured before it come first
        self._ms.append(ms)
        self._items.append(n_items)

    def _collect(self) -> None:
        for start, end, n in self._pending:
            end.synchronize()  # the only host wait: reading an event needs its work finished
            self._ms.append(start.elapsed_time(end))
            self._items.append(n)
        self._pending.clear()

    @property
    def times_ms(self) -> list[float]:
        """All measured times in order, first call included."""
        self._collect()
        return list(self._ms)

    def summary(self) -> LatencySummary:
        """First call apart; median, p90, mean and throughput over the rest."""
        self._collect()
        name = str(self.device)
        if not self._ms:
            return LatencySummary(None, None, None, None, None, 0, 0, name)
        steady, items = self._ms[1:], self._items[1:]
        if len(steady) < STEADY_CALLS:
            return LatencySummary(self._ms[0], None, None, None, None, len(self._ms), sum(self._items), name)
        return LatencySummary(
            first_ms=self._ms[0],
            median_ms=statistics.median(steady),
            p90_ms=float(np.percentile(steady, 90)),
            mean_ms=statistics.fmean(steady),
            throughput=sum(items) / (sum(steady) / 1e3),
            calls=len(self._ms),
            items=sum(self._items),
            device=name,
        )


def process_age() -> Optional[float]:
    """Seconds since this process started, interpreter start-up included (Linux ``/proc``); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in brackets, may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: start time in ticks
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Where the time from process start to the first result went: ``mark(stage)`` at the end of each stage.

    Created once the tool's imports are done; on Linux its origin is the process's start (so the Python
    start-up and imports are the first stage), elsewhere the moment it was created.
    """

    def __init__(self) -> None:
        age = process_age()
        self.from_process = age is not None
        self._origin = time.perf_counter() - (age or 0.0)
        self.stages: list[tuple[str, float]] = []  # (stage, seconds since the origin at its end)
        if self.from_process:
            self.stages.append(("Python start-up and imports", age))

    def mark(self, stage: str) -> None:
        """End ``stage`` now (a stage already marked is not marked again)."""
        if all(name != stage for name, _ in self.stages):
            self.stages.append((stage, time.perf_counter() - self._origin))

    @property
    def total(self) -> float:
        """Seconds from the origin to the last mark."""
        return self.stages[-1][1] if self.stages else 0.0

    def as_dict(self) -> dict:
        """``{"first_result_s": ..., "from": "process start" | "tool start", "stages_s": {stage: seconds}}``."""
        stages, previous = {}, 0.0
        for name, end in self.stages:
            stages[name], previous = round(end - previous, 4), end
        return {"first_result_s": round(self.total, 4),
                "from": "process start" if self.from_process else "tool start", "stages_s": stages}

    def format(self, what: str = "first result") -> str:
        """'first result 2.41 s after the process started: Python start-up and imports 1.02 s, ...'."""
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.as_dict()["stages_s"].items())
        origin = "the process started" if self.from_process else "the tool started"
        return f"{what} {self.total:.2f} s after {origin}: {parts}"


def time_calls(fn: Callable[[], object], device: torch.device | str, calls: int, n_items: int = 1,
               warmup: int = 0) -> LatencySummary:
    """``fn()`` run ``warmup`` times untimed, then ``calls`` times timed; the first timed call is kept apart."""
    for _ in range(warmup):
        fn()
    timer = LatencyTimer(device)
    for _ in range(calls):
        with timer.measure(n_items):
            fn()
    return timer.summary()


@dataclass
class ModelCost:
    """Parameters and floating-point operations of one forward pass per crop."""

    parameters: int
    flops_per_crop: int

    def format(self) -> str:
        """'13.96 M parameters, 33.9 GFLOP per crop'."""
        return (f"{self.parameters / 1e6:.2f} M parameters, "
                f"{self.flops_per_crop / 1e9:.1f} GFLOP per crop (multiply-add = 2)")


def model_cost(model: nn.Module, input_size: int = 256) -> ModelCost:
    """Count parameters and FLOPs per crop with ``torch.utils.flop_counter`` on a meta-device copy."""
    from torch.utils.flop_counter import FlopCounterMode

    params = sum(p.numel() for p in model.parameters())
    # A meta copy costs no memory or compute: FLOP counting only needs shapes.
    meta = copy.deepcopy(model).to("meta").float().eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        meta(torch.empty(1, 3, input_size, input_size, device="meta"))
    return ModelCost(params, int(counter.get_total_flops()))
