"""The pipeline a video run needs, built once (in the background while the first video opens) and reused for
every video after."""
from __future__ import annotations

import threading
from typing import Callable, Optional

from ..build import build_pipeline
from ..log import say
from ..pipeline import Pipeline
from .config import VideoConfig


class PipelineLoader:
    """The engine and detector a configuration asks for, in one :class:`~emonet.pipeline.Pipeline`, built (and
    warmed up, where the engine does not prepare in the background) on the first call and reused after.

    :meth:`start` builds it in a thread while the first video opens; its messages are held until the first
    call, so input that cannot be opened is one line, without the model's.
    """

    def __init__(self, config: VideoConfig) -> None:
        self.config = config
        self.pipeline: Optional[Pipeline] = None
        self._thread: Optional[threading.Thread] = None
        self._messages: list[str] = []
        self._holding = False
        self._error: Optional[BaseException] = None

    def _build(self, log: Callable[[str], None], shape: tuple = (720, 1280, 3)) -> None:
        config = self.config
        batch = config.batch_size
        buckets = tuple(b for b in sorted({1, 4, 16, 64, batch, 4 * batch}) if b <= 4 * batch)
        self.pipeline = build_pipeline(config.model, batch_sizes=buckets, log=log, max_faces=config.max_faces)
        self.pipeline.warmup(shape, log)
        self._shape = tuple(shape)

    def _log(self, message: str) -> None:
        """Held until the first call (then said in order); said at once after."""
        if self._holding:
            self._messages.append(message)
        else:
            say(message)

    def start(self) -> None:
        """Start building the pipeline in a thread of its own (once)."""
        if self.pipeline is None and self._thread is None:
            self._holding = True

            def build() -> None:
                try:
                    self._build(self._log)
                except BaseException as exc:  # raised by the first call, where the caller is
                    self._error = exc

            self._thread = threading.Thread(target=build, name="emonet-load", daemon=True)
            self._thread.start()

    def settle(self) -> None:
        """Let a build started and never asked for finish, quietly (the run ended before its first video
        opened): no thread is left loading while the process exits."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._messages.clear()

    def __call__(self, shape: tuple = (720, 1280, 3)) -> Pipeline:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            for message in self._messages:
                say(message)
            self._messages.clear()
            self._holding = False
            if self._error is not None:
                raise self._error
        if self.pipeline is None:
            self._build(say, shape)
        elif tuple(shape) != self._shape:
            engine = self.pipeline.engine
            if engine.device.type == "cuda" and engine.config.warmup and not engine.config.background:
                # Built ahead for another size: the explicit modes capture the detector's graphs for the
                # video's own (its fine view's input) now, not while frames flow.
                self.pipeline.detector.warmup(shape)
            self._shape = tuple(shape)
        return self.pipeline
