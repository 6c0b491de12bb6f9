"""Helper processes (decoding, drawing, encoding, plotting), started one way: a fresh interpreter that runs a
module's ``main(*args)`` with the package on its path, pipes both ways, and one Ctrl-C policy; one way
of saying why one died; and one client (:class:`HelperClient`) that speaks to one: a sender, a listener,
the first failure, and the close.

Ctrl-C reaches a terminal's whole process group, and SIGTERM does where a job is stopped as a whole (``timeout``,
systemd stopping a service, a batch scheduler cancelling a job, ``kill -- -PGID``): a helper ignores both, and the
parent, which sees them too, decides (it closes the helper's input, so the work handed over is finished, or ends
it at once); a helper whose parent has gone ends as its pipes close. Torch-free, so the helpers that import this
start fast.
"""
from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the package, wherever it is
# What the pipes of a helper that takes large messages (a camera frame, some 67 KiB) hold where the system lets
# them (Linux: up to /proc/sys/fs/pipe-max-size, 1 MiB by default). Its reading thread takes in at most a pipe's
# worth a read, and between reads it must get the interpreter back from the threads beside it, which may hold it
# for a switch interval (5 ms): through Linux's default of 64 KiB, a reader beside a busy thread took in fewer
# frames a second than 16 streams send (measured: docs/PERFORMANCE.md, The service).
PIPE_BYTES = 1 << 20
STOPS = {signal.SIGINT, signal.SIGTERM}  # Ctrl-C, and a job stopped as a whole: the parent's to handle


def start_helper(target: str, *args: str, env: Optional[dict] = None, quiet: bool = False,
                 pipe_bytes: Optional[int] = None) -> subprocess.Popen:
    """Start ``target`` (``"package.module:function"``) as ``function(*args)`` in a process of its own, which
    exits with the function's status; its standard input and output are pipes to this process (``quiet``: its
    standard error is dropped; ``pipe_bytes``: what each pipe holds where the system lets it, see
    :func:`widen_pipe`; every pipe widened counts against the user's share). A module whose ``FAST_EXIT`` is true
    skips the interpreter's tear-down at the end (its files are closed and its messages sent by then; the parent
    would wait for the tear-down)."""
    module, function = target.split(":")
    code = (f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); from emonet.io.helper import _run; "
            f"_run({module!r}, {function!r}, sys.argv[1:])")
    with stops_held():
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL if quiet else None, env={**os.environ, **(env or {})})
    if pipe_bytes:
        for pipe in (proc.stdin, proc.stdout):
            widen_pipe(pipe.fileno(), pipe_bytes)
    return proc


def widen_pipe(fd: int, size: int = PIPE_BYTES) -> Optional[int]:
    """Let the pipe of ``fd`` hold up to ``size`` bytes, or the most the system allows below it, halving down to
    64 KiB (Linux's default, never less): what it holds now; None where a pipe's size cannot be set (not Linux).
    Best effort: a pipe the system keeps as it is stays so."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return None
    linux = sys.platform.startswith("linux")  # Python before 3.10 lacks the names, not the calls
    setter = getattr(fcntl, "F_SETPIPE_SZ", 1031 if linux else None)
    getter = getattr(fcntl, "F_GETPIPE_SZ", 1032 if linux else None)
    if setter is None or getter is None:
        return None
    try:
        while size >= 1 << 16:
            try:
                return fcntl.fcntl(fd, setter, size)
            except PermissionError:  # over pipe-max-size, or this user's pipes already hold their share
                size >>= 1
        return fcntl.fcntl(fd, getter)
    except OSError:  # the call itself refused (another kind of file): as it is
        return None


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held in this thread meanwhile, and in the processes it starts (a new process inherits
    the starting thread's mask) until they call :func:`ignore_stops`. A new process keeps the signals' default
    until its first code runs: without this, a job stopped as a whole in that moment ended it."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a stop held meanwhile comes now


def ignore_stops() -> None:
    """In a process started under :func:`stops_held`: ignore Ctrl-C and SIGTERM (the parent's to handle), which
    drops a stop held since the start, then let signals through again."""
    for stop in STOPS:
        signal.signal(stop, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


def _run(module: str, function: str, argv: list[str]) -> None:
    import importlib

    ignore_stops()
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


class HelperClient:
    """A helper process as its parent sees it: a sender thread, a listener thread, the first failure, close.

    ``handlers`` maps a message's kind (its first item: ``"ready"``, ``"error"``, ...) to a function called
    with the message's other items, in the listener thread, holding :attr:`state`; its waiters are woken after
    each message and when the output ends. Kinds without a handler are dropped. Call :meth:`start` once the
    handlers' own state is set up (a message may come at once).
    """

    def __init__(self, name: str, proc: subprocess.Popen, handlers: dict[str, Callable[..., None]], thread: str,
                 unsent: Optional[Callable[[tuple, str], None]] = None,
                 on_end: Optional[Callable[[], None]] = None) -> None:
        """``name``: the helper in messages (``"drawing"``); ``proc``: from :func:`start_helper`; ``thread``: the
        listener's name (the sender's adds ``-send``); ``unsent(message, why)``: for each message not written
        because the process had ended (without it, the write is dropped and the listener says why); ``on_end()``:
        called in the listener thread, holding :attr:`state`, once the output has ended (:attr:`failure` set)."""
        self.name = name
        self.proc = proc
        self.state = threading.Condition()
        self.failure: Optional[str] = None  # the first failure (see fail)
        self.closing = False  # close() has begun: the process's end is expected
        self.killed = False   # close() ended it at once: how it ended is no failure
        self.ended = False    # its output has ended
        self._handlers = dict(handlers)
        self._unsent = unsent
        self._on_end = on_end
        self._outbox: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._sender = threading.Thread(target=self._write, name=f"{thread}-send", daemon=True)
        self._listener = threading.Thread(target=self._listen, name=thread, daemon=True)

    def start(self) -> None:
        """Start the sender and the listener."""
        self._sender.start()
        self._listener.start()

    def send(self, message: tuple, after: Optional[Callable[[], object]] = None) -> None:
        """Queue ``message``, pickled in the sender thread; ``after()`` runs there first (a CUDA event's
        ``synchronize``: the message goes once the copies it names have finished)."""
        self._outbox.put((message, None, after))

    def send_framed(self, data: bytes) -> None:
        """Queue a message already framed by :func:`emonet.io.ipc.frame` (pickled in the caller's thread)."""
        self._outbox.put((None, data, None))

    def fail(self, why: str) -> None:
        """Keep ``why`` as :attr:`failure` unless one is kept already."""
        with self.state:
            if self.failure is None:
                self.failure = why

    def close(self, last: Optional[tuple] = None, kill: bool = False) -> Optional[str]:
        """Send ``last`` after the messages queued, close the input, wait for the output to end; the first
        failure (``kill``: end the process at once first, which is no failure)."""
        self.closing = True
        if kill:
            self.killed = True
            self.proc.kill()
        if last is not None:
            self.send(last)
        self._outbox.put(None)
        self._sender.join()
        self._listener.join()
        return self.failure

    def _write(self) -> None:
        # A thread: a message may be larger than the pipe holds, and the caller would wait for the helper
        # to read it, which it does once it has finished the work before. The messages queued meanwhile go in
        # one write (a write lets go of the interpreter, which a busy thread beside this one may then hold for a
        # switch interval); one with an ``after`` goes once those before it are written.
        from . import ipc  # NumPy with it: not in every helper's first import

        broken, ending = False, False
        try:
            while not ending:
                items = [self._outbox.get()]
                while items[-1] is not None:
                    try:
                        items.append(self._outbox.get_nowait())
                    except queue.Empty:
                        break
                if items[-1] is None:
                    ending = True
                    items.pop()
                written, chunks = [], []
                for message, data, after in items:
                    if after is not None:
                        broken = self._put(chunks, written, broken)
                        after()
                    chunks.append(data if data is not None else ipc.frame(message))
                    written.append(message)
                broken = self._put(chunks, written, broken)
        finally:  # its input ends however this thread does, so the process ends too
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _put(self, chunks: list, messages: list, broken: bool) -> bool:
        """Write the framed ``chunks`` (of ``messages``) at once and empty both lists; whether the pipe is broken."""
        if chunks and not broken:
            try:
                self.proc.stdin.write(b"".join(chunks))
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):  # it has ended: the listener says why
                broken = True
        if broken and self._unsent is not None:
            for message in messages:
                self._unsent(message, died(self.name, self.proc))
        chunks.clear()
        messages.clear()
        return broken

    def _listen(self) -> None:
        from . import ipc

        for message in ipc.messages(self.proc.stdout):
            with self.state:
                handler = self._handlers.get(message[0])
                if handler is not None:
                    handler(*message[1:])
                self.state.notify_all()
        code = self.proc.wait()
        with self.state:
            self.ended = True
            if not self.closing or (code != 0 and not self.killed):
                self.fail(died(self.name, self.proc))
            if self._on_end is not None:
                self._on_end()
            self.state.notify_all()
