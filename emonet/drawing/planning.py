"""The annotated video's marks planned in a small process of its own, beside the process that analyses and draws.

Drawn in the analysing process (a video too short to repay a drawing process's start), a chunk's frames cost
that process's thread the plan (:class:`~emonet.drawing.marks.Planner`: Python, NumPy and OpenCV's text, most
of the drawing's host time) and the drawing (torch's operations, queued for the GPU). The plan needs no
torch, so a process that makes it is up in a fraction of a second (NumPy and OpenCV), while the model loads:
:class:`PlanningProcess` sends it each chunk's faces as the chunk is handed over and takes the marks back
by the time the chunk is drawn, one chunk later.

Protocol (:mod:`emonet.io.ipc` messages). Parent to child: ``("open", video, class_names, banner, shape)``,
the ``(H, W)`` of the video's frames, or None to take the first chunk's; ``("plan", video, shapes, faces,
colors)`` as :meth:`Planner.plan` takes them; ``("close", video)``. Child to parent: ``("ready",)`` once it
has planned a throwaway chunk (OpenCV's font loaded); ``("marks", video, marks, seconds)`` per chunk, in order;
``("error", video, message)`` when a chunk could not be planned (its video's later chunks are not planned).
"""
from __future__ import annotations

import sys
import time
from collections import deque
from typing import Optional, Sequence

from ..io import ipc
from ..io.helper import PIPE_BYTES, HelperClient, start_helper

FAST_EXIT = True  # its messages are sent and flushed when its input ends: no tear-down to wait for


def warm_faces(shape: tuple[int, int]) -> tuple[list, list]:
    """A throwaway chunk of two frames of ``shape`` = (H, W), for :meth:`Planner.plan`: one face a third of
    the frame high, with a trail, then no face (the paths of a first drawing)."""
    import numpy as np

    from ..results import FaceResult
    from .opencv import PALETTE

    h, w = shape
    side = max(16, h // 3)  # a face a third of the frame high, the crop of its box 256 x 256
    x0, y0, scale = (w - side) / 2, (h - side) / 2, 256 / side
    face = FaceResult(0, 0, np.array([x0, y0, x0 + side, y0 + side]), 0.9, True, 1, np.full(8, 1 / 8), 0.5, -0.5,
                      np.full((68, 2), h / 2), np.array([[scale, 0.0, -x0 * scale], [0.0, scale, -y0 * scale]]))
    return [[(face, [(0.4, -0.4), (0.5, -0.5)])], []], [[PALETTE[0]], []]


def main() -> int:
    """The planning process: ready once it has planned a throwaway chunk, then each chunk as it comes, until its
    input ends."""
    from .marks import Planner

    out = sys.stdout.buffer
    faces, colors = warm_faces((240, 320))
    Planner([f"class {k}" for k in range(8)]).plan([(240, 320)] * 2, faces, colors)
    ipc.send(out, ("ready",))
    planners: dict[int, Optional[Planner]] = {}  # None: a video whose plan failed
    for message in ipc.messages(sys.stdin.buffer):
        kind, video = message[0], message[1]
        if kind == "open":
            planners[video] = Planner(message[2], banner=bool(message[3]), shape=message[4])
        elif kind == "plan" and planners.get(video) is not None:
            t0 = time.perf_counter()
            try:
                marks = planners[video].plan(*message[2:])
            except Exception as exc:  # noqa: BLE001 - the parent plans it again itself, where it is seen
                planners[video] = None
                ipc.send(out, ("error", video, f"{type(exc).__name__}: {exc}"))
                continue
            ipc.send(out, ("marks", video, marks, time.perf_counter() - t0))
        elif kind == "close":
            planners.pop(video, None)
    return 0


class PlanningProcess:
    """The planning process, as the process that draws sees it: ``open()`` a video, ``plan()`` its chunks in order,
    ``take()`` their marks in the same order; ``close()`` at the end. It starts at once; until it is
    :attr:`ready`, or once it has failed, the caller plans itself (:meth:`take` says so with None)."""

    def __init__(self) -> None:
        self._ready = False
        self._marks: dict[int, deque] = {}  # per open video: (marks, seconds) come, not yet taken
        self._failed: set[int] = set()      # open videos whose plan failed there
        # Quiet: a failure here is no failure of the video (its chunks are planned by the caller instead).
        self._helper = HelperClient("planning", start_helper(f"{__name__}:main", quiet=True, pipe_bytes=PIPE_BYTES),
                                    {"ready": self._on_ready, "marks": self._on_marks, "error": self._on_error},
                                    thread="emonet-planning")
        self._state = self._helper.state
        self._helper.start()

    def _on_ready(self) -> None:
        self._ready = True

    def _on_marks(self, video: int, marks, seconds: float) -> None:
        if video in self._marks:  # (a video closed meanwhile takes no more)
            self._marks[video].append((marks, seconds))

    def _on_error(self, video: int, message: str) -> None:
        if video in self._marks:
            self._failed.add(video)

    @property
    def ready(self) -> bool:
        """Up, and not ended: a chunk sent now is planned there."""
        return self._ready and self._helper.failure is None

    def open(self, video: int, class_names: Sequence[str], banner: bool, shape: Optional[tuple[int, int]]) -> None:
        """Plan ``video``'s chunks from now on there (its frames ``shape`` = (H, W), None: the first chunk's)."""
        with self._state:
            self._marks[video] = deque()
        self._helper.send(("open", video, list(class_names), banner, tuple(shape) if shape else None))

    def plan(self, video: int, shapes: Sequence[tuple[int, int]], faces: Sequence, colors: Sequence) -> None:
        """Plan a chunk (as :meth:`~emonet.drawing.marks.Planner.plan` takes it)."""
        # Pickled now, not in the sender thread: the faces are as they are now, whatever changes them later.
        self._helper.send_framed(ipc.frame(("plan", video, list(shapes), list(faces), list(colors))))

    def take(self, video: int) -> Optional[tuple]:
        """The oldest chunk's ``(marks, seconds planning)`` not yet taken, waiting for it; None if the process
        ended or failed to plan one of the video's chunks (the caller then plans them itself)."""
        with self._state:
            while video in self._marks and not self._marks[video] and video not in self._failed \
                    and not self._helper.ended:
                self._state.wait(timeout=0.5)
            if self._marks.get(video):
                return self._marks[video].popleft()
            return None

    def close_video(self, video: int) -> None:
        """Forget ``video`` (every chunk taken, or given up: marks that come for it later are dropped)."""
        self._helper.send(("close", video))
        with self._state:
            self._marks.pop(video, None)
            self._failed.discard(video)

    def close(self) -> None:
        """End the process."""
        self._helper.close(kill=True)
