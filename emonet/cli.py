"""What every command line shares: an argument error is one line with a pointer to ``--help``, not the usage."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class ToolParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line, ``PROG: error: ... (see PROG --help)``,
    exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print the one line and exit with code 2."""
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def plural(n: int, noun: str, nouns: str = "") -> str:
    """``1 video``, ``2 videos`` (``nouns``: an irregular plural)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
