"""``torch.compile`` for the engine: Inductor options per call (never set globally), and the folder where
compiled functions are kept between processes (:mod:`.precompile`).

The folder is passed where it is used: ``EngineConfig.cache_dir``, default ``$EMONET_HOME/compile``
(``~/.cache/emonet/compile``). Inductor's and Triton's own kernel caches stay where torch keeps them
(``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, which the user may set).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from . import precompile
from .config import EngineConfig


def compile_options(config: EngineConfig, device: torch.device, piece: str = "model") -> Dict[str, object]:
    """Inductor settings for one of this engine's ``torch.compile`` calls (``piece``: ``"model"``, the whole
    forward, or a piece of the streamed forward), passed per call (never set globally)."""
    import torch._inductor
    mode = "max-autotune-no-cudagraphs" if config.compile == "max-autotune" else "default"
    options: Dict[str, object] = {**torch._inductor.list_mode_options(mode), "freezing": config.freeze}
    if torch.device(device).type == "cuda":
        # A concatenation lowered as a kernel of its own gets a plain NCHW buffer whose producers
        # write straight into it: the head's concatenation then made the stem's output, and every
        # kernel reading it, NCHW, all transposing channels_last data (a few % of the large-batch
        # throughput). As a pointwise kernel its layout follows its consumer, the
        # convolution: channels_last.
        options["force_pointwise_cat"] = True
        # tune_kernels: half the GPU time at large batch is Triton elementwise kernels, bound by memory
        # bandwidth; tuning each one's block sizes on the device pays there (about 1.7 % at batch
        # 256), but makes the small batches' streamed pieces slower, and a process that loads the
        # saved compiled code tunes some kernels again (seconds at every start): hence opt-in, for
        # long large-batch runs.
        options["coordinate_descent_tuning"] = config.tune_kernels and piece == "model"
    return options


def cache_dir(config: EngineConfig) -> Path:
    """Where compiled functions are kept: ``config.cache_dir``, else ``$EMONET_HOME/compile``."""
    if config.cache_dir:
        return Path(config.cache_dir)
    return Path(os.environ.get("EMONET_HOME", Path.home() / ".cache" / "emonet")) / "compile"


def compiler(config: EngineConfig, device: torch.device, log: Callable[[str], None]) -> Callable:
    """``wrap(fn, name, mark=None)``: ``fn`` compiled with ``config``'s settings, kept in :func:`cache_dir`."""
    options = compile_options(config, device)
    # dynamic=False: a new batch size gets its own specialised graph unless marked dynamic (dynamo
    # keeps up to 8 graphs per function, more than the batch sizes the tools use).
    if config.streams:
        # The streamed forward compiles one function per kind of piece (a block, a block after a
        # pooling, ...) and each is specialised to several feature-map sizes and batch sizes.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    folder: Optional[Path] = None
    if config.precompile and not config.freeze:  # frozen code holds the weights: never saved
        # Keyed by all the compiled code depends on; the weights are inputs, so not by them.
        here = Path(__file__).resolve().parent
        sources = [(here / name).read_bytes() for name in ("forward.py", "transforms.py")]
        sources.append(Path(sys.modules["emonet.models.emonet"].__file__).read_bytes())
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        c = config
        # Not the batch sizes: the compiled functions are specialised to those as they are called.
        code = (c.precision, c.channels_last, c.fold_bn, c.compile, c.freeze, c.heatmaps, sorted(options.items()))
        folder = cache_dir(config) / "precompiled" / precompile.code_digest(device_name, code, *sources)
    # The whole-model graph and the streamed forward's pieces differ in their options (tune_kernels).
    piece_options = compile_options(config, device, "piece")
    wraps = {kind: precompile.compiler(folder, log, options=opts, dynamic=False)
             for kind, opts in (("model", options), ("piece", piece_options))}
    return lambda fn, name, mark=None: wraps["model" if name == "model" else "piece"](fn, name, mark)
