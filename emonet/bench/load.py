"""A load generator for ``emonet-serve``: N concurrent WebSocket streams of JPEG frames, each paced by the clock
as a camera sends them (frame i leaves at i / fps, whatever the answers do). Each frame's answer is checked
(in order; answered, said dropped, or never answered) and its round trip kept, from the client's send to its
answer: the latency a user sees. The server's own figure and the step sizes (from ``/metrics``) beside.
:func:`serve_load_table` runs it at several stream counts (``python -m emonet.bench --serve-load URL``)."""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import re
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..cli import plural
from .video import make_clip

# Streams one client process sends, at most: at 30 frames/s of ~46-KB JPEG frames, one asyncio process keeps its
# clock for about this many (past it, frames leave late and answers are read late).
STREAMS_PER_PROCESS = 16


@dataclass
class LoadResult:
    """What N streams saw: frames sent, answered with faces, said dropped, never answered; order kept; round trips
    and the server's latencies (ms) of the frames answered with faces; frames per step."""

    streams: int
    fps: float
    sent: int = 0
    answered: int = 0                                        # with faces (or an error), not dropped
    dropped: int = 0                                         # answered {"dropped": true}
    out_of_order: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)     # read-to-send, as the server reports it
    round_trips: list[float] = field(default_factory=list)   # send to answer, as the client sees it
    firsts: list[float] = field(default_factory=list)        # each stream's first frame answered: its round trip
    refused: int = 0                                         # streams the server refused or closed early
    mean_batch: Optional[float] = None                       # frames per step during the run

    @classmethod
    def merged(cls, streams: int, fps: float, parts: Sequence["LoadResult"]) -> "LoadResult":
        """The results of several client processes' streams as one: every count added and every list joined (all
        fields but the run's own: streams, fps and the server's frames per step)."""
        result = cls(streams, fps)
        for f in fields(cls):
            if f.name not in _RUN_FIELDS:
                setattr(result, f.name, sum((getattr(part, f.name) for part in parts), getattr(result, f.name)))
        return result

    @property
    def lost(self) -> int:
        """Frames sent and never answered (neither read nor said dropped)."""
        return self.sent - self.answered - self.dropped

    def row(self) -> str:
        """One Markdown table row."""
        p = (lambda q, xs: f"{np.percentile(xs, q):.1f}" if xs else "–")
        batch = f"{self.mean_batch:.1f}" if self.mean_batch is not None else "–"
        share = f" ({100 * self.dropped / self.sent:.1f} %)" if self.sent and self.dropped else ""
        streams = f"{self.streams} ({self.refused} refused)" if self.refused else f"{self.streams}"
        return (f"| {streams} | {self.fps:g} | {self.sent} | {self.answered} | {self.dropped}{share} | "
                f"{self.lost} | {self.out_of_order} | {p(50, self.round_trips)} | {p(99, self.round_trips)} | "
                f"{p(50, self.latencies)} | {p(99, self.latencies)} | {batch} |")


_RUN_FIELDS = ("streams", "fps", "mean_batch")  # a run's own, not its client processes' sums

HEADER = ("| streams | frames/s sent each | sent | answered | dropped | never answered | out of order | "
          "**round trip p50 (ms)** | **p99 (ms)** | server p50 (ms) | server p99 (ms) | frames per step |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def _batches(url: str) -> tuple[float, float]:
    """(sum, count) of the images-per-batch histogram on the server's /metrics."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    total = re.search(r"^emonet_batch_images_sum (\S+)$", text, re.M)
    count = re.search(r"^emonet_batch_images_count (\S+)$", text, re.M)
    return (float(total.group(1)) if total else 0.0), (float(count.group(1)) if count else 0.0)


async def _stream(url: str, frames: list[bytes], fps: float, seconds: float, result: LoadResult) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    sent_at: dict[int, float] = {}
    expected, first = 0, True  # the next frame's number; whether none has been answered yet
    ended = False  # the server refused or closed this stream, said once
    async with connect(url.replace("http", "ws", 1) + "/v1/stream", max_size=None) as ws:
        async def receive() -> None:
            try:
                await answers()
            except ConnectionClosed as exc:  # by the sender or here, whichever sees it first
                closed(f"the server closed the stream: {exc}")

        def closed(why: str) -> None:
            nonlocal ended
            if not ended:
                ended = True
                result.refused += 1
                result.errors.append(why)

        async def answers() -> None:
            nonlocal expected, first
            async for message in ws:
                reply = json.loads(message)
                if "frame" not in reply:  # the stream refused (at its --max-streams, say), or ended
                    closed(reply.get("error", "?"))
                    return
                if reply["frame"] != expected:
                    result.out_of_order += 1
                expected = reply["frame"] + 1
                sent = sent_at.pop(reply["frame"])
                if reply.get("dropped"):
                    result.dropped += 1
                    continue
                result.answered += 1
                result.latencies.append(reply["latency_ms"])
                result.round_trips.append((time.perf_counter() - sent) * 1e3)
                if first:
                    first = False
                    result.firsts.append(result.round_trips[-1])
                if reply.get("error"):
                    result.errors.append(reply["error"])

        listener = asyncio.create_task(receive())
        start, n = time.perf_counter(), int(seconds * fps)
        for i in range(n):  # paced as a camera is: frame i leaves at i / fps, whatever the answers do
            await asyncio.sleep(max(0.0, start + i / fps - time.perf_counter()))
            sent_at[i] = time.perf_counter()
            try:
                await ws.send(frames[i % len(frames)])
            except ConnectionClosed as exc:  # refused (at its --max-streams, say) or gone: said, not a traceback
                sent_at.pop(i)
                closed(f"the server closed the stream: {exc}")
                break
            result.sent += 1
        deadline = time.perf_counter() + 30
        while sent_at and time.perf_counter() < deadline and not listener.done():
            await asyncio.sleep(0.01)
        listener.cancel()


def _run_share(url: str, frames: list[bytes], streams: int, fps: float, seconds: float) -> LoadResult:
    """``streams`` of the load, in this process's event loop."""
    result = LoadResult(streams, fps)

    async def main() -> None:
        await asyncio.gather(*(_stream(url, frames, fps, seconds, result) for _ in range(streams)))

    asyncio.run(main())
    return result


def run_load(url: str, frames: list[bytes], streams: int, fps: float = 30.0, seconds: float = 10.0,
             per_process: int = STREAMS_PER_PROCESS) -> LoadResult:
    """``streams`` concurrent streams of ``frames`` (JPEG bytes, cycled) at ``fps`` for ``seconds`` against the
    service at ``url`` (``http://host:port``), ``per_process`` streams to a client process: one process sending
    more falls behind its own clock, and its late frames would be counted as the server's latency."""
    before = _batches(url)
    shares = [per_process] * (streams // per_process) + ([streams % per_process] if streams % per_process else [])
    if len(shares) == 1:
        result = _run_share(url, frames, streams, fps, seconds)
    else:
        with ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(_run_share, *zip(*[(url, frames, n, fps, seconds) for n in shares])))
        result = LoadResult.merged(streams, fps, parts)
    after = _batches(url)
    if after[1] > before[1]:
        result.mean_batch = (after[0] - before[0]) / (after[1] - before[1])
    return result


class LoadError(ValueError):
    """A load that cannot be sent as asked (no count the server takes, a server that is not ready)."""


class ClipError(LoadError):
    """A clip whose frames cannot be had (not a video, no frames): the local file's fault, not the server's."""


def health(url: str) -> dict:
    """The server's ``/health``; :class:`LoadError` where it answers that it is degraded or stopped."""
    try:
        return json.loads(urllib.request.urlopen(f"{url}/health", timeout=10).read())
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            raise
        said = json.loads(exc.read() or b"{}")
        raise LoadError(f"the server is {said.get('status', 'not ready')}: {said.get('why', '?')} "
                        f"({said.get('loops_running', '?')} of {said.get('loops', '?')} loops running); a load "
                        f"measured now would not be its own: restart it") from None


def camera_frames(clip: "str | Path", width: int = 640, height: int = 480, count: int = 300) -> list[bytes]:
    """The clip's first ``count`` frames as a ``width`` x ``height`` camera sends them: JPEG, each frame's centre
    cut to the camera's aspect, then scaled (a 16:9 clip's faces are not stretched into a 4:3 frame)."""
    import av
    import cv2

    frames = []
    try:
        container = av.open(str(clip))
    except (OSError, av.error.FFmpegError) as exc:
        raise ClipError(f"{clip}: not a video this can read ({getattr(exc, 'strerror', None) or exc})") from None
    with container:
        for _, frame in zip(range(count), container.decode(video=0)):
            image = frame.to_ndarray(format="bgr24")
            h, w = image.shape[:2]
            if w * height > h * width:  # wider than the camera: its sides cut
                cut = round(h * width / height)
                image = image[:, (w - cut) // 2:(w - cut) // 2 + cut]
            elif w * height < h * width:  # taller: its top and bottom cut
                cut = round(w * height / width)
                image = image[(h - cut) // 2:(h - cut) // 2 + cut]
            shrink = image.shape[1] > width
            image = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
            frames.append(cv2.imencode(".jpg", image)[1].tobytes())
    if not frames:
        raise ClipError(f"{clip}: a video with no frames")
    return frames


# Before the counts, a stream of the same frames to each of the server's loops for this long, not in the table: a
# loop prepares for a frame size on its first frames of that size (its detector's CUDA graphs, captured meanwhile),
# and a count run first would time that too (measured: docs/PERFORMANCE.md, The service).
WARMUP_SECONDS = 3.0


def serve_load_table(url: str, counts: Sequence[int], seconds: float, fps: float = 30.0,
                     clip: Optional[str] = None, warmup: float = WARMUP_SECONDS) -> tuple[str, bool]:
    """The service at ``url`` under each count of concurrent streams (:func:`run_load`), as a
    Markdown table: the client's round trip first, frames answered, dropped and never answered, the server's
    latency, step sizes. ``clip``: a video whose frames (as 640x480 JPEG, :func:`camera_frames`) are sent
    (default: a made-up clip of a real face); ``warmup``: seconds of a stream to each of the server's loops first,
    their first frame's round trip said against their last ones' (0: none). With it, whether every stream ran (the
    server refused none)."""
    about = health(url)
    most = about.get("max_streams") or max(counts)
    if min(counts) > most:
        raise LoadError(f"the server takes at most {most} streams and {min(counts)} or more were asked for: start it "
                        f"with --max-streams {max(counts)}, or ask for fewer (--serve-streams)")
    with tempfile.TemporaryDirectory(prefix="emonet-load-") as tmp:
        path = clip or make_clip(Path(tmp) / "clip.mp4", width=640, height=480, frames=30)
        frames = camera_frames(path)
    lines = [f"Service: {url}, {about.get('engine')} on {about.get('device')}, JPEG decoded by "
             f"{about.get('jpeg_decoder', '?')}; 640x480 JPEG frames of {clip or 'a made-up clip of a real face'} "
             f"({sum(map(len, frames)) // len(frames) // 1024} KB), {fps:g} frames/s a stream paced by the clock, "
             f"{seconds:g} s each. Round trip: from the client's send to its answer."]
    if warmup > 0:
        lines[0] += " " + _warm(url, about, frames, fps, warmup)
    lines += ["", HEADER]
    whole = True
    for n in counts:
        if n > most:  # refused by the server: said in the table, the counts it takes still run
            lines.append(f"| {n} | not run: the server takes at most {most} streams (its --max-streams) |")
            continue
        result = run_load(url, frames, n, fps, seconds)
        lines.append(result.row())
        whole = whole and not result.refused
        if result.errors:
            lines.append(f"<!-- {plural(n, 'stream')}: {plural(len(result.errors), 'error')}, first: "
                         f"{result.errors[0]} -->")
    if not whole:
        lines += ["", "Not every stream ran: the server refused or closed some (the *streams* column says how many), "
                      "so those rows are of fewer streams than asked."]
    return "\n".join(lines), whole


def _warm(url: str, before: dict, frames: list[bytes], fps: float, seconds: float) -> str:
    """A stream to each of the server's loops (each prepares for a frame size on its own) for ``seconds`` before the
    counts (see WARMUP_SECONDS), then until the server has closed them: what they saw, a sentence. ``before``: its
    ``/health`` as the run began."""
    most = before.get("max_streams") or 1
    streams = max(1, min(int(before.get("loops") or 1), most - int(before.get("streams") or 0)))
    warm = run_load(url, frames, streams, fps, seconds)
    deadline, closed = time.monotonic() + 10, False  # before the counts open theirs (--max-streams)
    while not closed and time.monotonic() < deadline:
        closed = int(health(url).get("streams") or 0) <= int(before.get("streams") or 0)
        if not closed:
            time.sleep(0.05)
    what = f"Warm-up: {plural(streams, 'stream')} for {seconds:g} s before the counts, not in the table"
    late = "" if closed else "; the server still had them open 10 s later"
    if warm.errors:
        return f"{what}: {warm.errors[0]}{late}."
    if not warm.firsts:
        return (f"{what}: {warm.sent} frames sent, none answered ({warm.dropped} dropped, {warm.lost} never "
                f"answered){late}.")
    firsts = f"{max(warm.firsts):.1f} ms" if streams == 1 else f"at most {max(warm.firsts):.1f} ms"
    later = warm.round_trips[-max(1, int(fps) * streams):]  # about its last second's answers
    return (f"{what}: the first frame answered in {firsts}, the last {len(later)} at p50 "
            f"{np.percentile(later, 50):.1f} ms ({warm.answered} of {warm.sent} frames answered){late}.")
