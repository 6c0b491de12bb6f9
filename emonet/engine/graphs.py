"""CUDA graphs of a network, one per input shape, captured without making anyone wait.

:class:`Graphs` captures a graph the first time a shape is asked for, or ahead of time in a thread of its own
(:meth:`Graphs.prepare`): until a shape's graph is ready its callers run the same network eagerly — the same
kernels in the same order (cuDNN's heuristic choice, no autotuning), so the numbers do not change when the
graph is swapped in — and the first results never wait for capture.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Hashable, Optional, Sequence

import torch

# capture(key, stream, error_mode) -> (graph, static input, static outputs): two runs on ``stream`` first
# (lazy kernel loading and workspace allocation happen there, outside the capture), then the capture.
Capture = Callable[[Hashable, "torch.cuda.Stream", str], tuple]

# Two captures begun at once in two threads (the engine's graphs and the detector's, say) collide in torch's
# bookkeeping of graph memory pools: one capture at a time in the process, whichever thread and network.
_ONE_CAPTURE = threading.Lock()


def synchronize(device: torch.device) -> None:
    """``torch.cuda.synchronize(device)``, but never while a graph is being captured in the background: a
    device-wide wait then is an error (it would wait for the capturing stream) that ends the process. It waits
    for the capture under way, a few milliseconds, first."""
    with _ONE_CAPTURE:
        torch.cuda.synchronize(device)


def capture_graph(run: Callable[[], object], stream: "torch.cuda.Stream", error_mode: str = "global",
                  pool=None) -> tuple:
    """``(graph, outputs)``: ``run()`` twice on ``stream``, then captured into a CUDA graph there.

    ``error_mode`` ``"thread_local"`` lets other threads use the GPU meanwhile (a capture in the background)."""
    device_stream = torch.cuda.current_stream(stream.device)
    stream.wait_stream(device_stream)
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(2):
            run()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with _ONE_CAPTURE:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=error_mode), torch.inference_mode():
            outputs = run()
    stream.synchronize()
    return graph, outputs


class Graphs:
    """A network's CUDA graphs by key (an input shape), captured by ``capture``: :meth:`get` one (captured now,
    unless it is being prepared: then None, and the caller runs eagerly), :meth:`prepare` some in the
    background."""

    def __init__(self, device: torch.device, capture: Capture) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda": the current one (a thread needs its index)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._capture = capture
        self._ready: dict = {}
        self._pending: set = set()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None  # a background capture failed: eager from then on
        self._stream: Optional[torch.cuda.Stream] = None
        self.ready_s: Optional[float] = None  # seconds from prepare() until its last graph was ready
        self._lock = threading.Lock()
        self._queue: list = []  # keys to capture in the background, in order

    @property
    def stream(self) -> "torch.cuda.Stream":
        """The stream every graph is captured on (high priority: the critical path gets the SMs first). One
        for all: cuBLAS keeps a workspace per stream it runs on."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device, priority=-1)
        return self._stream

    def get(self, key: Hashable, later: bool = False) -> Optional[tuple]:
        """The graph of ``key``; None while it is being prepared in the background (run eagerly meanwhile).
        ``later``: a key not asked for before is captured in the background too (None now), not at once."""
        with self._lock:  # (pending first: the worker readies, then un-pends)
            if key in self._pending or self.error is not None:
                return self._ready.get(key)
            found = self._ready.get(key)
            if found is not None:
                return found
        if later:
            self.prepare([key])
            return None
        self.wait()  # one capture at a time: the background's first
        if key not in self._ready:
            self._ready[key] = self._capture(key, self.stream, "global")
        return self._ready[key]

    def prepare(self, keys: Sequence[Hashable]) -> None:
        """Capture the graphs of ``keys`` (in that order) in a thread of its own, each used once ready; keys
        asked for while it runs join its queue."""
        with self._lock:
            keys = [k for k in keys if k not in self._ready and k not in self._pending]
            if not keys or self.error is not None:
                return
            self._pending.update(keys)
            self._queue.extend(keys)
            if self._thread is not None:  # the running worker takes them
                return
            halted = threading.Event()
            # Not a daemon, even when started from one (the video tool loads its model in a daemon thread):
            # a process that ends (a short job) waits for the capture under way rather than tearing CUDA down
            # beneath it, which aborts the process; and it stops before the next one.
            self._thread = threading.Thread(target=self._work, args=(halted, time.perf_counter()),
                                            name="emonet-graphs", daemon=False)
            self.stream  # made by the caller's thread, before the worker uses it
            self._thread.start()  # under the lock: wait() never finds a thread not yet started
            register = getattr(threading, "_register_atexit", None)  # runs before the interpreter joins threads
            if register is not None:
                try:
                    register(halted.set)
                except RuntimeError:  # the interpreter is already shutting down: nothing to stop later
                    pass

    def _work(self, halted: threading.Event, t0: float) -> None:
        try:
            torch.cuda.set_device(self.device)
            while not halted.is_set():
                with self._lock:
                    if not self._queue:
                        self._thread = None  # a later prepare() starts another worker
                        self.ready_s = time.perf_counter() - t0
                        return
                    key = self._queue.pop(0)
                graph = self._capture(key, self.stream, "thread_local")
                with self._lock:
                    self._ready[key] = graph
                    self._pending.discard(key)
        except BaseException as exc:  # the callers go on eagerly (the same numbers), and are told
            with self._lock:
                self.error = exc
                self._pending.clear()
                self._queue.clear()
                self._thread = None

    @property
    def preparing(self) -> bool:
        """Graphs are still being captured in the background."""
        return bool(self._pending)

    def wait(self) -> None:
        """Until the background captures, if any, have finished."""
        while True:
            with self._lock:
                thread = self._thread
            if thread is None:
                return
            thread.join()
            with self._lock:
                if self._thread is thread:  # halted before its queue was done
                    self._thread = None
