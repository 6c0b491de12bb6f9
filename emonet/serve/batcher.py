"""One dynamic batcher for every request and stream: images from all clients go through the GPU together.

One thread owns the pipeline (detector and engine). It takes the images waiting, up to ``max_batch`` (those
that came while the last batch ran), waiting at most ``max_delay`` seconds after the first for more to come
(default: none); detects them in one call, gives each
stream's faces their stable ids and smoothing (:class:`StreamState`, one per connection), and runs every
face's crop through the engine in one batch. Each image's faces come back on its own future.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..pipeline import HOLD_MARGIN, PlannedFace, Pipeline, Smoother
from ..results import FaceResult
from ..tracking import Tracker

BatchHook = Callable[[int, int, float], None]  # (images, faces, seconds) of each batch run


@dataclass
class StreamState:
    """One stream's tracking and smoothing (its faces keep their ids, and their smoothing, from frame to frame)."""

    smooth: bool = True
    tracker: Tracker = field(default_factory=Tracker)
    frames: int = 0


@dataclass
class _Job:
    image: np.ndarray
    state: Optional[StreamState]
    future: Future


class Batcher:
    """``submit(image, state)`` from any thread: a future of the image's faces (:class:`FaceResult` list)."""

    def __init__(self, pipeline: Pipeline, max_batch: int = 32, max_delay: float = 0.0,
                 on_batch: Optional[BatchHook] = None) -> None:
        self.pipeline = pipeline
        self.max_batch, self.max_delay = max_batch, max_delay
        self._jobs: "queue.Queue[Optional[_Job]]" = queue.Queue()
        self._on_batch = on_batch
        self._thread = threading.Thread(target=self._run, name="emonet-batcher", daemon=True)
        self._thread.start()

    def submit(self, image: np.ndarray, state: Optional[StreamState] = None) -> Future:
        """Queue one RGB ``(H, W, 3)`` uint8 image (a stream's next frame, with its ``state``)."""
        future: Future = Future()
        self._jobs.put(_Job(image, state, future))
        return future

    def close(self) -> None:
        """Finish the images queued, then stop."""
        self._jobs.put(None)
        self._thread.join()

    def _take(self) -> Optional[list[_Job]]:
        first = self._jobs.get()
        if first is None:
            return None
        jobs = [first]
        deadline = time.perf_counter() + self.max_delay
        while len(jobs) < self.max_batch:
            wait = deadline - time.perf_counter()
            try:
                job = self._jobs.get(timeout=wait) if wait > 0 else self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:  # closing: run what is in hand, then stop
                self._jobs.put(None)
                break
            jobs.append(job)
        return jobs

    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if not jobs:
                continue
            t0 = time.perf_counter()
            try:
                results = self._analyse(jobs)
            except Exception:  # noqa: BLE001 - one image's failure is its own: each is tried alone
                results = []
                for job in jobs:
                    try:
                        results.append(self._analyse([job])[0])
                    except Exception as exc:  # noqa: BLE001 - its client hears of it; the server goes on
                        job.future.set_exception(exc)
                        results.append(None)
            faces = 0
            for job, found in zip(jobs, results):
                if found is not None:
                    job.future.set_result(found)
                    faces += len(found)
            if self._on_batch is not None:
                self._on_batch(len(jobs), faces, time.perf_counter() - t0)

    def _analyse(self, jobs: list[_Job]) -> list[list[FaceResult]]:
        pipeline, detector = self.pipeline, self.pipeline.detector
        images = [j.image for j in jobs]
        # As in video (HOLD_MARGIN): a face a stream follows is held down to a margin under the detector's
        # threshold, while a new face, and every face of a lone image, needs the threshold itself.
        threshold = getattr(detector, "min_score", None)
        streams = threshold is not None and any(j.state is not None for j in jobs)
        detections = detector.collect(detector.launch(images), min_score=threshold - HOLD_MARGIN if streams else None)
        planned: list[PlannedFace] = []
        smoothers: list[Optional[Smoother]] = []
        for i, (job, found) in enumerate(zip(jobs, detections)):
            state = job.state
            if state is None:
                if streams:
                    found = found[found[:, 4] >= threshold]
                faces = pipeline.plan([job.image], [found])
                planned += [PlannedFace(i, 0, f.face_id, f.box, f.score, True, f.matrix) for f in faces]
                smoothers += [None] * len(faces)
                continue
            frame = state.frames
            state.frames += 1
            found = found[:pipeline.max_faces] if pipeline.max_faces else found
            tracks = state.tracker.update(found, frame, start_score=threshold or 0.0)
            # The detections the tracker took, each with its track: those of the faces it follows, and new ones
            # at the threshold.
            taken = [(d, t) for d in found for t in tracks if t.det_frame == frame and np.array_equal(t.det_box, d[:4])]
            faces = pipeline.plan([job.image], [np.asarray([d for d, _ in taken]).reshape(-1, 5)])
            for f, (_, track) in zip(faces, taken):
                planned.append(PlannedFace(i, frame, track.id, f.box, f.score, True, f.matrix))
                smoothers.append(track.smoother if state.smooth else None)
        results = pipeline.collect(pipeline.launch(images, planned), smoothers)
        per_image: list[list[FaceResult]] = [[] for _ in jobs]
        for face, result in zip(planned, results):
            per_image[face.image].append(result)
        return per_image
