"""What users wait for: clips of every length and photo sets, each in a fresh process beside a fresh floor
process (``python -m emonet.bench --sweep``)."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from .common import fmt, startup_floor
from .video import make_clip, released_way


def repeat_clip(source: Path, times: int, path: Path) -> Path:
    """``source`` played ``times`` times over, into ``path`` (packets copied, timestamps shifted: no
    re-encoding, so a long clip is made in seconds)."""
    import av

    with av.open(str(source)) as first:
        stream_in = first.streams.video[0]
        frames = sum(1 for _ in first.demux(stream_in)) - 1  # (the demuxer's end-of-stream marker)
    with av.open(str(path), mode="w", options={"movflags": "+faststart"}) as out:
        with av.open(str(source)) as first:
            stream = out.add_stream_from_template(first.streams.video[0])
        for k in range(times):
            with av.open(str(source)) as part:
                video = part.streams.video[0]
                shift = int(round(k * frames / float(video.average_rate) / video.time_base))
                for packet in part.demux(video):
                    if packet.dts is None:
                        continue
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = stream
                    out.mux(packet)
    return path


def _timed_tool(argv: list[str], device: str) -> dict:
    """Run a tool in a fresh process: its wall time, and what its report says (first result, model load,
    frames/s end to end, steady-state images/s)."""
    cmd = [sys.executable, *argv, "--weights", "random", "--device", device]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return {"wall_s": wall, **report_figures(proc.stderr)}


def report_figures(err: str) -> dict:
    """What a tool's report on standard error says: first result, model load (for a photo on a GPU, the first
    image's detection too, which runs beside the load), frames/s end to end, steady-state images/s, graphs ready."""
    import re

    first = re.search(r"first results? ([\d.]+) s after the process started", err)
    load = re.search(r"model(?:, engine and warm-up|, engine and detector|, engine, detector and the first detection"
                     r"| and engine) ([\d.]+) s", err)
    rate = re.search(r"([\d.]+) frames/s end to end", err)
    images = re.search(r"per image latency.*?throughput\s+([\d.]+) images/s", err, re.S)
    graphs = re.search(r"CUDA graphs were ready ([\d.]+) s", err)
    return {"first_result_s": float(first.group(1)) if first else None,
            "model_load_s": float(load.group(1)) if load else None,
            "frames_per_s": float(rate.group(1)) if rate else None,
            "images_per_s": float(images.group(1)) if images else None,
            "graphs_ready_s": float(graphs.group(1)) if graphs else None}


def job_sweep(device: str, seconds: Sequence[int] = (10, 60, 300, 1800), photos: Sequence[int] = (1, 150, 1500),
              released: bool = True, repeat: int = 3, short: float = 60) -> str:
    """Clips of each length in ``seconds`` (720p, 30 frames/s, made as :func:`make_clip` makes them) analysed
    and annotated, and photo sets of each size in ``photos``, each run in a fresh process beside a fresh
    floor process (one that only imports torch and touches the device): wall time, first result, and the
    ratio to floor + model load + the frames at steady speed (the speed of the longest job of its kind).

    A clip of up to ``short`` seconds, and every photo set but the largest, runs ``repeat`` times, alternating
    with the others: a process's start-up varies by a second or more from one to the next, which is most of a
    short job's ratio; its row gives the medians and each run's ratio."""
    import cv2
    import numpy as np
    from tqdm import tqdm

    from ..log import progress_bar

    def times(is_short: bool) -> int:
        return max(1, repeat) if is_short else 1

    if not seconds and not photos:
        raise ValueError("the sweep needs clip lengths or photo set sizes")
    with tempfile.TemporaryDirectory(prefix="emonet-sweep-") as tmp:
        tmp = Path(tmp)
        shortest = min(seconds, default=1)
        base = make_clip(tmp / "base.mp4", frames=30 * shortest)  # the longer clips repeat it (and photos are its frames)
        clips = {s: base if s == shortest else repeat_clip(base, s // shortest, tmp / f"clip{s}.mp4") for s in seconds}
        cap = cv2.VideoCapture(str(base))
        ok, frame = cap.read()
        cap.release()
        for n in photos:
            folder = tmp / f"photos{n}"
            folder.mkdir()
            for i in range(n):  # one clip frame each, shifted so no two are the same file
                cv2.imwrite(str(folder / f"{i:05d}.jpg"), np.roll(frame, 7 * i, axis=1))
        jobs = [("video, " + mode, f"{s // 60} min" if s >= 60 else f"{s} s", s * 30,
                 ["-m", "emonet.apps.video", "--video", str(clips[s]), "--csv", str(tmp / "rows.csv"),
                  *(["--no-video"] if mode == "analysis" else ["--output", str(tmp / "annotated.mp4")])], times(s <= short))
                for s in seconds for mode in ("analysis", "annotated")]
        jobs += [("photos", str(n), n, ["-m", "emonet.apps.photo", "--image", str(tmp / f"photos{n}"), "--json",
                                        str(tmp / "p.json")], times(n < max(photos))) for n in photos]
        order = [k for r in range(max(j[4] for j in jobs)) for k, job in enumerate(jobs) if r < job[4]]
        done: dict[int, list] = {k: [] for k in range(len(jobs))}  # job -> [(result, floor)]
        for k in progress_bar(order, desc="jobs", unit="run"):  # round by round: repeats alternate
            floor = startup_floor(device).get("process_s")
            done[k].append((_timed_tool(jobs[k][3], device), floor))
            result = done[k][-1][0]  # each run as it ends (a long sweep's log keeps what it measured)
            tqdm.write(f"{jobs[k][0]}, {jobs[k][1]}: floor {fmt(floor)} s, " + ", ".join(
                f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}" for key, value in result.items()),
                file=sys.stderr)
        released_rate = released_way(clips[shortest], device, None) if released and seconds else None
    lines = sweep_table([(kind, label, n) for kind, label, n, _, _ in jobs], [done[k] for k in range(len(jobs))])
    if released_rate:
        n = shortest * 30
        lines.append(f"The released way (decode, detect, crop, batch-1 fp32 EmoNet, frame by frame) on the "
                     f"{shortest}-s clip: {released_rate:.1f} frames/s, {n / released_rate:.1f} s for its frames "
                     f"after the model loaded.")
    return "\n".join(lines)


def sweep_table(jobs: Sequence[tuple[str, str, int]], runs: Sequence[Sequence[tuple[dict, Optional[float]]]]) -> list[str]:
    """The sweep's Markdown table: per job ``(kind, label, frames or images)``, its runs as ``(what
    :func:`_timed_tool` read, the floor process's seconds)``. A job run several times shows its median run (by
    the ratio) and every run's ratio. Steady speed: the first run of the last job of each kind."""
    steady: dict = {}
    for (kind, _, _), job_runs in zip(jobs, runs):  # the longest job of each kind comes last
        rate = job_runs[0][0].get("images_per_s" if kind == "photos" else "frames_per_s")
        if rate:
            steady[kind] = rate
    lines = ["| job | run | wall (s) | floor (s) | first result (s; after the floor) | model load (s) | "
             "frames at steady speed (s) | wall / (floor + load + frames) |", "|---|---|---|---|---|---|---|---|"]
    for (kind, label, n), job_runs in zip(jobs, runs):
        failed = [r for r, _ in job_runs if "error" in r]
        if failed:
            lines.append(f"| {kind} | {label} | failed: {failed[0]['error']} | | | | | |")
            continue
        frames_s = n / steady[kind] if steady.get(kind) else None
        ratios = [r["wall_s"] / ((floor or 0) + (r["model_load_s"] or 0) + (frames_s or 0)) for r, floor in job_runs]
        middle = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]
        result, floor = job_runs[middle]
        first = result["first_result_s"]
        unit = ("image" if kind == "photos" else "frame") + ("" if n == 1 else "s")
        which = f", the median of {len(ratios)} runs" if len(ratios) > 1 else ""
        each = f" ({', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""
        lines.append(f"| {kind} | {label} ({n} {unit}{which}) | {result['wall_s']:.2f} | {fmt(floor)} | "
                     f"{fmt(first)} ({fmt(first - floor if first is not None and floor else None, '+.2f')}) | "
                     f"{fmt(result['model_load_s'])} | {fmt(frames_s)} | **{ratios[middle]:.2f}×**{each} |")
    lines += ["", "Steady speed (the longest job of its kind): "
              + ", ".join(f"{k} {v:.0f} {'images' if k == 'photos' else 'frames'}/s" for k, v in steady.items()) + "."]
    ready = [r["graphs_ready_s"] for job_runs in runs for r, _ in job_runs if r.get("graphs_ready_s") is not None]
    if ready:
        lines.append(f"The engine's CUDA graphs were ready {min(ready):.2f}–{max(ready):.2f} s after the model "
                     f"loaded (captured in the background; the first frames ran eagerly meanwhile).")
    return lines

