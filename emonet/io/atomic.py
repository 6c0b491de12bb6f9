"""One atomic writer for every output: write to a temporary name beside the target, then rename.

A reader never sees a half-written file: an output is whole or absent. Files are created with the
usual permissions (the process's umask applies), not the private mode of ``tempfile.mkstemp``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Union


class AtomicFile:
    """``with AtomicFile(path, "w") as fh:`` writes ``.name.<pid>.partial`` and renames it to ``path`` on
    success; on an exception the partial file is removed. :meth:`commit` and :meth:`abort` do the same by
    hand for files kept open over a long run (CSV rows of a video)."""

    def __init__(self, path: Union[str, Path], mode: str = "w", **open_args) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        if "b" not in mode:
            open_args.setdefault("encoding", "utf-8")
            open_args.setdefault("newline", "")
        self.file: IO = open(self.tmp, mode, **open_args)

    def commit(self) -> Path:
        """Close and rename into place; returns the final path."""
        if not self.file.closed:
            self.file.close()
            os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Close and delete the partial file; the target is left as it was."""
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> IO:
        return self.file

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


def write_bytes(path: Union[str, Path], data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all."""
    with AtomicFile(path, "wb") as fh:
        fh.write(data)


def write_text(path: Union[str, Path], text: str) -> None:
    """Write a text file whole or not at all."""
    write_bytes(path, text.encode("utf-8"))
