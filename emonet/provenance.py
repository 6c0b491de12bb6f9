"""What made a run's outputs: package and torch versions, the weights (and their file's SHA-256), the engine
and its precision, the device. Every tool writes it beside its results, so two runs that disagree can be told
apart afterwards."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional, Union

import torch

from . import __version__
from .io.atomic import write_text


def file_sha256(path: Union[str, Path]) -> str:
    """The SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_record(source: str) -> dict:
    """The weights as a record: ``{"source", "sha256", "untrained"}`` (``"random"``: untrained, no file)."""
    if source == "random":
        return {"source": "random", "sha256": None, "untrained": True}
    path = Path(source)
    return {"source": str(path.resolve()) if path.is_file() else source,
            "sha256": file_sha256(path) if path.is_file() else None, "untrained": False}


def provenance(engine) -> dict:
    """What a run ran: versions, weights, engine, precision and device (an :class:`emonet.engine.Engine`)."""
    device = engine.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    # Plain types only: a record goes to helper processes (the plots), and torch's own version type would make
    # unpickling it there import torch.
    return {"emonet_version": __version__, "torch_version": str(torch.__version__),
            "weights": weights_record(engine.weights_source), "classes": list(engine.class_names),
            "engine": engine.config.name, "precision": engine.config.precision,
            "device": f"{device} ({name})"}


def sidecar_path(output: Union[str, Path]) -> Path:
    """Where a results file's provenance goes: ``frames.csv`` -> ``frames.meta.json``."""
    output = Path(output)
    return output.with_name(output.stem + ".meta.json")


def write_sidecar(output: Union[str, Path], record: dict, extra: Optional[dict] = None) -> Path:
    """Write ``record`` (and ``extra``) as the provenance of ``output``, atomically; returns its path."""
    path = sidecar_path(output)
    write_text(path, json.dumps({**record, **(extra or {})}, indent=2) + "\n")
    return path
