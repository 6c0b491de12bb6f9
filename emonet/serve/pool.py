"""Several GPU loops behind one service: :class:`LoopPool`, spoken to as one :class:`LoopProcess` is.

A live loop's host work (each session's tracking, planning and results, the networks' launches, the answers as
JSON) runs in one interpreter, and at a few dozen streams that interpreter, not the GPU, sets the pace: its
steps grow, and so does every frame's wait. Loops in processes of their own share the host work out over more
cores; each runs the same runtime (:class:`~emonet.video.live.LiveLoop`) on the same device with the same
engine, so a session gives the same numbers in any of them. A session lives wholly in one loop (its tracker and
smoother with it), the loop with the fewest sessions open when it opens.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from itertools import count
from typing import Callable, Optional, Union

import numpy as np

from ..build import ModelOptions
from ..video.live import LiveConfig, StepHook
from .loop_process import LoopProcess


class LoopPool:
    """``loops`` :class:`LoopProcess` es on one device, started side by side; the model is loaded and warmed in
    each before the constructor returns. The same calls as :class:`LoopProcess`."""

    def __init__(self, options: ModelOptions, live: LiveConfig = LiveConfig(), gpu_decode: bool = True,
                 on_step: Optional[StepHook] = None, loops: int = 1,
                 start: Callable[..., LoopProcess] = LoopProcess) -> None:
        """Raises what :class:`LoopProcess` raises where any loop cannot start (the others are closed first)."""
        if loops < 1:
            raise ValueError(f"a pool needs at least one loop, not {loops}")
        started: list = [None] * loops

        def start_one(k: int) -> None:
            try:
                started[k] = start(options, live, gpu_decode=gpu_decode, on_step=on_step, quiet=k > 0)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                started[k] = exc

        threads = [threading.Thread(target=start_one, args=(k,), name=f"emonet-loop-start-{k}", daemon=True)
                   for k in range(1, loops)]
        for thread in threads:
            thread.start()
        start_one(0)
        for thread in threads:
            thread.join()
        failed = next((item for item in started if isinstance(item, BaseException)), None)
        if failed is not None:
            for item in started:
                if isinstance(item, LoopProcess):
                    item.close()
            raise failed
        self.loops: list[LoopProcess] = started
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
    def alive(self) -> bool:
        """Whether every loop still takes frames (one that ended is said by :attr:`failure`)."""
        return all(loop.alive for loop in self.loops)

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
