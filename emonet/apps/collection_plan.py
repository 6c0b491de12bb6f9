"""A collection's plan: its videos (folders, globs and files, what is already done left out), each video's
outputs, its frame count, the share of each process (balanced by frame count) and the devices asked for."""
from __future__ import annotations

import glob
from pathlib import Path
from typing import Optional

from ..cli import plural
from ..errors import InputError

VIDEO_EXTENSIONS = {".mp4", ".mov", ".avi", ".mkv", ".m4v", ".webm", ".mpg", ".mpeg", ".wmv", ".flv", ".3gp",
                    ".ts", ".mts"}


def collect_videos(specs: list[str], exclude: Optional[Path] = None) -> list[Path]:
    """Video paths from files, folders (searched recursively, by extension) and glob patterns, in a stable
    order, leaving out those under ``exclude`` (the output folder); a missing path or a pattern that
    matches nothing is an :class:`InputError`."""
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS)
        elif path.is_file():
            found.append(path)
        elif any(c in spec for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
            if not matches:
                raise InputError(f"{spec}: no file matches this pattern")
            found += matches
        else:
            raise InputError(f"{spec}: no such video file or folder")
    skip = exclude.resolve() if exclude is not None else None
    unique = list({p.resolve(): p for p in found if skip is None or skip not in p.resolve().parents}.values())
    if not unique:
        raise InputError(f"{' '.join(specs)}: no video found (extensions: {', '.join(sorted(VIDEO_EXTENSIONS))})")
    stems: dict[str, Path] = {}
    for p in unique:
        if p.stem in stems:
            raise InputError(f"two videos would write the same outputs ({stems[p.stem]} and {p}): rename one")
        stems[p.stem] = p
    return unique


def output_paths(out_dir: Path, video: Path, annotated: bool) -> dict[str, Path]:
    """A video's outputs in ``out_dir``, named after its stem."""
    paths = {"csv": out_dir / f"{video.stem}.csv", "summary": out_dir / f"{video.stem}.summary.json",
             "plot": out_dir / f"{video.stem}.png"}
    if annotated:
        paths["video"] = out_dir / f"{video.stem}.mp4"
    return paths


def probe(video: Path) -> tuple[int, Optional[tuple[int, int, int]]]:
    """The container's frame count (0 when it does not say or cannot be opened), the load to balance, and
    its frames' ``(H, W, 3)`` (None when unknown)."""
    import av  # reads the header only, and quietly (OpenCV would print FFmpeg's complaints)

    try:
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            shape = (stream.height, stream.width, 3) if stream.width and stream.height else None
            if stream.frames:
                return int(stream.frames), shape
            if stream.duration and stream.average_rate:
                return int(stream.duration * stream.time_base * stream.average_rate), shape
            return 0, shape
    except (av.FFmpegError, IndexError, OSError, ValueError):
        return 0, None


def shares(loads: list[int], ranks: int) -> list[list[int]]:
    """Indices of the items each rank takes: longest first, each to the least-loaded rank (ties: lowest rank)."""
    totals = [0] * ranks
    taken: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        rank = min(range(ranks), key=lambda r: (totals[r], r))
        totals[rank] += max(1, loads[i])
        taken[rank].append(i)
    return [sorted(t) for t in taken]


def parse_devices(spec: Optional[str]) -> list[str]:
    """``--devices``: ``all`` (every GPU here), or a comma-separated list of ``cuda:N`` and ``cpu`` (a CPU
    worker each: for trying the workers without GPUs); [] when not given."""
    if not spec:
        return []
    import torch  # device_count() asks NVML: CUDA is not initialised here, so workers can be forked

    count = torch.cuda.device_count()
    if spec.strip() == "all":
        if not count:
            raise InputError("--devices all: no CUDA GPU here (give --devices cpu,cpu to try CPU workers)")
        return [f"cuda:{i}" for i in range(count)]
    devices = [d.strip() for d in spec.split(",") if d.strip()]
    for d in devices:
        index = d[5:] if d.startswith("cuda:") else None
        if d != "cpu" and not (index is not None and index.isdigit()):
            raise InputError(f"--devices: {d!r} is not a device (all, or a list of cuda:N and cpu)")
        if index is not None and int(index) >= count:
            raise InputError(f"--devices: {d} does not exist here ({plural(count, 'CUDA GPU')})")
    if len(set(d for d in devices if d != "cpu")) < len([d for d in devices if d != "cpu"]):
        raise InputError(f"--devices: a GPU is named twice ({spec})")
    return devices
