"""The library's messages go to the ``emonet`` logger (each module logs as ``emonet.<module>``); the library
never prints. The command-line tools call :func:`install`, which writes each message as one line on standard
error, as they always read; a program that embeds emonet configures logging as it likes (``logging.getLogger
("emonet")``), and without that sees warnings only (Python's default)."""
from __future__ import annotations

import logging
import sys

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
