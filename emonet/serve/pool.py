"""Several GPU loops behind one service: :class:`LoopPool`, spoken to as one :class:`LoopProcess` is.

A live loop's host work (each session's tracking, planning and results, the networks' launches, the answers as
JSON) runs in one interpreter, and at a few dozen streams that interpreter, not the GPU, sets the pace: its
steps grow, and so does every frame's wait. Loops in processes of their own share the host work out over more
cores; each runs the same runtime (:class:`~emonet.video.live.LiveLoop`) on the same device with the same
engine, so a session gives the same numbers in any of them. A session lives wholly in one loop (its tracker and
smoother with it), the loop with the fewest sessions open when it opens, of those still running.
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
    """``loops`` :class:`LoopProcess` es on one device, started side by side; the model is loaded and warmed in
    each before the constructor returns. The same calls as :class:`LoopProcess`."""

    def __init__(self, options: ModelOptions, live: LiveConfig = LiveConfig(), gpu_decode: bool = True,
                 on_step: Optional[StepHook] = None, loops: int = 1) -> None:
        """Raises what :meth:`LoopProcess.wait_ready` raises where any loop cannot start, and
        :class:`~emonet.errors.InputError` where the loops built different engines; every loop is ended first."""
        if loops < 1:
            raise ValueError(f"a pool needs at least one loop, not {loops}")
        self.loops: list[LoopProcess] = []
        try:
            for k in range(loops):  # every process started, then each waited for: they load side by side
                self.loops.append(LoopProcess(options, live, gpu_decode=gpu_decode, on_step=on_step, quiet=k > 0,
                                              wait=False))
            for loop in self.loops:
                loop.wait_ready()
            differ = [f"{key} {self.loops[0].about.get(key)} and {loop.about.get(key)}" for loop in self.loops[1:]
                      for key in BUILD if loop.about.get(key) != self.loops[0].about.get(key)]
            if differ:
                engines = {str(loop.about.get("engine")) for loop in self.loops}
                # One loop compiled its engine and another could not (each says why where it is not quiet).
                hint = " or start it with --no-compile" if any("compile" in e for e in engines) else ""
                raise InputError(f"the analysis loops started differently ({differ[0]}), so a face would get other "
                                 f"numbers in each: run one loop (--loops 1){hint}")
        except BaseException:  # a loop that cannot start, or Ctrl-C: none is left running
            for loop in self.loops:
                loop.close_now()
            raise
        self.about: dict = {**self.loops[0].about, "loops": loops}
        self._sessions: dict[int, tuple[int, int]] = {}  # session -> (its loop, the loop's own number for it)
        self._open = [0] * loops  # sessions open in each loop
        self._lock = threading.Lock()
        self._ids = count()

    @property
    def on_step(self) -> Optional[StepHook]:
        """Each step's figures, from every loop (called in their listener threads)."""
        return self.loops[0].on_step

    @on_step.setter
    def on_step(self, hook: Optional[StepHook]) -> None:
        for loop in self.loops:
            loop.on_step = hook

    @property
    def running(self) -> int:
        """How many loops still take frames."""
        return sum(loop.alive for loop in self.loops)

    @property
    def alive(self) -> bool:
        """Whether every loop still takes frames (one that ended is said by :attr:`failure`)."""
        return self.running == len(self.loops)

    @property
    def failure(self) -> Optional[str]:
        """Why a loop's process ended, where one ended unasked."""
        return next((loop.failure for loop in self.loops if loop.failure is not None), None)

    @property
    def sessions(self) -> list[int]:
        """Sessions open in each loop."""
        with self._lock:
            return list(self._open)

    def open(self, one_shot: bool = False) -> int:
        """A new session in the loop with the fewest open, of those still running (see :meth:`LoopProcess.open`):
        its number."""
        with self._lock:
            running = [k for k, loop in enumerate(self.loops) if loop.alive] or range(len(self.loops))
            k = min(running, key=self._open.__getitem__)
            self._open[k] += 1
            session = next(self._ids)
            self._sessions[session] = (k, self.loops[k].open(one_shot))
        return session

    def submit(self, session: int, payload: Union[np.ndarray, bytes], index: Optional[int] = None,
               timestamp: Optional[float] = None) -> Future:
        """Queue the session's next frame in its loop (see :meth:`LoopProcess.submit`)."""
        k, own = self._sessions[session]
        return self.loops[k].submit(own, payload, index, timestamp)

    def close_session(self, session: int) -> None:
        """The client has gone (see :meth:`LoopProcess.close_session`)."""
        with self._lock:
            entry = self._sessions.pop(session, None)
            if entry is not None:
                self._open[entry[0]] -= 1
        if entry is not None:
            self.loops[entry[0]].close_session(entry[1])

    def close(self) -> None:
        """Answer every frame submitted, then stop every loop and its process (side by side)."""
        threads = [threading.Thread(target=loop.close, name="emonet-loop-close") for loop in self.loops[1:]]
        for thread in threads:
            thread.start()
        self.loops[0].close()
        for thread in threads:
            thread.join()

