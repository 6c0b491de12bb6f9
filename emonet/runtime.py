"""Runtime settings: which device, cuDNN autotuning, deterministic mode, numeric precision, memory format.

Everything here is explicit configuration applied once at start-up; no module-level state is kept
beyond the flags PyTorch itself holds.
"""
from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np
import torch

from .log import say

from .choices import PRECISIONS  # noqa: F401 - re-exported
_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class DeviceError(Exception):
    """The requested device is not there or not understood."""


@dataclass
class RuntimeConfig:
    """How the network runs. The defaults are the fast, ordinary ones: cuda:0, cuDNN autotuning, fp32."""

    device: Optional[str] = None          # None: cuda:0 when available, else the CPU (with a warning)
    cudnn_benchmark: bool = True          # autotune convolutions: the first call of a new shape pays for it
    deterministic: bool = False           # bit-reproducible results; turns cudnn_benchmark off
    precision: str = "fp32"               # fp32 | tf32 | fp16 | bf16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype weights and inputs are cast to."""
        return _DTYPES[self.precision]


def select_device(requested: Union[str, torch.device, None] = None, quiet: bool = False,
                  log: Optional[Callable[[str], None]] = None) -> torch.device:
    """``cuda:0`` by default, the requested device if given; falls back to the CPU with one warning line (to
    ``log``, default standard error)."""
    if requested is None or str(requested) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda:0")
        if not quiet:
            (log or say)("warning: no CUDA GPU found; running on the CPU (much slower)")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown device {requested!r}; use 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {requested} was asked for but no CUDA GPU is available; "
                                f"use --device cpu")
        index = 0 if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device {requested} does not exist: this machine has "
                                f"{torch.cuda.device_count()} CUDA device(s)")
        device = torch.device("cuda", index)
    return device


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (all CUDA devices included)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def configure(config: RuntimeConfig) -> torch.device:
    """Apply ``config`` to PyTorch's global flags and return the device to run on."""
    device = select_device(config.device)
    if config.deterministic:
        # cuBLAS needs this set before its first use to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)
        seed_everything(config.seed)
    else:
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
        torch.backends.cudnn.deterministic = False
        if torch.are_deterministic_algorithms_enabled():
            # Only when set: the call imports Inductor's configuration (1.6 s on 2 cores) even to say no.
            torch.use_deterministic_algorithms(False)
    tf32 = config.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return device


def describe(config: RuntimeConfig, device: torch.device) -> str:
    """One line saying how the network runs, for the tools' headers."""
    if device.type != "cuda":
        mode = ", deterministic" if config.deterministic else ""
        return f"cpu ({torch.get_num_threads()} threads){mode}, torch {torch.__version__}"
    mode = "deterministic" if config.deterministic else (
        "cuDNN autotuning on" if config.cudnn_benchmark else "cuDNN autotuning off")
    return f"{device} ({torch.cuda.get_device_name(device)}), {mode}, torch {torch.__version__}"


def freeze_loaded() -> None:
    """Everything alive now (the model, its CUDA graphs, the libraries: some hundred thousand objects) set aside
    from the garbage collector's full passes, for a process that serves from here on: a full pass over them holds
    every thread of the process for 0.1 s or so, and a live stream's frames would wait through it. What is made
    later is collected as before."""
    gc.collect()
    gc.freeze()
