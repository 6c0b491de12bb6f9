"""Helper processes (decoding, drawing, encoding, plotting), started one way: a fresh interpreter that runs a
module's ``main(*args)`` with the package on its path, pipes both ways, and one Ctrl-C policy; and one way
of saying why one died.

Ctrl-C reaches a terminal's whole process group: a helper ignores it, and the parent, which sees it too,
decides (it closes the helper's input, so the work handed over is finished, or ends it at once). Torch-free,
so the helpers that import this start fast.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the package, wherever it is


def start_helper(target: str, *args: str, env: Optional[dict] = None, quiet: bool = False) -> subprocess.Popen:
    """Start ``target`` (``"package.module:function"``) as ``function(*args)`` in a process of its own, which
    exits with the function's status; its standard input and output are pipes to this process (``quiet``: its
    standard error is dropped). A module whose ``FAST_EXIT`` is true skips the interpreter's tear-down at the
    end (its files are closed and its messages sent by then; the parent would wait for the tear-down)."""
    module, function = target.split(":")
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            f"sys.path.insert(0, {PACKAGE_ROOT!r}); from emonet.io.helper import _run; "
            f"_run({module!r}, {function!r}, sys.argv[1:])")
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL if quiet else None, env={**os.environ, **(env or {})})


def _run(module: str, function: str, argv: list[str]) -> None:
    import importlib

    helper = importlib.import_module(module)
    code = getattr(helper, function)(*argv)
    if getattr(helper, "FAST_EXIT", False):
        sys.stdout.flush()
        os._exit(code or 0)
    sys.exit(code)


def died(what: str, proc: subprocess.Popen) -> str:
    """Why helper ``what`` ended, for a message: its exit code, or the signal that ended it."""
    code = proc.wait()
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"the {what} process ended unexpectedly (killed by {name}{hint})"
    return f"the {what} process ended unexpectedly (exit code {code})"
