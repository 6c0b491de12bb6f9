"""The forward functions the engine runs (and compiles): the whole model, or its pieces with the
hourglass's skip branches on side CUDA streams; every output packed into one buffer.

The compiled pieces are plain functions that take their module as an argument: compiled code then takes
the weights as inputs, so one compilation serves every module of the same shape, and a precompiled
artifact holds no weights (:mod:`emonet.engine.precompile`).
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..geometry import heatmap_coords
from .transforms import EngineNet


def model_input(model: EngineNet, x: torch.Tensor) -> torch.Tensor:
    """Crops (uint8 in [0, 255], or float in [0, 1]) in the model's dtype and memory layout.

    Both are read off the model's first weight, which the engine converted to them. Inside compiled
    code this becomes one fused kernel instead of three or four small ones.
    """
    weight = model.conv1.weight
    if x.dtype == torch.uint8:
        x = x.float().div(255.0)
    x = x.to(weight.dtype)
    if weight.shape[1] > x.shape[1]:  # pad_stem_input: zero channels up to what the convolution takes
        x = F.pad(x, (0, 0, 0, 0, 0, weight.shape[1] - x.shape[1]))
    if not weight.is_contiguous():  # a channels_last model
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _landmark_part(heat: torch.Tensor) -> torch.Tensor:
    """The landmarks decoded from the heatmaps, flattened: the front of the packed output."""
    return heatmap_coords(heat).flatten(1)


def _heat_part(heat: torch.Tensor) -> torch.Tensor:
    """The heatmaps (float32, flattened), then the landmarks: the front of the packed output with heatmaps."""
    return torch.cat([heat.flatten(1).float(), heatmap_coords(heat).flatten(1)], dim=1)


def _pack(heat_part: torch.Tensor, out: Dict[str, torch.Tensor]) -> torch.Tensor:
    """Every output in one float32 ``(N, K)`` buffer (layout: :func:`split_outputs`), so results leave in one copy."""
    return torch.cat([heat_part, out["expression"].float(), out["valence"].float()[:, None],
                      out["arousal"].float()[:, None]], dim=1)


def split_outputs(flat: torch.Tensor, n_expression: int) -> Dict[str, torch.Tensor]:
    """The output dict as views of a packed ``(N, [68*64*64 +] 68*2 + n_expression + 2)`` buffer."""
    n, k, points = flat.shape[0], n_expression, 68 * 2
    out = {"landmarks": flat[:, -(k + 2 + points):-(k + 2)].view(n, -1, 2),
           "expression": flat[:, -(k + 2):-2], "valence": flat[:, -2], "arousal": flat[:, -1]}
    if flat.shape[1] > k + 2 + points:
        out = {"heatmap": flat[:, :-(k + 2 + points)].view(n, -1, 64, 64), **out}
    return out


def packed_forward(model: EngineNet, x: torch.Tensor) -> torch.Tensor:
    """The whole model on crops, packed (:func:`split_outputs`) with the landmarks decoded."""
    # Decoding and packing inside the compiled code: Inductor writes each result straight into the
    # packed buffer, and the landmark decoding is a few fused kernels instead of some forty.
    out = model(model_input(model, x))
    return _pack(_landmark_part(out["heatmap"]), out)


def packed_forward_heatmaps(model: EngineNet, x: torch.Tensor) -> torch.Tensor:
    """:func:`packed_forward` with the heatmaps in front."""
    out = model(model_input(model, x))
    return _pack(_heat_part(out["heatmap"]), out)


def _stem(model: EngineNet, x: torch.Tensor) -> torch.Tensor:
    return model.stem(model_input(model, x))


def _stack_tail(model: EngineNet, i: int, hg: torch.Tensor, previous: torch.Tensor):
    return model.stack_tail(i, hg, previous)


def _head(model: EngineNet, x: torch.Tensor, features: list, heat: torch.Tensor) -> Dict[str, torch.Tensor]:
    return model.head(x, features, heat)


def _block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def _pool_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(F.max_pool2d(x, 2, stride=2))


def _block_merge(block: nn.Module, x: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return up + F.interpolate(block(x), scale_factor=2, mode="nearest")


@contextlib.contextmanager
def no_cudnn_autotuning() -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` off inside, as it was after."""
    # Not torch.backends.cudnn.flags(benchmark=False): it also resets enabled, deterministic and
    # allow_tf32 to its own defaults, which would undo the runtime's deterministic mode.
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


class StreamedForward:
    """EmoNet's forward with each hourglass level's skip branch (``b1_L``) on a CUDA stream of its own.

    At small batches the hourglass's lower levels (32x32 down to 4x4) keep few of the GPU's SMs busy,
    and the skip branches do not depend on them, so they run alongside. Captured in a CUDA graph, the
    streams become parallel branches of the graph. ``wrap`` compiles each piece (the stem, a block, a
    stack's tail, the head); without CUDA it runs the pieces in order. The last heatmaps are decoded
    into landmarks on a side stream while the emotion head runs. Returns the packed outputs
    (:func:`split_outputs`).
    """

    def __init__(self, model: EngineNet, device: torch.device, wrap=lambda fn, name, mark=None: fn,
                 heatmaps: bool = False) -> None:
        self.model = model
        self.depth = model.m0.depth
        cuda = device.type == "cuda"
        self.streams = [torch.cuda.Stream(device) for _ in range(self.depth)] if cuda else None
        self.stem, self.stack_tail, self.head = wrap(_stem, "stem"), wrap(_stack_tail, "tail"), wrap(_head, "head")
        self.block, self.pool_block = wrap(_block, "block"), wrap(_pool_block, "pool_block")
        self.block_merge = wrap(_block_merge, "block_merge")
        self.heat_part = wrap(_heat_part, "heat_part") if heatmaps else wrap(_landmark_part, "landmark_part")
        self.pack = wrap(_pack, "pack")

    def _level(self, hg: nn.Module, level: int, inp: torch.Tensor) -> torch.Tensor:
        skip = hg._modules[f"b1_{level}"]
        if self.streams is None:
            up1 = self.block(skip, inp)
        else:
            side, main = self.streams[level - 1], torch.cuda.current_stream(inp.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                up1 = self.block(skip, inp)
            # Each tensor crossing streams is marked, so the allocator does not hand its memory to
            # the other stream while it may still be read there.
            inp.record_stream(side)
            up1.record_stream(main)
        low1 = self.pool_block(hg._modules[f"b2_{level}"], inp)
        if level > 1:
            low2 = self._level(hg, level - 1, low1)
        else:
            low2 = self.block(hg._modules["b2_plus_1"], low1)
        if self.streams is not None:
            main.wait_stream(side)
        return self.block_merge(hg._modules[f"b3_{level}"], low2, up1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        model = self.model
        x = self.stem(model, x)
        previous, features, heat = x, [], x
        for i in range(model.n_stacks):
            hg = self._level(model._modules[f"m{i}"], self.depth, previous)
            ll, heat, previous = self.stack_tail(model, i, hg, previous)
            features.append(ll)
        if self.streams is None:
            return self.pack(self.heat_part(heat), self.head(model, x, features, heat))
        # The landmark decoding needs only the heatmaps: off the critical path, beside the head.
        side, main = self.streams[0], torch.cuda.current_stream(heat.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            heat_part = self.heat_part(heat)
        heat.record_stream(side)
        heat_part.record_stream(main)
        out = self.head(model, x, features, heat)
        main.wait_stream(side)
        return self.pack(heat_part, out)
