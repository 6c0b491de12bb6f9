"""The video tool behind ``demo_video.py``: stream frames, track faces, batch them through EmoNet, write results.

Frames come from a decoding process in chunks of ``--batch-size``. In a chunk, the detector runs (batched)
on the detection frames (every ``--detect-every`` frames, or when no face is tracked); on the others each
face is cropped from its last landmarks, by the training convention. Every face of every frame of the
chunk then goes through the engine in one call. With ``--batch-size 1`` the crops between detections come
from the previous frame's landmarks exactly; with larger batches, from the last frame of the previous
chunk (a trade of crop freshness for GPU batching).

The loop is software-pipelined on a GPU: a chunk's detection (on a stream of its own) runs while the
previous chunk's EmoNet results, which come back in one asynchronous copy, are read and written; only
then is the chunk tracked and cropped, so the result is the same as one chunk after the other.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from tqdm import tqdm

from .checkpoints import UNTRAINED_LABEL
from .cli import build_detector, build_engine
from .drawing import PALETTE, annotate, side_panel
from .geometry import apply, crop_frames, crop_to_image, warp_crops
from .images import InputError, check_writable_dir
from .pipeline import Face, Pipeline
from .runtime import select_device
from .timing import LatencyTimer
from .tracking import Track, Tracker
from .video import Frame, VideoReader, VideoWriter

STAGES = ("decode", "detect", "crop", "emonet", "results", "draw", "encode")


@dataclass
class _Pending:
    """A chunk whose EmoNet results are on their way back from the GPU."""

    chunk: list[Frame]
    plan: list[list[tuple[Track, np.ndarray, bool]]]  # per frame: (track, crop matrix, detected)
    results: Optional[torch.Tensor] = None  # per face: logits, valence, arousal, landmarks (pinned on a GPU)
    done: Optional["torch.cuda.Event"] = None  # recorded after the copy into ``results``


class RowWriter:
    """Per-face-per-frame rows to CSV and/or JSONL, flushed as they go, renamed into place on close."""

    def __init__(self, csv_path: Optional[str], jsonl_path: Optional[str], class_names, landmarks: bool) -> None:
        self.class_names = list(class_names)
        self.landmarks = landmarks
        self.files = []
        self.fields = ["frame", "timestamp", "face_id", "detected", "score", "x1", "y1", "x2", "y2", "expression",
                       *[f"p_{c}" for c in self.class_names], "valence", "arousal"]
        if landmarks:
            # Not "x1", "y1", ...: those name the box's corners.
            self.fields += [f"lm{i}_{axis}" for i in range(68) for axis in ("x", "y")]
        self.csv = self.jsonl = None
        if csv_path:
            fh = self._open(csv_path)
            self.csv = csv.writer(fh)
            self.csv.writerow(self.fields)
        if jsonl_path:
            self.jsonl = self._open(jsonl_path)

    def _open(self, path: str):
        final = Path(path)
        tmp = final.with_name(f".{final.name}.partial")
        fh = open(tmp, "w", newline="", encoding="utf-8")
        self.files.append((fh, tmp, final))
        return fh

    def frame(self, frame: Frame, faces: list[tuple[Track, Face, bool]]) -> None:
        """Rows of one frame; a frame with no face gets one row with empty values."""
        if not faces:
            self._write({"frame": frame.index, "timestamp": round(frame.timestamp, 4)})
        for track, face, detected in faces:
            values = [frame.index, round(frame.timestamp, 4), track.id, int(detected), round(face.score, 4),
                      *np.round(face.box, 2).tolist(), self.class_names[face.expression],
                      *np.round(face.probabilities, 5).tolist(), round(face.valence, 5), round(face.arousal, 5)]
            if self.landmarks:
                values += np.round(face.landmarks, 2).ravel().tolist()  # lm0_x, lm0_y, lm1_x, ...
            self._write(dict(zip(self.fields, values)))

    def _write(self, row: dict) -> None:
        if self.csv:
            self.csv.writerow([row.get(f, "") for f in self.fields])
        if self.jsonl:
            self.jsonl.write(json.dumps({f: row.get(f) for f in self.fields}) + "\n")

    def flush(self) -> None:
        """Push finished rows to disk, so an interruption keeps them."""
        for fh, _, _ in self.files:
            fh.flush()

    def close(self, keep: bool = True) -> None:
        """Finish the files and rename them into place (``keep=False``: delete them instead)."""
        for fh, tmp, final in self.files:
            fh.close()
            if keep:
                os.replace(tmp, final)
            else:
                tmp.unlink(missing_ok=True)
        self.files = []


class _Stage:
    """A worker thread fed through a bounded queue, in order; its error is raised in the producer."""

    def __init__(self, name: str, handle, size: int) -> None:
        self.handle = handle
        self.queue: "queue.Queue" = queue.Queue(maxsize=size)
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def put(self, item) -> None:
        """Hand over one item (blocks while the queue is full, which keeps memory flat)."""
        if self.error is not None:
            raise InputError(f"writing the annotated video failed: {self.error}")
        self.queue.put(item)

    def _loop(self) -> None:
        try:
            while (item := self.queue.get()) is not None:
                self.handle(item)
        except BaseException as exc:
            self.error = exc
            while self.queue.get() is not None:  # keep the producer from blocking
                pass

    def finish(self) -> None:
        """Handle everything queued, then stop."""
        self.queue.put(None)
        self.thread.join()


def _chunks(frames, size: int):
    chunk = []
    for frame in frames:
        chunk.append(frame)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _color(track_id: int):
    return PALETTE[(track_id + 1) % len(PALETTE)]


class VideoJob:
    """State of one run: engine, detector, tracker, outputs and the time spent in each stage."""

    def __init__(self, args: argparse.Namespace, reader: VideoReader) -> None:
        self.args = args
        self.reader = reader
        buckets = sorted({1, 4, 16, 64, args.batch_size, 4 * args.batch_size})
        self.engine = build_engine(args, batch_sizes=tuple(b for b in buckets if b <= 4 * args.batch_size))
        self.detector = build_detector(args, self.engine)
        self.tracker = Tracker()
        self.names = self.engine.class_names
        self.rows = RowWriter(args.csv, args.jsonl, self.names, args.landmarks)
        self.writer: Optional[VideoWriter] = None
        # Drawing and encoding each run in a thread of their own (OpenCV releases the GIL), overlapping
        # each other and the next chunk's detection and EmoNet; bounded queues keep memory flat and order.
        # Drawing is the slower of the two, so it gets a pool: frames are drawn in parallel and the
        # encoder takes them in order (it waits on each frame's future).
        self._draw = self._encode = None
        if args.output and not args.no_video:
            self.draw_threads = max(1, min(4, (os.cpu_count() or 2) // 4))
            self._draw = ThreadPoolExecutor(self.draw_threads, thread_name_prefix="emonet-draw")
            self._encode = _Stage("emonet-encode", self._encode_one, 2 * args.batch_size + 2 * self.draw_threads)
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._seconds_lock = threading.Lock()
        self.timer = LatencyTimer(self.engine.device)
        self.frames = self.faces = 0
        self.need_detection = True
        self.since_detection = 0
        # The detector gets a stream of its own: a chunk's detection then runs beside, and waits for
        # nothing of, the previous chunk's EmoNet work; high priority, so its few small kernels get the
        # SMs as EmoNet's blocks finish instead of queueing behind all of them.
        gpu = self.engine.device.type == "cuda"
        self.det_stream = torch.cuda.Stream(self.engine.device, priority=-1) if gpu else None
        self.banner = f"EmoNet: {UNTRAINED_LABEL}" if self.engine.untrained else None

    def _sync(self) -> None:
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)

    def _launch_detector(self, frames: list[Frame]):
        """Queue the detector on ``frames``; on a GPU on its own stream, so it waits for nothing queued before."""
        if self.det_stream is None:
            return self.detector.launch([f.image for f in frames])
        with torch.cuda.stream(self.det_stream):
            return self.detector.launch([f.on_device(self.engine.device, self.det_stream) for f in frames])

    def detect(self, chunk: list[Frame]) -> tuple[list[bool], object]:
        """Which frames of the chunk run the detector (every ``--detect-every``, or when no face is tracked);
        their detection is queued (``launch`` collects it).

        Needs nothing from the previous chunk's results, so it runs while that chunk's are read.
        """
        t0 = time.perf_counter()
        flags = []
        for _ in chunk:
            is_det = self.need_detection or self.since_detection >= self.args.detect_every - 1
            flags.append(is_det)
            self.since_detection = 0 if is_det else self.since_detection + 1
            self.need_detection = False
        picked = [f for f, d in zip(chunk, flags) if d]
        handle = self._launch_detector(picked) if picked else None
        self.seconds["detect"] += time.perf_counter() - t0
        return flags, handle

    def launch(self, chunk: list[Frame], flags: list[bool], handle) -> _Pending:
        """Track, crop and queue EmoNet for one chunk; the results are copied back without waiting for them."""
        args = self.args
        t0 = time.perf_counter()
        boxes = self.detector.collect(handle) if handle is not None else []
        if self.need_detection:  # the previous chunk lost a face after this one's detection was planned
            if not flags[0]:
                flags[0] = True
                boxes.insert(0, self.detector.collect(self._launch_detector(chunk[:1]))[0])
            self.need_detection = False
        det_iter = iter(boxes)
        t1 = time.perf_counter()
        self.seconds["detect"] += t1 - t0

        plan = []  # per frame: [(track, matrix, detected)]
        for frame, is_det in zip(chunk, flags):
            if is_det:
                dets = next(det_iter)
                if args.max_faces:
                    dets = dets[: args.max_faces]
                tracks = self.tracker.update(dets)
                entries = [(t, self.detector.crop_matrix(t.box, frame.shape), True) for t in tracks]
            else:
                # From the last landmarks, or, where the detector saw the face later (earlier in
                # this chunk), from its box: whichever is newer.
                entries = [(t, m if (m := t.crop_matrix()) is not None
                            else self.detector.crop_matrix(t.box, frame.shape), False)
                           for t in self.tracker.active]
            plan.append(entries)
        wanted = [(i, m) for i, entries in enumerate(plan) for _, m, _ in entries]
        batch = None
        if wanted:
            if self.det_stream is not None:  # uploaded once (by the reader), shared by detector and crops
                stream = torch.cuda.current_stream(self.engine.device)
                pixels = [f.on_device(self.engine.device, stream) for f in chunk]
            else:
                pixels = [f.image for f in chunk]
            batch = crop_frames(pixels, wanted, self.engine.device)
        t2 = time.perf_counter()
        self.seconds["crop"] += t2 - t1

        pending = _Pending(chunk, plan)
        if batch is not None:
            with self.timer.measure(len(chunk)):
                out = self.engine(batch)
            # Every result leaves the GPU in one copy (landmarks decoded there); queued, not waited for.
            results = torch.cat([out["expression"], out["valence"][:, None], out["arousal"][:, None],
                                 out["landmarks"].flatten(1)], dim=1)
            if self.det_stream is not None:
                pending.results = torch.empty(results.shape, dtype=results.dtype, pin_memory=True)
                pending.results.copy_(results, non_blocking=True)
                pending.done = torch.cuda.Event()
                pending.done.record()
            else:
                pending.results = results
        self.seconds["emonet"] += time.perf_counter() - t2
        return pending

    def finish(self, pending: _Pending) -> None:
        """Wait for a chunk's results; smooth, write and draw every frame of it."""
        args = self.args
        t0 = time.perf_counter()
        n = len(self.names)
        if pending.done is not None:
            pending.done.synchronize()
        if pending.results is not None:
            results = pending.results.numpy()
            matrices = [m for entries in pending.plan for _, m, _ in entries]
            landmarks = crop_to_image(matrices, results[:, n + 2:].reshape(len(results), -1, 2))
        t1 = time.perf_counter()
        self.seconds["emonet"] += t1 - t0

        k = 0
        for frame, entries in zip(pending.chunk, pending.plan):
            faces = []
            for track, matrix, detected in entries:
                raw = results[k, :n + 2]  # logits, valence, arousal
                smooth = track.smoother(raw) if args.smooth else raw
                probs = np.exp(smooth[:n] - smooth[:n].max())
                probs /= probs.sum()
                lm = landmarks[k]
                track.set_landmarks(lm)
                h, w = frame.shape[:2]
                x1, y1, x2, y2 = track.box if detected else np.concatenate((lm.min(0), lm.max(0)))
                if not detected:
                    track.box = np.array([x1, y1, x2, y2])
                if x2 < 0 or y2 < 0 or x1 > w or y1 > h or (x2 - x1) < 8:
                    self.need_detection = True  # the face left the frame or collapsed: look again
                face = Face(box=np.array([x1, y1, x2, y2], dtype=np.float64), score=track.score,
                            expression=int(probs.argmax()), probabilities=probs,
                            valence=min(1.0, max(-1.0, float(smooth[n]))),
                            arousal=min(1.0, max(-1.0, float(smooth[n + 1]))),
                            landmarks=lm, matrix=matrix, raw=raw)
                track.trail.append((face.valence, face.arousal))
                faces.append((track, face, detected))
                k += 1
            if not entries:
                self.need_detection = True
            self.rows.frame(frame, faces)
            self.faces += len(faces)
            self.frames += 1
            frame.pixels = frame.ready = None  # drawing needs only the host copy: free the GPU one now
            self._draw_and_encode(frame, faces)
        self.rows.flush()
        self.seconds["results"] += time.perf_counter() - t1

    def _draw_and_encode(self, frame: Frame, faces) -> None:
        if self._draw is None:
            return
        snapshot = [(t.id, f, d, list(t.trail)) for t, f, d in faces]  # the tracks move on; the frame must not
        self._encode.put(self._draw.submit(self._draw_one, frame, snapshot))

    def _add_seconds(self, stage: str, seconds: float) -> None:
        with self._seconds_lock:  # several drawing threads add up
            self.seconds[stage] += seconds

    def _draw_one(self, frame: Frame, faces) -> np.ndarray:
        t0 = time.perf_counter()
        image = annotate(frame.image, [f for _, f, _, _ in faces], self.names, self.banner,
                         labels=[f"#{tid}" for tid, _, _, _ in faces])
        crop = crop_lm = None
        caption = "no face"
        if faces:
            tid, face, _, _ = max(faces, key=lambda item: (item[1].box[2] - item[1].box[0]))
            crop = warp_crops(frame.image, [face.matrix])[0]
            crop_lm = apply(face.matrix, face.landmarks)
            caption = f"#{tid} {self.names[face.expression]} {face.probabilities[face.expression]:.2f}"
        panel = side_panel(image.shape[0], crop, crop_lm,
                           [(f"#{tid}", _color(tid), f.valence, f.arousal, trail) for tid, f, _, trail in faces],
                           caption)
        composed = np.concatenate([image, panel], axis=1)
        self._add_seconds("draw", time.perf_counter() - t0)
        return composed

    def _encode_one(self, drawn: Future) -> None:
        composed = drawn.result()  # a drawing error surfaces here, and so in the producer
        t0 = time.perf_counter()
        if self.writer is None:
            self.writer = VideoWriter(self.args.output, self.reader.fps, (composed.shape[1], composed.shape[0]))
        self.writer.write(composed)
        self._add_seconds("encode", time.perf_counter() - t0)

    def close(self) -> Optional[Path]:
        """Finish every output; returns the video's path if one was written. No frame: nothing is kept."""
        if self._encode is not None:  # every queued frame is finished, so it is drawn, encoded and kept
            self._encode.finish()
            self._draw.shutdown()
        self.rows.close(keep=self.frames > 0)
        video = self.writer.close() if self.writer else None
        failed = self._encode.error if self._encode is not None else None
        if failed is not None:  # after the files are finished: what was written is kept
            raise InputError(f"writing the annotated video failed: {failed}")
        return video


def _raise_interrupt(signum, frame):  # SIGTERM ends a run like Ctrl-C: outputs are finished, not lost
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """``demo_video.py``: process the video; 0 when done (or interrupted cleanly), 2 on bad input."""
    for path in (args.output if not args.no_video else None, args.csv, args.jsonl):
        if path:
            check_writable_dir(Path(path).parent if str(Path(path).parent) else Path("."))
    if args.output and not args.no_video and Path(args.output).suffix.lower() not in (".mp4", ".avi", ".mov", ".m4v"):
        raise InputError(f"{args.output}: the annotated video needs a .mp4, .avi, .mov or .m4v name")
    reader = VideoReader(args.video, start=args.start, end=args.end, max_frames=args.max_frames,
                         device=select_device(args.device, quiet=True),
                         keep_host=bool(args.output and not args.no_video))  # only drawing needs it
    job = None
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    # With the networks on a GPU, this process's CPU tensor work (the detector's box decoding) is small;
    # torch's default of a thread per core only competes with FFmpeg's decoding threads for the CPU.
    threads = torch.get_num_threads()
    if reader.device is not None:
        torch.set_num_threads(min(4, threads))
    wall0 = time.perf_counter()
    try:
        job = VideoJob(args, reader)
        height, width, _ = reader.frame_shape
        shape = (height or 720, width or 1280, 3)  # cameras may not say
        Pipeline(job.engine, job.detector).warmup(shape)
        wall0 = time.perf_counter()  # model loading and warm-up are reported on their own
        bar = tqdm(total=reader.expected_frames, unit="frame", file=sys.stderr, dynamic_ncols=True)
        # Software-pipelined: chunk n's detection is queued, chunk n - 1's EmoNet results are read while it
        # runs (their landmarks place chunk n's crops), then chunk n is tracked, cropped and queued.
        pending = None
        for chunk in _chunks(reader, args.batch_size):
            flags, boxes = job.detect(chunk)
            if pending is not None:
                job.finish(pending)
                bar.update(len(pending.chunk))
                bar.set_postfix(faces=job.faces, refresh=False)
            pending = job.launch(chunk, flags, boxes)
        if pending is not None:
            job.finish(pending)
            bar.update(len(pending.chunk))
        bar.close()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        torch.set_num_threads(threads)
        reader.close()
        video = job.close() if job else None
    wall = time.perf_counter() - wall0
    if job is None or job.frames == 0:
        if interrupted:
            print("interrupted before the first frame", file=sys.stderr)
            return 130
        raise InputError(f"{args.video}: no frame could be read (empty, corrupt, or a codec OpenCV cannot decode)")
    job._sync()
    _summary(job, reader, wall, video, interrupted)
    return 130 if interrupted else 0


def _summary(job: VideoJob, reader: VideoReader, wall: float, video: Optional[Path], interrupted: bool) -> None:
    err = sys.stderr
    job.seconds["decode"] = reader.decode_seconds
    print(f"\n{'interrupted: ' if interrupted else ''}{job.frames} frames, {job.faces} faces, "
          f"{job.frames / max(wall, 1e-9):.1f} frames/s end to end ({wall:.2f} s)", file=err)
    per = ", ".join(f"{k} {1e3 * v / max(job.frames, 1):.2f}" for k, v in job.seconds.items())
    drawing = f" ({job.draw_threads} drawing threads: their time adds up)" if job._draw is not None else ""
    print(f"time per frame by stage (ms; decode runs in a process of its own, draw and encode in threads, "
          f"beside detect, crop, EmoNet and results{drawing}): {per}", file=err)
    if job.writer and job.writer.resized:
        print("note: the video changed frame size; frames were resized to the first frame's size", file=err)
    for path, what in ((video, "annotated video"), (job.args.csv, "CSV"), (job.args.jsonl, "JSONL")):
        if path:
            print(f"{what}: {path}", file=err)
    print(job.timer.summary().format(f"EmoNet per batch (up to {job.args.batch_size} frames)", "frame"), file=err)
    if job.engine.untrained:
        print(f"note: {UNTRAINED_LABEL}", file=err)
