"""The library's messages go to the ``emonet`` logger (each module logs as ``emonet.<module>``); the library
never prints. The command-line tools call :func:`install`, which writes each message as one line on standard
error, as they always read; a program that embeds emonet configures logging as it likes (``logging.getLogger
("emonet")``), and without that sees warnings only (Python's default)."""
from __future__ import annotations

import logging
import re
import sys
from typing import Any, Iterable, Optional

LOGGER = "emonet"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a message comes (a redirected or captured stream too)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: D102 - the current standard error
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def install(level: int = logging.INFO) -> logging.Logger:
    """Write the library's messages (``level`` and above) as plain lines on standard error; once per process."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # one line per message, whatever the root logger does
    return logger


def say(message: str, name: str = LOGGER) -> None:
    """One of the library's lines, logged: a line starting ``warning:`` as a warning, the rest as information."""
    logger = logging.getLogger(name)
    (logger.warning if message.startswith("warning:") else logger.info)(message)


# Off a terminal (a log file, CI, a pipe), a progress bar is a line now and then instead of a redraw per update:
# a line at most this often, and none for a job that ends sooner.
LOG_EVERY_S = 30.0


def progress_bar(iterable: Optional[Iterable] = None, every: float = LOG_EVERY_S, **kwargs: Any):
    """A tqdm progress bar on standard error (or ``file``): on a terminal as tqdm draws it; elsewhere one plain
    line every ``every`` seconds (none in a job that ends sooner), so a log holds lines, not carriage returns."""
    from tqdm import tqdm

    stream = kwargs.pop("file", None) or sys.stderr
    if not _is_terminal(stream):
        kwargs.update(delay=every, mininterval=every, maxinterval=max(every, 1.0), dynamic_ncols=False)
        kwargs.setdefault("ncols", 100)
        stream = _Lines(stream)
    return tqdm(iterable, file=stream, **kwargs)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _Lines:
    """A stream for a bar off a terminal: each redraw a whole line of its own at once (so another line written to
    the stream meanwhile, a warning or a result, never lands on it), the same line not twice."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._last = ""

    def write(self, text: str) -> None:
        for part in re.split(r"[\r\n]", text):
            line = part.rstrip()
            if line and line != self._last:
                self._stream.write(line + "\n")
                self._last = line

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str):  # encoding and the like, as the stream's
        return getattr(self._stream, name)
