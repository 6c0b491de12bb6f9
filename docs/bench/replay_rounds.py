"""The timing loop of the large-batch experiment scripts (b256_variants.py, batch_split_streams.py).

Three untimed calls, then five rounds of ten calls, each round bracketed by CUDA events: the rounds'
throughputs, sorted (the scripts report the middle one). Kept as the sixth session ran it, so their
documented numbers reproduce; new scripts use ``emonet.timing.time_calls``.
"""
from typing import Callable

import torch


def round_rates(fn: Callable[[], object], items: int, rounds: int = 5, per_round: int = 10) -> list[float]:
    """Items/s of each round of ``per_round`` calls of ``fn`` (``items`` per call), sorted."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    rates = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_round):
            fn()
        b.record()
        b.synchronize()
        rates.append(items * per_round / (a.elapsed_time(b) / 1e3))
    return sorted(rates)
