"""A labelled set's faces as training crops: found once by the tools' detector, cropped by their convention,
cached on disk; a seeded validation split; augmentation that fits faces."""
from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..choices import DEFAULT_DETECTOR
from ..evaluation.datasets import DatasetError, FaceDataset
from ..io.atomic import AtomicFile
from ..io.helper import ignore_stops, stops_held
from ..log import progress_bar

CACHE_VERSION = 1  # bump when the crop or the cache's layout changes: old caches are then not read


class TrainDataError(DatasetError):
    """A training set that cannot be used as given (said in one line)."""


@dataclass
class CropSet:
    """Face crops ``(N, 256, 256, 3)`` uint8 RGB and their labels (-1 / nan where a target is absent)."""

    crops: np.ndarray
    labels: np.ndarray      # int64
    valence: np.ndarray     # float32
    arousal: np.ndarray     # float32
    paths: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> "CropSet":
        """The samples at ``index`` (crops read from the cache as they are indexed)."""
        index = np.asarray(index, dtype=np.int64)
        return CropSet(self.crops[index], self.labels[index], self.valence[index], self.arousal[index],
                       [self.paths[i] for i in index])

    def targets(self) -> dict:
        """Which targets any sample has: expression, valence, arousal."""
        return {"expression": bool((self.labels >= 0).any()), "valence": bool(np.isfinite(self.valence).any()),
                "arousal": bool(np.isfinite(self.arousal).any())}


def check_labels(dataset: FaceDataset) -> None:
    """Valence and arousal within [-1, 1] and some target present; else one line naming the first bad row."""
    if not len(dataset):
        raise TrainDataError(f"{dataset.name} has no samples")
    for s in dataset.samples:
        for name, value in (("valence", s.valence), ("arousal", s.arousal)):
            if np.isfinite(value) and not -1.0 <= value <= 1.0:
                raise TrainDataError(f"{s.path}: {name} {value:g} is outside [-1, 1] (the circumplex's range)")
    if not dataset.labelled:
        raise TrainDataError(f"{dataset.name} has no labels to train on (no expression, valence or arousal)")


def _key(dataset: FaceDataset, detector: str) -> str:
    """What a cache holds: each image (path, size, modification time), its given crop, its labels, the detector."""
    h = hashlib.sha256(f"v{CACHE_VERSION} {detector}".encode())
    for s in dataset.samples:
        stat = s.path.stat() if s.path.is_file() else None
        h.update(f"{s.path}|{stat.st_size if stat else -1}|{stat.st_mtime_ns if stat else -1}|{s.label}|"
                 f"{s.valence!r}|{s.arousal!r}|".encode())
        if s.matrix is not None:
            h.update(np.ascontiguousarray(s.matrix, dtype=np.float64).tobytes())
    return h.hexdigest()[:20]


def crop_set(dataset: FaceDataset, cache_dir: Path, locate, detector: str = DEFAULT_DETECTOR,
             progress: bool = True) -> CropSet:
    """The dataset's crops, from the cache in ``cache_dir`` where it holds this dataset, else made and cached.

    ``locate(dataset)`` gives samples without a crop theirs (the tools' detector; see
    :func:`emonet.evaluation.loop.locate_faces`) and returns the images where no face was found and those that
    could not be read; either is an error naming the first.
    """
    check_labels(dataset)
    missing = dataset.missing()
    if missing:
        raise TrainDataError(f"{len(missing)} of {len(dataset)} images are missing or empty (first: {missing[0]})")
    cache_dir = Path(cache_dir)
    key = _key(dataset, detector)
    pixels, meta = cache_dir / f"crops-{key}.npy", cache_dir / f"crops-{key}.json"
    if pixels.is_file() and meta.is_file():
        info = json.loads(meta.read_text())
        return CropSet(np.load(pixels, mmap_mode="r"), np.array(info["labels"], np.int64),
                       np.array(info["valence"], np.float32), np.array(info["arousal"], np.float32), info["paths"])
    if any(s.matrix is None for s in dataset.samples):
        no_face, unreadable = locate(dataset)
        if unreadable:
            raise TrainDataError(f"{len(unreadable)} images could not be read (first: {unreadable[0]})")
        if no_face:
            raise TrainDataError(f"no face found in {len(no_face)} images (first: {no_face[0]}); give their faces "
                                 f"as box or landmarks columns, or leave them out")
    cache_dir.mkdir(parents=True, exist_ok=True)
    crops = np.empty((len(dataset), 256, 256, 3), np.uint8)
    for i in progress_bar(range(len(dataset)), desc="cropping faces", unit="face", disable=not progress, file=sys.stderr):
        crops[i] = dataset[i][0].permute(1, 2, 0).numpy()
    samples = dataset.samples
    info = {"labels": [s.label for s in samples], "paths": [str(s.path) for s in samples],
            "valence": [None if math.isnan(s.valence) else s.valence for s in samples],
            "arousal": [None if math.isnan(s.arousal) else s.arousal for s in samples]}
    with AtomicFile(pixels, "wb") as fh:
        np.save(fh, crops)
    with AtomicFile(meta, "w") as fh:  # written last: a cache is read only when whole
        json.dump(info, fh)
    return CropSet(crops, np.array(info["labels"], np.int64),
                   np.array([np.nan if v is None else v for v in info["valence"]], np.float32),
                   np.array([np.nan if v is None else v for v in info["arousal"]], np.float32), info["paths"])


def split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation indices: a seeded ``fraction`` of ``n`` held out (at least one each)."""
    if n < 2:
        raise TrainDataError(f"{n} sample cannot be split into training and validation; give --val FILE or more")
    order = np.random.default_rng(seed).permutation(n)
    held = min(n - 1, max(1, round(n * fraction)))
    return np.sort(order[held:]), np.sort(order[:held])


def augment(x: torch.Tensor, generator: torch.Generator, shift: float = 0.04, scale: float = 0.05,
            colour: float = 0.2) -> torch.Tensor:
    """Crops ``(B, 3, H, W)`` in [0, 1], each mirrored half the time, shifted and scaled a little (zeros beyond the
    image, as the tools' crop pads), and jittered in brightness, contrast and saturation; draws from ``generator``
    (a CPU generator: the same draws on any device)."""
    b = len(x)
    # Every draw made on the CPU, then sent in one copy that does not wait for the GPU's queued work.
    draws = torch.rand(7 * b, generator=generator)
    if x.is_cuda:
        draws = draws.pin_memory()
    flip_, zoom_, shift_, colour_ = draws.to(x.device, non_blocking=True).split([b, b, 2 * b, 3 * b])
    flip = torch.where(flip_ < 0.5, -1.0, 1.0)
    zoom = 1 + (2 * zoom_ - 1) * scale
    theta = torch.zeros(b, 2, 3, device=x.device)
    theta[:, 0, 0], theta[:, 1, 1] = flip / zoom, 1 / zoom
    theta[:, :, 2] = (2 * shift_.view(b, 2) - 1) * 2 * shift  # affine_grid's units: the half-width is 1
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    brightness, contrast, saturation = (1 + (2 * colour_.view(3, b, 1, 1, 1) - 1) * colour).unbind(0)
    x = x * brightness
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = (x - mean) * contrast + mean
    grey = (0.299 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])
    x = (x - grey) * saturation + grey
    return x.clamp(0, 1)


class BatchReader(torch.utils.data.Dataset):
    """A crop set read a batch at a time (the DataLoader's batched fetch, ``__getitems__``): the batch's crops
    ``(B, 256, 256, 3)`` uint8 (left out with ``crops=False``), labels, valence, arousal and the indices."""

    def __init__(self, data: CropSet, crops: bool = True) -> None:
        self.data, self.crops = data, crops

    def __len__(self) -> int:
        return len(self.data)

    def __getitems__(self, index) -> tuple[torch.Tensor, ...]:
        index = np.asarray(index, dtype=np.int64)
        d = self.data
        pixels = torch.from_numpy(np.ascontiguousarray(d.crops[index])) if self.crops else torch.empty(0)
        return (pixels, torch.from_numpy(d.labels[index]), torch.from_numpy(d.valence[index]),
                torch.from_numpy(d.arousal[index]), torch.from_numpy(index))


def _whole(batch):
    return batch  # BatchReader gives a batch already made


def _reader_process(_worker: int) -> None:
    # Ctrl-C, and SIGTERM sent to the whole job (a batch scheduler's cancel or time limit, systemd, `timeout`), are
    # the trainer's to handle: it finishes its step and saves a state, reading on meanwhile (Reader.close ends
    # these processes; SIGTERM no longer does). A stop that came before this ran was held (Reader blocks the
    # signals while it starts them) and is dropped here, as an ignored signal's pending one is.
    ignore_stops()


def _start_process_helpers() -> None:
    """Start multiprocessing's own helper processes now, where the start method has them (spawn, forkserver): the
    resource tracker, started by a first queue, unblocks the stops in the thread that starts it, and a forkserver
    started with them blocked would keep them blocked for every process it forks."""
    import multiprocessing
    from multiprocessing import resource_tracker

    method = multiprocessing.get_start_method()
    if method != "fork":
        resource_tracker.ensure_running()
    if method == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


class Reader:
    """The batches of ``order`` read from ``data`` in that order, as :func:`loader` reads them, one by one
    (``next``); :meth:`close` ends its reading processes at once."""

    def __init__(self, data: CropSet, order: Iterable[np.ndarray], crops: bool = True, workers: int = 0,
                 pin: bool = False) -> None:
        # The reading processes start with the stops held (a stop to the whole job while they started ended one,
        # and the trainer's next batch failed), until _reader_process ignores them.
        if workers > 0:
            _start_process_helpers()
        with stops_held():
            self._batches = iter(loader(data, order, crops, workers, pin))

    def __iter__(self) -> "Reader":
        return self

    def __next__(self):
        if self._batches is None:
            raise StopIteration
        return next(self._batches)

    def close(self) -> None:
        """End the reading processes now (close it however a run ends: they leave SIGTERM to their parent, and
        the interpreter's exit ends a child still running with SIGTERM, then waits for it: forever)."""
        self._batches = None


def loader(data: CropSet, order: Iterable[np.ndarray], crops: bool = True, workers: int = 0,
           pin: bool = False) -> torch.utils.data.DataLoader:
    """The batches of ``order`` (arrays of indices) read from ``data`` in that order: by ``workers`` processes a
    few batches ahead, into pinned memory with ``pin`` (so that the next batch's gathering and upload overlap this
    one's step on the GPU); in this process with none."""
    return torch.utils.data.DataLoader(BatchReader(data, crops), batch_sampler=order, collate_fn=_whole,
                                       num_workers=workers, pin_memory=pin, prefetch_factor=4 if workers else None,
                                       worker_init_fn=_reader_process)


def batches(n: int, size: int, generator: Optional[torch.Generator] = None, least: int = 2) -> list[np.ndarray]:
    """Indices ``0..n-1``, shuffled with ``generator`` where given, in as few batches of at most ``size`` as hold
    them, their sizes within one of each other: no small last batch, which would cost a whole step's kernel
    launches for a few crops. Each batch has ``least`` at least (BatchNorm trains on two samples, in each process
    under torchrun), which a tiny set may take past ``size``."""
    order = torch.randperm(n, generator=generator).numpy() if generator is not None else np.arange(n)
    return np.array_split(order, max(1, min(-(-n // size), n // least))) if n else []
