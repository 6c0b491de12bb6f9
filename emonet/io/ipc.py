"""What this process and its helper processes share: one framed message protocol, both ways, and one ring
of frame slots in shared memory.

Messages are tuples, the first item their kind; each is written as a 4-byte big-endian length, then its
pickle. They come only from this process's own children or parent, never from outside, so unpickling them
is safe. Frames do not go through the pipes: they go through a :class:`Ring`, a memory-mapped file (in
/dev/shm where there is room) that both processes map, the messages naming its slots.

Torch-free at import, so the helper processes that read messages start fast.
"""
from __future__ import annotations

import mmap
import os
import pickle
import struct
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

import numpy as np

FOLDERS = ("/dev/shm", tempfile.gettempdir())  # where a ring's file goes: shared memory first
READ_AHEAD = 1 << 20  # bytes of messages read in one call, at most


def frame(message, data: Optional[bytes] = None) -> bytes:
    """One message as :func:`send` writes it (``data``: the message already pickled, as torch's multiprocessing
    pickler does for CUDA tensors)."""
    if data is None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack(">I", len(data)) + data


def send(stream: BinaryIO, message) -> None:
    """Write one message and flush."""
    stream.write(frame(message))
    stream.flush()


def _read(stream: BinaryIO, size: int) -> bytes:
    """``size`` bytes, or fewer once the stream has ended (an unbuffered pipe returns what has come)."""
    data = b""
    while len(data) < size:
        part = stream.read(size - len(data))
        if not part:
            break
        data += part
    return data


def receive(stream: BinaryIO):
    """The next message :func:`send` wrote, or None once the stream has ended (the writer has gone)."""
    header = _read(stream, 4)
    if len(header) < 4:
        return None
    size = struct.unpack(">I", header)[0]
    data = _read(stream, size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def messages(stream: BinaryIO) -> Iterator:
    """The messages :func:`send` wrote, until the stream ends. Whatever has come is read in one call (up to
    READ_AHEAD bytes) and every whole message in it handed out before the next: a reading thread lets go of the
    interpreter once per read, and a busy thread beside it may hold it for a switch interval (5 ms) before this
    one has it back: a read per message would let through no more than some 200 messages a second."""
    read = getattr(stream, "read1", None) or stream.read  # read1: what is buffered, else one read of the pipe
    buffer = bytearray()
    while True:
        start = 0
        while len(buffer) - start >= 4:
            size = struct.unpack_from(">I", buffer, start)[0]
            if len(buffer) - start - 4 < size:
                break
            message = pickle.loads(bytes(buffer[start + 4:start + 4 + size]))
            start += 4 + size
            yield message
        del buffer[:start]
        part = read(READ_AHEAD)
        if not part:
            return  # the writer has gone (a message cut short by its end is no message)
        buffer += part


class Ring:
    """``slots`` slots of ``slot_bytes`` bytes each in a memory-mapped file that a helper process and this one
    both map: :meth:`create` makes one, the other process :meth:`attach`\\ es it by its path, and once both have
    it mapped its name is removed (:meth:`unlink`), so nothing is left behind however they end. Which slot is
    whose is the messages' business."""

    def __init__(self, memory: mmap.mmap, path: str, slots: int, slot_bytes: int) -> None:
        self.memory, self.path, self.slots, self.slot_bytes = memory, path, slots, slot_bytes
        self.array = np.frombuffer(memory, np.uint8)[:slots * slot_bytes]  # every slot, end to end
        self._views: dict = {}
        self._pinned: Optional[int] = None

    @classmethod
    def create(cls, slots: int, slot_bytes: int, folders=FOLDERS) -> Optional["Ring"]:
        """A new ring in the first of ``folders`` with room, or None where none has. The space is reserved
        now (posix_fallocate), so a full tmpfs fails here rather than with SIGBUS on a later frame."""
        size = slots * slot_bytes
        for folder in folders:
            if not os.path.isdir(folder):
                continue
            fd, path = tempfile.mkstemp(prefix="emonet-frames-", dir=folder)
            try:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, size)
                else:
                    os.ftruncate(fd, size)
                return cls(mmap.mmap(fd, size), path, slots, slot_bytes)
            except OSError:
                os.unlink(path)
            finally:
                os.close(fd)
        return None

    @classmethod
    def attach(cls, path: str, slots: int) -> "Ring":
        """The ring another process made at ``path``, mapped here too."""
        with open(path, "r+b") as fh:
            memory = mmap.mmap(fh.fileno(), 0)
        return cls(memory, path, slots, len(memory) // slots)

    def slot(self, slot: int) -> np.ndarray:
        """The slot's bytes, flat."""
        return self.array[slot * self.slot_bytes:(slot + 1) * self.slot_bytes]

    def view(self, slot: int, shape: tuple) -> np.ndarray:
        """The slot's first bytes as a uint8 array of ``shape`` (kept: the same array each time)."""
        key = (slot, shape)
        if key not in self._views:
            self._views[key] = self.slot(slot)[:int(np.prod(shape))].reshape(shape)
        return self._views[key]

    def unlink(self) -> None:
        """Remove the file's name (the mappings stay)."""
        Path(self.path).unlink(missing_ok=True)

    def pin(self) -> None:
        """Page-lock the slots (as torch's pinned memory is), so copies between them and the GPU run
        asynchronously; quietly not where that fails."""
        import torch

        address = self.array.ctypes.data
        if int(torch.cuda.cudart().cudaHostRegister(address, self.array.nbytes, 0)) == 0:
            self._pinned = address

    def close(self) -> None:
        """Unmap (no copy from or to the GPU may still be running); a view still held keeps the mapping."""
        if self._pinned is not None:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self._pinned)
            self._pinned = None
        self._views.clear()
        self.array = np.empty(0, np.uint8)
        try:
            self.memory.close()
        except BufferError:  # a caller still holds a view: the mapping goes when that does
            pass
