"""``torch.compile`` whose tracing is kept on disk: a second process loads compiled code instead of tracing.

Inductor's own caches spare a warm start the code generation, but Dynamo still traces the Python code
again in every process, most of a warm start's time (docs/PERFORMANCE.md).
Dynamo's precompile API (``torch.compile(fn).aot_compile``, ``torch.compiler.load_compiled_function``)
saves the traced and compiled function with its guards. :class:`Precompiled` keeps one such artifact per
input signature in a folder and, like Dynamo's own cache, picks the one whose guards accept the call;
only a call that none accepts is compiled (and saved). Where torch has no such API, it is plain
``torch.compile``.

The functions take their modules as arguments (never closed over), so the weights are inputs of the
compiled code and the artifacts hold no weights. They are pickles that this package writes into the
user's own cache folder (created private) and reads back, with the trust torch gives its inductor cache.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..io.atomic import write_bytes
from ..log import say


def available() -> bool:
    """Whether this torch can save and load precompiled functions."""
    return hasattr(torch._dynamo.config, "enable_aot_compile") and hasattr(torch.compiler, "load_compiled_function")


def code_digest(*parts: Any) -> str:
    """A short hash of everything the compiled code depends on: sources, versions, device, settings."""
    digest = hashlib.sha1()
    for part in (torch.__version__, torch.version.cuda, *parts):
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


class Precompiled:
    """``fn`` compiled per input signature; the artifacts live in ``folder`` and are shared across processes.

    ``compile_options`` go to ``torch.compile`` (``fullgraph=True`` is implied). ``mark(args)`` runs on
    the arguments of a compilation, e.g. to mark a dimension dynamic (marks on later calls' tensors would
    fail the saved guards, so it runs only there). ``log`` receives one line when an artifact cannot be
    read (it is then compiled again and replaced).
    """

    def __init__(self, fn: Callable, folder: Path, mark: Optional[Callable[[tuple], None]] = None,
                 log: Optional[Callable[[str], None]] = None, **compile_options: Any) -> None:
        self.fn = fn
        self.mark = mark
        self.folder = Path(folder)
        self.options = {**compile_options, "fullgraph": True}
        self._log = log or say
        self._entries: Optional[list] = None  # loaded lazily: a process that never calls pays nothing
        self.loaded = self.compiled = 0         # how many artifacts came from disk, and were compiled here

    def _load(self) -> list:
        entries = []
        for path in sorted(self.folder.glob("*.bin")):
            try:
                with open(path, "rb") as fh, torch._dynamo.config.patch(enable_aot_compile=True):
                    entry = torch.compiler.load_compiled_function(fh)
            except Exception as exc:  # written by another torch, truncated, ...: compile it again
                self._log(f"compile cache: {path.name} could not be loaded ({type(exc).__name__}); recompiling")
                path.unlink(missing_ok=True)
                continue
            entry.disable_guard_check()  # checked once, in __call__
            entries.append(entry)
            self.loaded += 1
        return entries

    def _compile(self, args: tuple) -> Any:
        if self.mark is not None:
            self.mark(args)
        with torch._dynamo.config.patch(enable_aot_compile=True):
            entry = torch.compile(self.fn, **self.options).aot_compile((args, {}))
        try:
            data = type(entry).serialize(entry).serialized_data
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.folder / f"{hashlib.sha1(data).hexdigest()[:16]}.bin"
            write_bytes(path, data)  # another process sees a whole artifact or none
        except Exception as exc:  # noqa: BLE001 - a folder not writable, say: compiled all the same, not kept
            self._log(f"compile cache: the compiled code could not be saved in {self.folder} "
                      f"({type(exc).__name__}: {exc}); the next start compiles again")
        entry.disable_guard_check()
        self.compiled += 1
        return entry

    def __call__(self, *args: Any) -> Any:
        if self._entries is None:
            self._entries = self._load()
        for entry in self._entries:
            if entry.guard_check(*args):
                return entry(*args)
        entry = self._compile(args)
        self._entries.append(entry)
        return entry(*args)


def compiler(folder: Optional[Path], log: Optional[Callable[[str], None]] = None,
             **compile_options: Any) -> Callable[..., Callable]:
    """``wrap(fn, name, mark=None)``: ``fn`` precompiled into ``folder/name`` where torch can, else ``torch.compile``.

    ``mark(args)`` prepares a call's arguments for compilation (see :class:`Precompiled`); with plain
    ``torch.compile`` it runs before every call, as Dynamo expects.
    """
    if folder is None or not available():
        def wrap(fn: Callable, name: str, mark: Optional[Callable[[tuple], None]] = None) -> Callable:
            compiled = torch.compile(fn, fullgraph=True, **compile_options)
            if mark is None:
                return compiled

            def call(*args: Any) -> Any:
                mark(args)
                return compiled(*args)
            return call
        return wrap
    return lambda fn, name, mark=None: Precompiled(fn, Path(folder) / name, mark, log, **compile_options)
