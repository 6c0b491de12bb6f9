"""The service's GPU loops behind one object: :class:`LoopPool`, spoken to as one :class:`LoopProcess` is.

A live loop's host work (each session's tracking, planning and results, the networks' launches, the answers as
JSON) runs in one thread, and a loop waits at each of its steps' syncs for the GPU: at a few dozen streams one loop
alone sets the pace, with the GPU half idle. Several loops share the sessions, each the same runtime
(:class:`~emonet.video.live.LiveLoop`) on the same device with the same engine, so a session gives the same numbers
in any of them. By default they are threads of one process (:class:`LoopProcess`), whose one CUDA context runs
their kernels side by side; ``processes`` spreads them over processes of their own (each with its own CUDA
context: on one GPU they take turns at it). A session lives wholly in one loop (its tracker and smoother with it),
the loop with the fewest sessions open when it opens, of those still running.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from itertools import count
from typing import Optional, Union

import numpy as np

from ..build import ModelOptions
from ..errors import InputError
from ..video.live import LiveConfig, StepHook
from .loop_process import LoopProcess


# What a loop reports that decides a face's numbers, or what it takes: the same in every loop of a pool.
BUILD = ("engine", "precision", "device", "weights", "detector", "jpeg_decoder")


class LoopPool:
    """``loops`` live loops on one device, threads of ``processes`` :class:`LoopProcess` es started side by side
    (the loops as evenly spread as they go); the model is loaded and warmed in each loop before the constructor
    returns. The same calls as :class:`LoopProcess`."""

    def __init__(self, options: ModelOptions, live: LiveConfig = LiveConfig(), gpu_decode: bool = True,
                 on_step: Optional[StepHook] = None, loops: int = 1, processes: int = 1) -> None:
        """Raises what :meth:`LoopProcess.wait_ready` raises where any process cannot start, and
        :class:`~emonet.errors.InputError` where the loops built different engines; every process is ended first."""
        if loops < 1:
            raise ValueError(f"a pool needs at least one loop, not {loops}")
        if not 1 <= processes <= loops:
            raise ValueError(f"a pool of {loops} loops runs in 1 to {loops} processes, not {processes}")
        self.processes: list[LoopProcess] = []
        # Each loop as (its process, its number there).
        self._where = [(k % processes, k // processes) for k in range(loops)]
        try:
            for k in range(processes):  # every process started, then each waited for: they load side by side
                self.processes.append(LoopProcess(options, live, gpu_decode=gpu_decode, on_step=on_step,
                                                  quiet=k > 0, wait=False,
                                                  loops=sum(1 for p, _ in self._where if p == k)))
            for process in self.processes:
                process.wait_ready()
            first = self.processes[0].about
            differ = [f"{key} {first.get(key)} and {process.about.get(key)}" for process in self.processes[1:]
                      for key in BUILD if process.about.get(key) != first.get(key)]
            if differ:
                engines = {str(process.about.get("engine")) for process in self.processes}
                # One process compiled its engine and another could not (each says why where it is not quiet).
                hint = " or start it with --no-compile" if any("compile" in e for e in engines) else ""
                raise InputError(f"the GPU loops started differently ({differ[0]}), so a face would get other "
                                 f"numbers in each: run one loop (--loops 1){hint}")
        except BaseException:  # a process that cannot start, or Ctrl-C: none is left running
            for process in self.processes:
                process.close_now()
            raise
        self.about: dict = {**self.processes[0].about, "loops": loops, "processes": processes}
        self._sessions: dict[int, tuple[int, int]] = {}  # session -> (its loop, its process's own number for it)
        self._open = [0] * loops  # sessions open in each loop
        self._lock = threading.Lock()
        self._ids = count()

    @property
    def loops(self) -> int:
        """How many loops the pool runs."""
        return len(self._where)

    @property
    def on_step(self) -> Optional[StepHook]:
        """Each step's figures, from every loop (called in the processes' listener threads)."""
        return self.processes[0].on_step

    @on_step.setter
    def on_step(self, hook: Optional[StepHook]) -> None:
        for process in self.processes:
            process.on_step = hook

    def _alive(self, loop: int) -> bool:
        return self.processes[self._where[loop][0]].alive

    @property
    def running(self) -> int:
        """How many loops still take frames (a loop stops with its process)."""
        return sum(self._alive(k) for k in range(self.loops))

    @property
    def alive(self) -> bool:
        """Whether every loop still takes frames (one that ended is said by :attr:`failure`)."""
        return self.running == self.loops

    @property
    def failure(self) -> Optional[str]:
        """Why a loop's process ended, where one ended unasked."""
        return next((process.failure for process in self.processes if process.failure is not None), None)

    @property
    def sessions(self) -> list[int]:
        """Sessions open in each loop."""
        with self._lock:
            return list(self._open)

    def open(self, one_shot: bool = False) -> int:
        """A new session in the loop with the fewest open, of those still running (see :meth:`LoopProcess.open`):
        its number."""
        with self._lock:
            running = [k for k in range(self.loops) if self._alive(k)] or range(self.loops)
            k = min(running, key=self._open.__getitem__)
            self._open[k] += 1
            session = next(self._ids)
            process, lane = self._where[k]
            self._sessions[session] = (k, self.processes[process].open(one_shot, loop=lane))
        return session

    def submit(self, session: int, payload: Union[np.ndarray, bytes], index: Optional[int] = None,
               timestamp: Optional[float] = None) -> Future:
        """Queue the session's next frame in its loop (see :meth:`LoopProcess.submit`)."""
        k, own = self._sessions[session]
        return self.processes[self._where[k][0]].submit(own, payload, index, timestamp)

    def close_session(self, session: int) -> None:
        """The client has gone (see :meth:`LoopProcess.close_session`)."""
        with self._lock:
            entry = self._sessions.pop(session, None)
            if entry is not None:
                self._open[entry[0]] -= 1
        if entry is not None:
            self.processes[self._where[entry[0]][0]].close_session(entry[1])

    def close(self) -> None:
        """Answer every frame submitted, then stop every loop and its process (side by side)."""
        threads = [threading.Thread(target=process.close, name="emonet-loop-close") for process in self.processes[1:]]
        for thread in threads:
            thread.start()
        self.processes[0].close()
        for thread in threads:
            thread.join()
