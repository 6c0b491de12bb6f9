"""EmoNet as an ONNX model that other runtimes run: ONNX Runtime, TensorRT (through its ONNX parser), OpenVINO.

The model takes what the engine takes, ``crops``: ``(N, 3, 256, 256)`` uint8 RGB face crops, cut as the spec's
§5 says (:func:`emonet.geometry.box_to_matrix`), and gives named outputs: ``expression`` (logits ``(N, classes)``),
``valence`` and ``arousal`` (``(N,)``, not clamped), ``landmarks`` (``(N, 68, 2)`` in crop pixels, decoded from
the heatmaps as the package does) and ``heatmap`` (``(N, 68, 64, 64)``). The batch is fixed or dynamic. The
file carries its provenance as metadata (package version, weights and their SHA-256, precision, classes).

:func:`export_onnx` writes it (whole or not at all) after checking it: ONNX Runtime on the CPU against the
PyTorch model in fp32 on real face crops.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np
import torch
from torch import nn

from .geometry import heatmap_coords
from .log import say

OUTPUTS = ("expression", "valence", "arousal", "landmarks", "heatmap")
# What "the same" means for the check: ONNX Runtime's fp32 kernels against PyTorch's differ by rounding only.
TOLERANCE = 1e-4
# Roughly how long export and check take on a 2-core CPU with the cores to themselves (about 13 and 23 CPU
# seconds measured; the check runs on both cores), for the lines that say each step as it starts.
EXPORT_S, CHECK_S = 15, 15


class ExportError(Exception):
    """An export that cannot be made or does not check out; the message says why and what to do."""


class _Exported(nn.Module):
    """EmoNet from uint8 crops to a tuple of named outputs (a dict is no ONNX output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, crops: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(crops.float().div(255.0))
        return (out["expression"], out["valence"], out["arousal"], heatmap_coords(out["heatmap"]), out["heatmap"])


@dataclass(frozen=True)
class OnnxCheck:
    """How the exported model's outputs compare with PyTorch's fp32 on the same real face crops."""

    crops: int
    max_diff: dict                   # per output, the largest absolute difference
    same_expression: bool            # the same arg-max class for every crop

    @property
    def ok(self) -> bool:
        """Every output within :data:`TOLERANCE`, and the same classes."""
        return self.same_expression and all(v <= TOLERANCE for v in self.max_diff.values())

    def format(self) -> str:
        """One line for a report."""
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in self.max_diff.items())
        return (f"ONNX Runtime (CPU) vs PyTorch fp32 on {self.crops} real face crops: largest differences {diffs}; "
                f"{'the same' if self.same_expression else 'NOT the same'} expression for every crop")


def _onnx_modules():
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise ExportError(f"the ONNX export needs its extra: pip install \"emonet[export]\" ({exc.name} is missing)") \
            from None
    import onnx
    import onnxruntime
    return onnx, onnxruntime


class _TorchvisionNotice(logging.Filter):
    """Drops the exporter's "torchvision is not installed. Skipping torchvision::nms" lines: EmoNet uses none of
    torchvision's operators, so the notice says nothing about this export."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("torchvision is not installed")


@contextlib.contextmanager
def _exporter_notices_hidden() -> Iterator[None]:
    """While torch.onnx exports: without the notices about its own internals that a user can do nothing about;
    its errors, and any other warning, still come through."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    notice = _TorchvisionNotice()
    registration.addFilter(notice)
    try:
        with warnings.catch_warnings():
            # torch's own pytree code copies a deprecated LeafSpec while tracing: a note to torch's developers.
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                    category=FutureWarning)
            yield
    finally:
        registration.removeFilter(notice)


def to_onnx(model: nn.Module, batch: Optional[int] = None, metadata: Optional[dict] = None) -> bytes:
    """The serialized ONNX model of ``model`` (EmoNet, fp32, on the CPU); ``batch``: fixed, or None for a dynamic
    batch; ``metadata``: string pairs stored in the file."""
    onnx, _ = _onnx_modules()
    wrapped = _Exported(model.float().cpu().eval()).eval()  # (the wrapper too: the exporter warns otherwise)
    example = torch.zeros(batch or 2, 3, 256, 256, dtype=torch.uint8)
    dynamic = None if batch else {"crops": {0: torch.export.Dim("batch", min=1, max=4096)}}
    try:
        with _exporter_notices_hidden():
            program = torch.onnx.export(wrapped, (example,), None, input_names=["crops"],
                                        output_names=list(OUTPUTS), dynamic_shapes=dynamic, dynamo=True, verbose=False)
    except Exception as exc:  # noqa: BLE001 - the exporter's many failure kinds: one line, with its own words
        raise ExportError(f"the ONNX export failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    proto = program.model_proto
    for key, value in (metadata or {}).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = str(key), str(value)
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def check_onnx(data: bytes, model: nn.Module, crops: torch.Tensor) -> OnnxCheck:
    """Run the serialized model with ONNX Runtime on the CPU and PyTorch's fp32 ``model`` on the same uint8
    ``crops``; compare every output."""
    _, ort = _onnx_modules()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    batch = session.get_inputs()[0].shape[0]
    if isinstance(batch, int):  # a fixed batch: the crops in that many at a time (the last padded)
        pad = (-len(crops)) % batch
        padded = torch.cat([crops, crops[:1].expand(pad, -1, -1, -1)]) if pad else crops
        parts = [session.run(None, {"crops": padded[i:i + batch].numpy()}) for i in range(0, len(padded), batch)]
        got = [np.concatenate([p[k] for p in parts])[:len(crops)] for k in range(len(OUTPUTS))]
    else:
        got = session.run(None, {"crops": crops.numpy()})
    with torch.inference_mode():
        ref = [t.numpy() for t in _Exported(model.float().cpu().eval())(crops)]
    diffs = {name: float(np.abs(g.astype(np.float64) - r).max()) for name, g, r in zip(OUTPUTS, got, ref)}
    return OnnxCheck(len(crops), diffs, bool((got[0].argmax(1) == ref[0].argmax(1)).all()))


def export_onnx(model: nn.Module, path: Union[str, Path], batch: Optional[int] = None,
                metadata: Optional[dict] = None, crops: Optional[torch.Tensor] = None) -> OnnxCheck:
    """Export ``model`` to ``path`` (:func:`to_onnx`), checked first on real face ``crops`` (default: 16 from the
    package's sample photo): written whole only when every output agrees within :data:`TOLERANCE`."""
    from .engine.check import varied_face_crops
    from .io.atomic import write_bytes

    # Each step said as it starts: together they take half a minute or more on a CPU, with nothing else to show.
    say(f"exporting EmoNet to ONNX (batch {batch or 'dynamic'}; about {EXPORT_S} s on 2 CPU cores, more while "
        f"other work shares them)...", __name__)
    data = to_onnx(model, batch, metadata)
    crops = varied_face_crops(16) if crops is None else crops
    say(f"checking it: ONNX Runtime (CPU) against PyTorch fp32 on {len(crops)} real face crops (about {CHECK_S} s on "
        f"2 CPU cores)...", __name__)
    check = check_onnx(data, model, crops)
    if not check.ok:
        raise ExportError(f"the exported model does not agree with PyTorch: {check.format()}; nothing written")
    write_bytes(path, data)
    return check


def read_metadata(path: Union[str, Path]) -> dict:
    """The provenance an exported file carries (its metadata), read without loading the weights' runtime."""
    onnx, _ = _onnx_modules()
    proto = onnx.load(io.BytesIO(Path(path).read_bytes()), load_external_data=False)
    return {entry.key: entry.value for entry in proto.metadata_props}
