"""One atomic writer for every output: write to a temporary name beside the target, then rename.

A reader never sees a half-written file: an output is whole or absent. Files are created with the
usual permissions (the process's umask applies), not the private mode of ``tempfile.mkstemp``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Union


class AtomicPath:
    """A temporary name beside ``path`` for a writer that opens the file itself (a video encoder):
    :meth:`commit` renames it into place, :meth:`abort` removes it. ``keep_suffix``: the temporary name ends
    in the target's extension (for writers that choose a format by it)."""

    def __init__(self, path: Union[str, Path], keep_suffix: bool = False) -> None:
        self.path = Path(path)
        p = self.path
        self.tmp = p.with_name(f".{p.stem}.{os.getpid()}.partial{p.suffix}" if keep_suffix
                               else f".{p.name}.{os.getpid()}.partial")

    def commit(self) -> Path:
        """Rename the finished file into place; returns the final path."""
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Remove the temporary file; the target is left as it was."""
        self.tmp.unlink(missing_ok=True)


class AtomicFile:
    """``with AtomicFile(path, "w") as fh:`` writes ``.name.<pid>.partial`` and renames it to ``path`` on
    success; on an exception the partial file is removed. :meth:`commit` and :meth:`abort` do the same by
    hand for files kept open over a long run (CSV rows of a video)."""

    def __init__(self, path: Union[str, Path], mode: str = "w", **open_args) -> None:
        self._place = AtomicPath(path)
        self.path, self.tmp = self._place.path, self._place.tmp
        if "b" not in mode:
            open_args.setdefault("encoding", "utf-8")
            open_args.setdefault("newline", "")
        self.file: IO = open(self.tmp, mode, **open_args)

    def commit(self) -> Path:
        """Close and rename into place; returns the final path."""
        if not self.file.closed:
            self.file.close()
            self._place.commit()
        return self.path

    def abort(self) -> None:
        """Close and delete the partial file; the target is left as it was."""
        if not self.file.closed:
            self.file.close()
        self._place.abort()

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
