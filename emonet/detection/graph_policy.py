"""Which batches and input sizes the detector's networks run as CUDA graphs, and the padding that gets them there.

A batch runs padded to a power of two (few distinct shapes: few autotuning runs, few graphs, each keeping its
memory); the rows past the real ones are never read. The back model's square input always runs as a graph, a
fine-view size only once it recurs (see :func:`graph_worth_it`).
"""
from __future__ import annotations

import torch

from .views import FINE_SIZES_KEPT

# On a GPU the fine view runs up to this many images as they are, not padded: each is some four times the whole
# view's work, and a video's chunk has two or three such frames; more are padded.
FINE_UNPADDED = 4


def powers_of_two(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``."""
    return [1 << k for k in range(most.bit_length())]


def padded_count(n: int) -> int:
    """The power of two a batch of ``n`` runs as (few distinct shapes: few autotuning runs, few graphs)."""
    return 1 << (n - 1).bit_length()


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with its last row repeated up to ``rows`` rows."""
    return torch.cat([x, x[-1:].expand(rows - len(x), *x.shape[1:])]) if rows > len(x) else x


def graph_worth_it(seen: dict[tuple[int, int], int], size: tuple[int, int], square: int) -> bool:
    """Whether an input of ``size`` runs as a CUDA graph: a network's own ``square`` input always; a fine-view
    size from its second time (a video's frames, not a folder of photos of every size), up to FINE_SIZES_KEPT
    sizes (each graph keeps its memory). ``seen`` (input size -> times seen) is updated."""
    if size == (square, square):
        return True
    times = seen.get(size, 0)
    if times == 0 and len(seen) >= FINE_SIZES_KEPT:
        return False
    seen[size] = times + 1
    return times >= 1
