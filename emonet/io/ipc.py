"""What this process and its helper processes share: length-prefixed pickled messages on pipes, and
shared-memory files page-locked for copies to and from the GPU.

Torch-free at import, so the helper processes (encoding, plotting) that read messages start fast. The
messages come only from this process's own children or parent, never from outside, so unpickling them
is safe.
"""
from __future__ import annotations

import pickle
import struct
from typing import BinaryIO, Iterator, Optional

import numpy as np


def send(stream: BinaryIO, message) -> None:
    """Write one message (a 4-byte big-endian length, then its pickle) and flush."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def messages(stream: BinaryIO) -> Iterator:
    """The messages :func:`send` wrote, until the stream ends."""
    while True:
        header = stream.read(4)
        if len(header) < 4:
            return
        yield pickle.loads(stream.read(struct.unpack(">I", header)[0]))


def pin(memory: np.ndarray) -> Optional[int]:
    """Page-lock a mapping (as torch's pinned memory is), so copies between it and the GPU run
    asynchronously; its address for :func:`unpin`, or None where that failed."""
    import torch

    address = memory.ctypes.data
    return address if int(torch.cuda.cudart().cudaHostRegister(address, memory.nbytes, 0)) == 0 else None


def unpin(address: Optional[int]) -> None:
    """Undo :func:`pin` (no copy may still be running)."""
    if address is not None:
        import torch

        torch.cuda.cudart().cudaHostUnregister(address)
