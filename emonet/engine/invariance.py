"""Does a batch shape give a crop the same bits wherever it sits in the batch? A check on the device itself.

The GPU default runs every crop in a batch of one fixed size so that a crop's numbers do not depend on the
job. That holds only if the kernels chosen for that shape compute each crop apart from the others. Some do
not: a GPU convolution that shares its work out over the whole batch (split or "stream-K" scheduling)
sums a crop's products in an order that depends on where the crop sits, and so rounds it differently; which
kernels the library picks depends on the GPU, the shape and the library's version. So the shape is checked
on the device before the first crop, on real face crops, and halved until it passes (a batch of one always
does): measured, not assumed. The answer is kept on disk per GPU, library versions and network
(:func:`remembered`), so the check is paid once per machine and every later process runs the same shape.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..io.atomic import AtomicFile

try:
    import fcntl
except ImportError:  # Windows: no lock; two processes writing at once may drop a key (checked again next time)
    fcntl = None

Run = Callable[[torch.Tensor], torch.Tensor]  # exactly ``batch`` crops -> their outputs, one row each


def position_invariant(run: Run, crops: torch.Tensor, batch: int) -> bool:
    """Whether ``run`` gives every crop the same bits in another place of a ``batch``-sized batch with other
    crops beside it. ``crops``: at least ``2 * batch`` different crops. Crops 1 to ``batch - 1`` are run a place
    earlier beside a new crop, and crop 0 last among new ones. Bits are compared (a NaN equals itself)."""
    if batch <= 1:
        return True  # alone, with nothing beside it: nothing to depend on
    if len(crops) < 2 * batch:
        raise ValueError(f"the check of a batch of {batch} needs {2 * batch} crops, got {len(crops)}")
    first = _bits(run(crops[:batch]))
    shifted = _bits(run(crops[1:batch + 1]))
    last = _bits(run(torch.cat([crops[batch + 1:2 * batch], crops[:1]])))
    return torch.equal(first[1:], shifted[:-1]) and torch.equal(first[:1], last[-1:])


def _bits(out: torch.Tensor) -> torch.Tensor:
    """Each row's bytes: equal exactly where the numbers are the same bits."""
    return out.contiguous().view(torch.uint8).reshape(out.shape[0], -1)


def invariant_batch(run: Run, largest: int, crops: torch.Tensor) -> tuple[int, list[int]]:
    """The largest batch size, ``largest`` then halved, that :func:`position_invariant` passes, and the sizes
    that failed before it. ``run`` takes a batch of any size."""
    failed: list[int] = []
    batch = largest
    while batch > 1 and not position_invariant(run, crops, batch):
        failed.append(batch)
        batch //= 2
    return max(batch, 1), failed


BATCH_SIZES = (1, 2, 3, 8, 16, 37, 64, 128, 512)  # what emonet-bench's spread over batches runs a crop in


def batch_spread(run: Run, crops: torch.Tensor, sizes: Sequence[int] = BATCH_SIZES) -> float:
    """The largest difference of any output of a crop run alone and run in a batch of each of ``sizes``
    (``crops`` repeated to fill it, so each crop sits at many places beside many others); 0.0: one answer per
    crop."""
    alone = torch.cat([run(crops[i:i + 1]) for i in range(len(crops))])
    worst = 0.0
    for size in sizes:
        index = torch.arange(size, device=crops.device) % len(crops)
        worst = max(worst, (run(crops[index]) - alone[index]).abs().max().item())
    return worst


def shapes_file() -> Path:
    """Where the checked shapes are kept: ``$EMONET_HOME/batch-shapes.json`` (default ~/.cache/emonet)."""
    return Path(os.environ.get("EMONET_HOME", Path.home() / ".cache" / "emonet")) / "batch-shapes.json"


def device_key(device: torch.device, network: str) -> str:
    """What a checked shape holds for: the GPU, the library versions and settings that choose its kernels, and
    the network (its arithmetic and shape, e.g. the engine's name and class count)."""
    versions = f"torch {torch.__version__}"
    if device.type == "cuda":
        cudnn = torch.backends.cudnn
        versions += (f", CUDA {torch.version.cuda}, cuDNN {cudnn.version()}"
                     f"{', autotuning' if cudnn.benchmark else ''}{', deterministic' if cudnn.deterministic else ''}"
                     f"{', TF32' if cudnn.allow_tf32 else ''}")
        return f"{torch.cuda.get_device_name(device)} ({versions}): {network}"
    return f"cpu ({versions}): {network}"


def remembered(key: str) -> Optional[int]:
    """The shape kept for ``key`` (None: none, or the file unreadable: checked again)."""
    try:
        value = json.loads(shapes_file().read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def remember(key: str, batch: int) -> None:
    """Keep ``batch`` for ``key`` (best effort: a folder that cannot be written costs the check next time). Two
    processes keeping theirs at once take turns (a lock beside the file, where the system has them), so neither
    loses the other's."""
    path = shapes_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            try:
                shapes = json.loads(path.read_text(encoding="utf-8"))
                shapes = shapes if isinstance(shapes, dict) else {}
            except (OSError, ValueError):
                shapes = {}
            shapes[key] = batch
            with AtomicFile(path) as fh:
                json.dump(shapes, fh, indent=1, sort_keys=True)
    except OSError:
        pass
