"""The inference engine: EmoNet as fast as the device allows, one object the tools share.

Fast modes, each a switch: reduced precision (fp16/bf16/tf32), channels_last, exact folding (BatchNorm
where a BN directly follows a convolution: stem ``conv1``->``bn1`` and ``conv_last{i}``->``bn_end{i}``;
every other BN precedes its ReLU and convolution and cannot be folded exactly; and the 1x1 convolutions
after each hourglass composed with the head's input convolution, :func:`fold_stack_tails`; on CUDA, each
stack's last 1x1 convolution, BN and ReLU as one matrix product, :func:`fuse_stack_ends`),
``torch.compile`` with its caches on disk (its 2x2 max pools written so they fuse into the kernel that
feeds them, :func:`pointwise_max_pools`), and CUDA graphs for fixed batch sizes (a smaller
batch is padded up to the next captured size). A warm-up at load time pays cuDNN autotuning,
compilation and graph capture before the first real frame, and its cost is reported on its own.
It returns what the tools report (landmarks decoded on the device, expression logits, valence and
arousal); the heatmaps those landmarks come from only with ``EngineConfig(heatmaps=True)``.
"""
from __future__ import annotations

import contextlib
import copy
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import precompile
from .geometry import heatmap_coords
from .models import EmoNet
from .models.emonet import Conv1x1ReLU, MaxPool2x2
from .runtime import RuntimeConfig


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs EmoNet. ``EngineConfig()`` is the plain eager fp32 model."""

    precision: str = "fp32"                 # fp32 | tf32 | fp16 | bf16
    channels_last: bool = False
    fold_bn: bool = False                   # exact folding: BNs into convolutions, 1x1 convolutions composed
    compile: Optional[str] = None           # None | "default" | "max-autotune" | "aot" (AOTInductor package)
    freeze: bool = False                    # inductor freezing: constant-folds weights, but bypasses the on-disk graph cache
    cuda_graphs: bool = False
    batch_sizes: Sequence[int] = (1,)       # captured (graphs) or warmed-up batch sizes; larger input is chunked
    dynamic_batch: bool = True              # compile: one graph for every batch > 1 (False: one per batch size)
    streams: int = 0                        # batches up to this size run the hourglass skip branches on side CUDA streams
    # With side streams, cuDNN's autotuned kernels ran batch 1 slower than its heuristic picks (H100: 0.99
    # against 0.91 ms) and autotuning cost warm starts 2-3 s; the large batches keep autotuning.
    autotune_streamed: bool = False         # True: cudnn.benchmark decides for the streamed batches too
    share_graph_pool: bool = True           # CUDA graphs: one memory pool for all, captured largest first
    warmup: bool = True
    tune_kernels: bool = False              # compile: tune the whole-model graph's Triton kernels on the device
    heatmaps: bool = False                  # also return the 68 heatmaps (N, 68, 64, 64); landmarks always
    precompile: bool = True                 # compile: keep Dynamo's tracing on disk too (emonet.precompile)
    cache_dir: Optional[str] = None         # torch.compile caches; default ~/.cache/emonet/compile

    @property
    def name(self) -> str:
        """Short label, e.g. 'fp16+cl+fold+graph'."""
        parts = [self.precision]
        if self.channels_last:
            parts.append("cl")
        if self.fold_bn:
            parts.append("fold")
        if self.compile:
            parts.append("compile" if self.compile == "default" else self.compile)
            if self.tune_kernels:
                parts.append("tuned")
            if not self.dynamic_batch:
                parts.append("static")
            if not self.precompile:
                parts.append("retrace")
        if self.streams and self.autotune_streamed:
            parts.append("autotuned-streams")
        if self.heatmaps:
            parts.append("heatmaps")
        if self.cuda_graphs:
            parts.append("graph" if self.share_graph_pool else "graph-pools")
        return "+".join(parts)


PRESETS: Dict[str, EngineConfig] = {
    "eager": EngineConfig(),
    "fast": EngineConfig(precision="fp16", channels_last=True, fold_bn=True, cuda_graphs=True),
    "compiled": EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="default",
                             streams=8, cuda_graphs=True),
    "tuned": EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="default",
                          streams=8, cuda_graphs=True, tune_kernels=True),
    "max": EngineConfig(precision="fp16", channels_last=True, fold_bn=True, compile="max-autotune",
                        streams=8, cuda_graphs=True),
}


def compile_options(config: EngineConfig, device: torch.device, piece: str = "model") -> Dict[str, object]:
    """Inductor settings for one of this engine's ``torch.compile`` calls (``piece``: ``"model"``, the whole
    forward, or a piece of the streamed forward), passed per call (never set globally)."""
    import torch._inductor
    mode = "max-autotune-no-cudagraphs" if config.compile == "max-autotune" else "default"
    options: Dict[str, object] = {**torch._inductor.list_mode_options(mode), "freezing": config.freeze}
    if torch.device(device).type == "cuda":
        # A concatenation lowered as a kernel of its own gets a plain NCHW buffer whose producers
        # write straight into it: the head's concatenation then made the stem's output, and every
        # kernel reading it, NCHW, all transposing channels_last data (H100, batch 256: 6,728 ->
        # 6,923 crops/s with this off -> on; docs/PERFORMANCE.md). As a pointwise kernel its
        # layout follows its consumer, the convolution: channels_last.
        options["force_pointwise_cat"] = True
        # tune_kernels: half the GPU time at large batch is Triton elementwise kernels, bound by memory
        # bandwidth; tuning each one's block sizes on the device pays there (H100, batch 256: +1.7 %),
        # but made the small batches' streamed pieces slower (batch 1: 0.95 -> 0.98 ms), and a process
        # that loads the saved compiled code tunes some kernels again (run 18: 14 s of a warm start),
        # hence opt-in, for long large-batch runs (docs/PERFORMANCE.md, eighth session).
        options["coordinate_descent_tuning"] = config.tune_kernels and piece == "model"
    return options


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A convolution equal to ``bn(conv(x))`` with BN in inference mode."""
    fused = copy.deepcopy(conv)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    with torch.no_grad():
        fused.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
        fused.bias = nn.Parameter((bias - bn.running_mean) * scale + bn.bias)
    return fused


def fold_batchnorm(model: EmoNet, inplace: bool = False) -> EmoNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) with each BatchNorm that directly follows a
    convolution folded into it."""
    model = (model if inplace else copy.deepcopy(model)).eval()
    pairs = [("conv1", "bn1")] + [(f"conv_last{i}", f"bn_end{i}") for i in range(model.n_stacks)]
    for conv_name, bn_name in pairs:
        setattr(model, conv_name, _fold(getattr(model, conv_name), getattr(model, bn_name)))
        setattr(model, bn_name, nn.Identity())
    return model


def _conv1x1(weight: torch.Tensor, bias: torch.Tensor, like: nn.Conv2d) -> nn.Conv2d:
    conv = nn.Conv2d(weight.shape[1], weight.shape[0], kernel_size=1).to(like.weight.device)
    conv.weight.copy_(weight[:, :, None, None].to(like.weight.dtype))
    conv.bias.copy_(bias.to(like.weight.dtype))
    return conv


@torch.no_grad()
def fold_stack_tails(model: EmoNet, inplace: bool = False) -> EmoNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) whose 1x1 convolutions after each hourglass and at
    the head's input are composed.

    After stack ``i`` the network computes ``r`` and from it, with 1x1 convolutions ``B`` (bl), ``L`` (l)
    and ``A`` (al): the feature ``f_i = B r`` for the head and ``previous + B r + A L r`` for the next
    stack; the 68-channel heatmap ``L r`` has no other use there. The head's input convolution ``W``
    reads the concatenation ``[x, m * f_0, m * f_1]`` (``m``, the attention mask, is per pixel), which
    equals ``W_x x + m * sum_i W_i f_i``. All of it is linear, so each stack runs one convolution whose
    outputs are ``[W_i B_i; B_i + A_i L_i]`` (the last stack, which has no ``B`` or ``A``: ``[W_i; L_i]``,
    padded to a multiple of 8 channels), composed in float64, and the head adds the terms. The
    768-channel concatenation (1.6 GB at batch 256) and the 68-channel tensors between the stacks,
    which no kernel reads or writes at full speed, are gone; ``r`` is read once.
    """
    model = (model if inplace else copy.deepcopy(model)).eval()
    head = model.conv1x1_input_emo_2
    w_head = head.weight.double()[:, :, 0, 0]
    n = model.conv_last0.out_channels
    w_stack = [w_head[:, n * (i + 1):n * (i + 2)] for i in range(model.n_stacks)]
    last = model.n_stacks - 1
    for i in range(model.n_stacks):
        w_l, b_l = model._modules[f"l{i}"].weight.double()[:, :, 0, 0], model._modules[f"l{i}"].bias.double()
        like = model._modules[f"l{i}"]
        if i < last:
            bl, al = model._modules[f"bl{i}"], model._modules[f"al{i}"]
            w_b, b_b = bl.weight.double()[:, :, 0, 0], bl.bias.double()
            w_a, b_a = al.weight.double()[:, :, 0, 0], al.bias.double()
            weight = torch.cat([w_stack[i] @ w_b, w_b + w_a @ w_l])
            bias = torch.cat([w_stack[i] @ b_b, b_b + w_a @ b_l + b_a])
        else:
            w_f, b_f = w_stack[i], w_l.new_zeros(w_stack[i].shape[0])
            if not model.attention:  # the heatmap is one more input of the head's convolution
                w_heat = w_head[:, n * (i + 2):]
                w_f, b_f = w_f + w_heat @ w_l, w_heat @ b_l
            pad = -(w_f.shape[0] + w_l.shape[0]) % 8  # output channels a multiple of 8: aligned kernels
            weight = torch.cat([w_f, w_l, w_l.new_zeros(pad, w_l.shape[1])])
            bias = torch.cat([b_f, b_l, b_l.new_zeros(pad)])
        model.add_module(f"tail{i}", _conv1x1(weight, bias, like))
        for key in (f"bl{i}", f"l{i}", f"al{i}"):
            if key in model._modules:
                model._modules[key] = None  # unused now; their weights live in tail{i}
    model.add_module("head_x", _conv1x1(w_head[:, :n], head.bias.double(), head))
    model.conv1x1_input_emo_2 = None
    return model


@torch.no_grad()
def pad_stem_input(model: EmoNet, inplace: bool = False) -> EmoNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) whose first convolution takes a fourth, all-zero
    input channel (exact).

    cuDNN's kernels for the 7x7 stem convolution read NHWC input in groups of four channels: given three,
    it first copies the input into a padded buffer with a kernel of its own. :func:`model_input` writes
    the fourth channel while it converts the crops, so that copy disappears.
    """
    model = model if inplace else copy.deepcopy(model)
    conv = model.conv1
    padded = nn.Conv2d(4, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                       bias=conv.bias is not None).to(conv.weight.device, conv.weight.dtype)
    padded.weight.zero_()
    padded.weight[:, :3].copy_(conv.weight)
    if conv.bias is not None:
        padded.bias.copy_(conv.bias)
    model.conv1 = padded
    return model


def pointwise_max_pools(model: EmoNet, inplace: bool = False) -> EmoNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) whose 2x2 max-pooling modules are
    :class:`~emonet.models.emonet.MaxPool2x2` (exact), for compiled engines.

    The stem's last block and each of the emotion head's blocks feed only a pooling. Inductor's
    max-pool lowering writes such a block's output at full size and reads it back; as elementwise
    maxima the pooling fuses into the kernel that adds the block's branches, which then writes a
    quarter of that (H100, batch 256: the stem's block output alone is 1 GB written and read again).
    The hourglasses' pools keep ``F.max_pool2d``: their input is kept anyway for the skip branch.
    """
    model = model if inplace else copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, nn.MaxPool2d) and child.kernel_size in (2, (2, 2))
                    and child.stride in (2, (2, 2)) and child.padding in (0, (0, 0))
                    and child.dilation in (1, (1, 1)) and not child.ceil_mode and not child.return_indices):
                setattr(parent, name, MaxPool2x2())
    return model


@torch.no_grad()
def fuse_stack_ends(model: EmoNet, inplace: bool = False) -> EmoNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) in which each stack's ``relu(bn_end(conv_last(.)))``
    is one :class:`~emonet.models.emonet.Conv1x1ReLU` (exact up to rounding), for CUDA engines.

    The BN is folded into the 1x1 convolution and the ReLU becomes the matrix product's epilogue, so
    the 256-channel 64x64 result is written once instead of written, read and written again by a
    separate ReLU pass (H100, batch 256: 1 GB per stack).
    """
    model = (model if inplace else copy.deepcopy(model)).eval()
    for i in range(model.n_stacks):
        conv, bn = model._modules[f"conv_last{i}"], model._modules[f"bn_end{i}"]
        if isinstance(bn, nn.BatchNorm2d):
            conv = _fold(conv, bn)
        model.add_module(f"last{i}", Conv1x1ReLU(conv.weight, conv.bias))
        model._modules[f"conv_last{i}"] = model._modules[f"bn_end{i}"] = None  # their weights live in last{i}
    return model


def _compile_cache_dir(config: EngineConfig) -> Path:
    if config.cache_dir:
        return Path(config.cache_dir)
    return Path(os.environ.get("EMONET_HOME", Path.home() / ".cache" / "emonet")) / "compile"


# The compiled pieces are plain functions that take their module as an argument: compiled code then
# takes the weights as inputs, so one compilation serves every module of the same shape, and a
# precompiled artifact holds no weights (emonet.precompile).
def model_input(model: EmoNet, x: torch.Tensor) -> torch.Tensor:
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


def _whole_from_dict(out: Dict[str, torch.Tensor], heatmaps: bool = False) -> torch.Tensor:
    return _pack((_heat_part if heatmaps else _landmark_part)(out["heatmap"]), out)


def _whole(model: EmoNet, x: torch.Tensor) -> torch.Tensor:
    # Decoding and packing inside the compiled code: Inductor writes each result straight into the
    # packed buffer, and the landmark decoding is a few fused kernels instead of some forty.
    return _whole_from_dict(model(model_input(model, x)))


def _whole_heatmaps(model: EmoNet, x: torch.Tensor) -> torch.Tensor:
    return _whole_from_dict(model(model_input(model, x)), heatmaps=True)


def _stem(model: EmoNet, x: torch.Tensor) -> torch.Tensor:
    return model.stem(model_input(model, x))


def _stack_tail(model: EmoNet, i: int, hg: torch.Tensor, previous: torch.Tensor):
    return model.stack_tail(i, hg, previous)


def _head(model: EmoNet, x: torch.Tensor, features: list, heat: torch.Tensor) -> Dict[str, torch.Tensor]:
    return model.head(x, features, heat)


def _block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


def _pool_block(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(F.max_pool2d(x, 2, stride=2))


def _block_merge(block: nn.Module, x: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return up + F.interpolate(block(x), scale_factor=2, mode="nearest")


@contextlib.contextmanager
def _no_cudnn_autotuning() -> Iterator[None]:
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

    def __init__(self, model: EmoNet, device: torch.device, wrap=lambda fn, name, mark=None: fn,
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


class Engine:
    """Runs EmoNet on batches of 256x256 crops; ``engine(crops)`` returns float32 outputs on the device.

    ``crops``: ``(N, 3, 256, 256)``, uint8 in [0, 255] or float in [0, 1], on any device.
    """

    def __init__(self, model: EmoNet, device: torch.device | str, config: EngineConfig = EngineConfig(),
                 log=None) -> None:
        self.device = torch.device(device)
        self.requested = config
        self.config = self._available(config)
        self.n_expression = model.n_expression
        self.class_names = model.class_names
        self.untrained = model.untrained
        self.weights_source = model.weights_source
        self.warmup_ms: Optional[float] = None
        self._log = log or (lambda msg: print(msg, file=sys.stderr))
        self._dtype = RuntimeConfig(precision=self.config.precision).dtype

        net = copy.deepcopy(model).eval()  # the one copy: the transforms below change it in place
        if self.config.fold_bn:
            fold_stack_tails(fold_batchnorm(net, inplace=True), inplace=True)
        if self.device.type == "cuda" and self.config.channels_last:
            pad_stem_input(net, inplace=True)
            if self.config.fold_bn:
                fuse_stack_ends(net, inplace=True)
        if self.config.compile:
            pointwise_max_pools(net, inplace=True)
        net = net.to(self.device, self._dtype)
        if self.config.channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.model = net
        self._compiled = self.config.compile in ("default", "max-autotune")
        compile_fn = self._compiler() if self._compiled else (lambda fn, name, mark=None: fn)
        pieces = []

        def wrap(fn, name, mark=None):
            pieces.append(compile_fn(fn, name, mark))
            return pieces[-1]

        if self.config.compile == "aot":
            package = self._aot_package(net)
            self._forward = lambda x: _whole_from_dict(package(x), self.config.heatmaps)
        else:
            whole = wrap(_whole_heatmaps if self.config.heatmaps else _whole, "model", self._mark_batch)
            self._forward = lambda x: whole(net, x)
        self._streamed = (StreamedForward(net, self.device, wrap, self.config.heatmaps) if self.config.streams
                          else None)
        self._precompiled = [p for p in pieces if isinstance(p, precompile.Precompiled)]
        self._graphs: Dict[tuple, tuple] = {}  # (batch size, input dtype) -> (graph, static input, static outputs)
        self._static_inputs: Dict[torch.dtype, torch.Tensor] = {}
        self._graph_pool = None
        self._capture_stream: Optional[torch.cuda.Stream] = None
        if self.config.warmup:
            self.warmup()

    # -- configuration -------------------------------------------------------------------------
    def _available(self, config: EngineConfig) -> EngineConfig:
        """Drop the modes this device cannot run, saying so once."""
        cuda = self.device.type == "cuda"
        changes, notes = {}, []
        if config.cuda_graphs and not cuda:
            changes["cuda_graphs"] = False
            notes.append("CUDA graphs need a GPU")
        if config.streams and not cuda:
            changes["streams"] = 0
            notes.append("side streams need a GPU")
        if config.precision == "fp16" and not cuda:
            changes["precision"] = "bf16"  # fp16 convolutions on the CPU are slow or missing
            notes.append("fp16 on the CPU runs as bf16")
        elif config.precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
            changes["precision"] = "fp16"
            notes.append("this GPU has no bf16; using fp16")
        if config.compile == "aot" and cuda and not os.environ.get("EMONET_ALLOW_AOT_CUDA"):
            # Seen 2026-11-22 on an H100 with torch 2.11+cu130: the package built, then loading it
            # segfaulted inside torch's aoti_load_package, a two-convolution network's too
            # (docs/bench/aoti_check.py). A crash cannot be caught, so refuse up front.
            raise ValueError("compile='aot' is disabled on CUDA: loading the AOTInductor package crashed torch "
                             "2.11 (docs/PERFORMANCE.md); use compile='default', or set EMONET_ALLOW_AOT_CUDA=1 "
                             "to try it on another torch")
        if notes:
            print(f"engine: {'; '.join(notes)}", file=sys.stderr)
        return replace(config, **changes)

    def _mark_batch(self, args: tuple) -> None:
        if self.config.dynamic_batch and args[1].shape[0] > 1:
            # One compiled graph serves every batch size > 1 (1 is always specialised): convolutions
            # stay cuDNN calls chosen at run time, so a dynamic batch costs little and saves a
            # compilation per size. dynamic_batch=False trades those compilations for kernels
            # specialised to each size (the benchmark measures both).
            torch._dynamo.mark_dynamic(args[1], 0)

    def _compiler(self):
        """``wrap(fn, name)``: ``fn`` compiled with this engine's settings and caches."""
        cache = _compile_cache_dir(self.config)
        cache.mkdir(parents=True, exist_ok=True)
        # Inductor reads these when it first compiles: a second process then reuses the compiled
        # kernels and autotuning results instead of paying for them again.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
        os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
        os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
        os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
        options = compile_options(self.config, self.device)
        # dynamic=False: a new batch size gets its own specialised graph unless marked dynamic (dynamo
        # keeps up to 8 graphs per function, more than the batch sizes the tools use).
        if self.config.streams:
            # The streamed forward compiles one function per kind of piece (a block, a block after a
            # pooling, ...) and each is specialised to several feature-map sizes and batch sizes.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        folder = None
        if self.config.precompile and not self.config.freeze:  # frozen code holds the weights: never saved
            # Keyed by all the compiled code depends on; the weights are inputs, so not by them.
            sources = [Path(__file__).read_bytes(), Path(sys.modules[EmoNet.__module__].__file__).read_bytes()]
            device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
            c = self.config
            # Not the batch sizes: the compiled functions are specialised to those as they are called.
            code = (c.precision, c.channels_last, c.fold_bn, c.compile, c.freeze, c.heatmaps, sorted(options.items()))
            folder = cache / "precompiled" / precompile.code_digest(device_name, code, *sources)
        # The whole-model graph and the streamed forward's pieces differ in their options (tune_kernels).
        piece_options = compile_options(self.config, self.device, "piece")
        wraps = {kind: precompile.compiler(folder, self._log, options=opts, dynamic=False)
                 for kind, opts in (("model", options), ("piece", piece_options))}
        return lambda fn, name, mark=None: wraps["model" if name == "model" else "piece"](fn, name, mark)

    def _aot_package(self, net: nn.Module):
        """Load (building it once) an AOTInductor package of ``net``: compiled code with no tracing at start.

        The package is keyed by everything that changes the code or the weights baked into it.
        """
        import hashlib
        from torch.export import Dim

        digest = hashlib.sha1()
        for key, value in net.state_dict().items():
            digest.update(key.encode())
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        digest.update(f"{torch.__version__}|{torch.version.cuda}|{device_name}|{self.config.name}".encode())
        folder = _compile_cache_dir(self.config) / "aot"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"emonet-{digest.hexdigest()[:20]}.pt2"
        if not path.is_file():
            self._log(f"engine: building the AOTInductor package {path.name} (once; minutes)")
            example = self._prepare(torch.zeros(2, 3, 256, 256, dtype=torch.uint8))
            with torch.inference_mode(False), torch.no_grad():
                exported = torch.export.export(net, (example,), dynamic_shapes=({0: Dim("batch", min=1, max=1024)},))
                tmp = path.with_name(f".{path.name}.{os.getpid()}.partial.pt2")
                torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp))
            os.replace(tmp, path)
        return torch._inductor.aoti_load_package(str(path))

    @property
    def precompiled(self) -> Optional[Dict[str, int]]:
        """Compiled functions loaded from disk and compiled in this process (None: not precompiling)."""
        if not self._precompiled:
            return None
        return {"loaded": sum(p.loaded for p in self._precompiled),
                "compiled": sum(p.compiled for p in self._precompiled)}

    # -- running -------------------------------------------------------------------------------
    def _prepare(self, crops: torch.Tensor) -> torch.Tensor:
        x = crops.to(self.device, non_blocking=True)
        if self._compiled:
            return x  # the compiled code scales it (emonet.engine.model_input)
        return model_input(self.model, x)

    def _call_model(self, x: torch.Tensor) -> torch.Tensor:
        """The packed outputs (:func:`split_outputs`) of the model on prepared input."""
        if self._streamed is not None and x.shape[0] <= self.config.streams:
            # The kernels chosen here (at warm-up) are the ones the graph keeps.
            with contextlib.nullcontext() if self.config.autotune_streamed else _no_cudnn_autotuning():
                return self._streamed(x)
        return self._forward(x)

    def _run_eager(self, crops: torch.Tensor) -> Dict[str, torch.Tensor]:
        with torch.inference_mode():
            return self._split(self._call_model(self._prepare(crops)))

    def _capture(self, batch: int, dtype_in: torch.dtype) -> tuple:
        # Every graph reads the front of one input buffer, and with share_graph_pool allocates from one
        # memory pool: they replay one at a time, on one stream, and each result is copied out right
        # after its replay, so a graph may reuse what another's intermediates used. Captured largest
        # first (warmup), the smaller graphs fit in the largest one's memory (docs/PERFORMANCE.md).
        if dtype_in not in self._static_inputs:
            self._static_inputs[dtype_in] = torch.zeros(max(self.config.batch_sizes), 3, 256, 256,
                                                        device=self.device, dtype=dtype_in)
        static_in = self._static_inputs[dtype_in][:batch]
        if self._graph_pool is None and self.config.share_graph_pool:
            self._graph_pool = torch.cuda.graph_pool_handle()
        # A high-priority capture stream: with side streams, the critical path gets the SMs first
        # (measured on an H100 at batch 1: 0.980 against 0.991 ms; no change without side streams).
        # One for every graph: cuBLAS keeps a workspace per stream it runs on (32 MiB on Hopper), and
        # a stream per batch size held 7 of them, 224 MB (docs/bench/warm_start.py).
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(self.device, priority=-1)
        stream = self._capture_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # autotuning and compilation happen here, outside the capture
                self._call_model(self._prepare(static_in))
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool, stream=stream), torch.inference_mode():
            static_out = self._call_model(self._prepare(static_in))
        return graph, static_in, static_out

    def _split(self, flat: torch.Tensor) -> Dict[str, torch.Tensor]:
        return split_outputs(flat, self.n_expression)

    def _run_fixed(self, crops: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Pad to the next configured batch size: graphs and compiled code are specialised to shapes."""
        n = crops.shape[0]
        batch = min(b for b in self.config.batch_sizes if b >= n)
        if not self.config.cuda_graphs:
            if n < batch:
                crops = torch.cat([crops, crops[-1:].expand(batch - n, -1, -1, -1)])
            return {k: v[:n] for k, v in self._run_eager(crops).items()}
        key = (batch, crops.dtype)
        if key not in self._graphs:
            self._graphs[key] = self._capture(batch, crops.dtype)
        graph, static_in, static_out = self._graphs[key]
        static_in[:n].copy_(crops, non_blocking=True)  # rows past n keep old data: BN is per-sample
        graph.replay()
        return self._split(static_out[:n].clone())

    def __call__(self, crops: torch.Tensor) -> Dict[str, torch.Tensor]:
        """EmoNet on ``(N, 3, 256, 256)`` uint8 crops: landmarks ``(N, 68, 2)`` in crop pixels (decoded
        from the heatmaps, spec §5), expression logits, valence and arousal, and with
        ``EngineConfig(heatmaps=True)`` the heatmaps ``(N, 68, 64, 64)``; float32."""
        if crops.ndim != 4 or tuple(crops.shape[1:]) != (3, 256, 256):
            raise ValueError(f"expected crops of shape (N, 3, 256, 256), got {tuple(crops.shape)}")
        if crops.shape[0] == 0:
            return {k: v[:0] for k, v in self._run_eager(crops[:1].new_zeros(1, 3, 256, 256)).items()}
        if not (self.config.cuda_graphs or self.config.compile):
            return self._run_eager(crops)
        largest = max(self.config.batch_sizes)
        outs = [self._run_fixed(crops[i:i + largest]) for i in range(0, crops.shape[0], largest)]
        if len(outs) == 1:
            return outs[0]
        return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}

    def warmup(self, dtype_in: torch.dtype = torch.uint8) -> float:
        """Run every configured batch size once so real frames do not pay autotuning; returns ms."""
        t0 = time.perf_counter()
        for batch in sorted(self.config.batch_sizes, reverse=True):  # largest first: see _capture
            self(torch.zeros(batch, 3, 256, 256, dtype=dtype_in, device=self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warmup_ms = (time.perf_counter() - t0) * 1e3
        paid = [name for name, on in (("cuDNN autotuning", self.device.type == "cuda"),
                                      ("compilation", self._compiled),
                                      ("CUDA graph capture", self.config.cuda_graphs)) if on]
        self._log(f"engine warm-up ({self.config.name}, batch sizes "
                  f"{', '.join(map(str, self.config.batch_sizes))}): {self.warmup_ms / 1e3:.2f} s "
                  f"({', '.join(paid) or 'first-call allocations'}), paid once at load")
        return self.warmup_ms


@dataclass
class Agreement:
    """How a fast mode's outputs compare with fp32 eager on the same crops."""

    n: int
    argmax_agreement: float
    max_valence_diff: float
    max_arousal_diff: float
    tolerance: float = 0.01

    @property
    def ok(self) -> bool:
        """Same arg-max everywhere; valence and arousal within the tolerance."""
        return (self.argmax_agreement == 1.0 and self.max_valence_diff <= self.tolerance
                and self.max_arousal_diff <= self.tolerance)

    def format(self) -> str:
        """One line for reports."""
        return (f"{'OK' if self.ok else 'MISMATCH'}: arg-max agreement {self.argmax_agreement:.0%} "
                f"over {self.n} crops, max |dV| {self.max_valence_diff:.4f}, max |dA| "
                f"{self.max_arousal_diff:.4f} (tolerance {self.tolerance})")


def compare(engine: Engine, reference: EmoNet, crops: torch.Tensor) -> Agreement:
    """Compare ``engine`` with the fp32 eager ``reference`` model on ``crops`` (uint8 or float in [0, 1])."""
    ref_dev = next(reference.parameters()).device
    x = crops.float() / 255.0 if crops.dtype == torch.uint8 else crops.float()
    with torch.inference_mode():
        ref = reference.float().eval()(x.to(ref_dev))
    got = engine(crops)
    ref_cls = ref["expression"].argmax(1).cpu()
    got_cls = got["expression"].argmax(1).cpu()
    def diff(key: str) -> float:
        return float((got[key].cpu().clamp(-1, 1) - ref[key].cpu().clamp(-1, 1)).abs().max())
    return Agreement(n=len(crops), argmax_agreement=float((ref_cls == got_cls).float().mean()),
                     max_valence_diff=diff("valence"), max_arousal_diff=diff("arousal"))
