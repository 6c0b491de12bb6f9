"""What every command line shares: an argument error is one line with a pointer to ``--help``, not the usage."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Optional


class ToolParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line, ``PROG: error: ... (see PROG --help)``,
    exit code 2; run as ``python -m emonet.apps.serve``, PROG is that command (not ``serve.py``)."""

    def __init__(self, *args, prog: Optional[str] = None, **kwargs) -> None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if prog is None and spec is not None and spec.name.startswith("emonet."):
            prog = f"python -m {spec.name.removesuffix('.__main__')}"
        super().__init__(*args, prog=prog, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print the one line and exit with code 2."""
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def plural(n: int, noun: str, nouns: str = "") -> str:
    """``1 video``, ``2 videos`` (``nouns``: an irregular plural)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
