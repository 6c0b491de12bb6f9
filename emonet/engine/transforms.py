"""Exact transforms that turn EmoNet into the engine's own network (:class:`EngineNet`).

Each one computes the same function (up to rounding) with fewer kernels or bytes: BatchNorm folded into
the convolution before it, the 1x1 convolutions after each hourglass composed with the head's input
convolution, a fourth zero input channel for cuDNN's NHWC stem kernels, 2x2 max pools as elementwise
maxima that fuse when compiled, and each stack's last 1x1 convolution + BN + ReLU as one matrix product.
The pure network (:mod:`emonet.models.emonet`) knows nothing of them.
"""
from __future__ import annotations

import copy
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..models.emonet import N_LANDMARKS, EmoNet


class MaxPool2x2(nn.Module):
    """2x2 max pooling with stride 2, written as the maximum of four strided views (equal to
    ``F.max_pool2d(x, 2, 2)``).

    Compiled, it fuses into the kernel that produces its input, so a tensor used only by the pooling is
    never written at full size; Inductor's own max-pool lowering writes it first. Eager, it is four
    kernels instead of one, which is why only compiled engines use it (:func:`pointwise_max_pools`).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
        return torch.maximum(torch.maximum(x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2]),
                             torch.maximum(x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]))


class Conv1x1ReLU(nn.Module):
    """``relu(conv1x1(x) + bias)`` as one matrix product whose epilogue adds the bias and applies the ReLU.

    On CUDA, ``torch._addmm_activation`` runs it as a cuBLASLt product with a bias + ReLU epilogue: the
    output is written once, already activated, where a convolution followed by a ReLU writes it, reads
    it and writes it again. Channels_last input is a plain matrix view; the output is channels_last.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.reshape(weight.shape[0], -1).clone())  # (out, in)
        self.bias = nn.Parameter(bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        y = torch._addmm_activation(self.bias, x.permute(0, 2, 3, 1).reshape(-1, c), self.weight.t())
        return y.view(n, h, w, -1).permute(0, 3, 1, 2)


class EngineNet(EmoNet):
    """EmoNet whose stack tails and head also run the folded forms the transforms below leave behind.

    Where a transform replaced modules (``tail{i}``, ``head_x``, ``last{i}``), the replaced ones are
    ``None``; untransformed, it computes exactly what :class:`EmoNet` does.
    """

    def stack_tail(self, i: int, hg: torch.Tensor, previous: torch.Tensor):
        """After stack ``i``'s hourglass: its features, its heatmap and the next stack's input."""
        last, folded = self._modules.get(f"last{i}"), self._modules.get(f"tail{i}")
        if last is None and folded is None:
            return super().stack_tail(i, hg, previous)
        ll = self._modules[f"top_m_{i}"](hg)
        ll = last(ll) if last is not None else F.relu(self._modules[f"bn_end{i}"](self._modules[f"conv_last{i}"](ll)))
        if folded is None:
            heat = self._modules[f"l{i}"](ll)
            if i < self.n_stacks - 1:
                ll = self._modules[f"bl{i}"](ll)
                previous = previous + ll + self._modules[f"al{i}"](heat)
            return ll, heat, previous
        # Its first channels are the head's term for this stack (fold_stack_tails); then, before the
        # last stack, bl(.) + al(l(.)) (that heatmap has no other use), and in the last stack the heatmap.
        out = folded(ll)
        n = ll.shape[1]
        if i < self.n_stacks - 1:
            return out[:, :n], None, previous + out[:, n:]
        return out[:, :n], out[:, n:n + N_LANDMARKS], previous

    def head(self, x: torch.Tensor, features: list, heat: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The emotion head; with ``head_x``, its input convolution distributed over the concatenation."""
        folded = self._modules.get("head_x")
        if folded is None:
            return super().head(x, features, heat)
        # Each stack's term arrives ready in ``features``; the attention mask is per pixel.
        terms = sum(features[1:], features[0])
        emo = folded(x) + (terms * heat.sum(dim=1, keepdim=True) if self.attention else terms)
        return self.emotion(emo, heat)


def engine_net(model: EmoNet) -> EngineNet:
    """A copy of ``model`` as an :class:`EngineNet` (same weights, same device), ready for the transforms."""
    if isinstance(model, EngineNet):
        return copy.deepcopy(model)
    with torch.device("meta"):  # no random initialisation: every tensor comes from ``model``
        net = EngineNet(model.n_expression, model.attention)
    net.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    net.weights_source = model.weights_source
    return net.eval()


def _own(model: EmoNet, inplace: bool) -> EngineNet:
    if inplace:
        if not isinstance(model, EngineNet):
            raise TypeError("in-place transforms take an EngineNet (emonet.engine.engine_net(model))")
        return model.eval()
    return engine_net(model)


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A convolution equal to ``bn(conv(x))`` with BN in inference mode."""
    fused = copy.deepcopy(conv)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    with torch.no_grad():
        fused.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
        fused.bias = nn.Parameter((bias - bn.running_mean) * scale + bn.bias)
    return fused


def fold_batchnorm(model: EmoNet, inplace: bool = False) -> EngineNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) with each BatchNorm that directly follows a
    convolution folded into it."""
    model = _own(model, inplace)
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
def fold_stack_tails(model: EmoNet, inplace: bool = False) -> EngineNet:
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
    model = _own(model, inplace)
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
def pad_stem_input(model: EmoNet, inplace: bool = False) -> EngineNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) whose first convolution takes a fourth, all-zero
    input channel (exact).

    cuDNN's kernels for the 7x7 stem convolution read NHWC input in groups of four channels: given three,
    it first copies the input into a padded buffer with a kernel of its own. :func:`model_input` writes
    the fourth channel while it converts the crops, so that copy disappears.
    """
    model = _own(model, inplace)
    conv = model.conv1
    padded = nn.Conv2d(4, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                       bias=conv.bias is not None).to(conv.weight.device, conv.weight.dtype)
    padded.weight.zero_()
    padded.weight[:, :3].copy_(conv.weight)
    if conv.bias is not None:
        padded.bias.copy_(conv.bias)
    model.conv1 = padded
    return model


def pointwise_max_pools(model: EmoNet, inplace: bool = False) -> EngineNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) whose 2x2 max-pooling modules are
    :class:`MaxPool2x2` (exact), for compiled engines.

    The stem's last block and each of the emotion head's blocks feed only a pooling. Inductor's
    max-pool lowering writes such a block's output at full size and reads it back; as elementwise
    maxima the pooling fuses into the kernel that adds the block's branches, which then writes a
    quarter of that (at batch 256 the stem's block output alone is 1 GB written and read again).
    The hourglasses' pools keep ``F.max_pool2d``: their input is kept anyway for the skip branch.
    """
    model = _own(model, inplace)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, nn.MaxPool2d) and child.kernel_size in (2, (2, 2))
                    and child.stride in (2, (2, 2)) and child.padding in (0, (0, 0))
                    and child.dilation in (1, (1, 1)) and not child.ceil_mode and not child.return_indices):
                setattr(parent, name, MaxPool2x2())
    return model


@torch.no_grad()
def fuse_stack_ends(model: EmoNet, inplace: bool = False) -> EngineNet:
    """A copy of ``model`` (``inplace``: ``model`` itself) in which each stack's ``relu(bn_end(conv_last(.)))``
    is one :class:`Conv1x1ReLU` (exact up to rounding), for CUDA engines.

    The BN is folded into the 1x1 convolution and the ReLU becomes the matrix product's epilogue, so
    the 256-channel 64x64 result is written once instead of written, read and written again by a
    separate ReLU pass (at batch 256, 1 GB per stack).
    """
    model = _own(model, inplace)
    for i in range(model.n_stacks):
        conv, bn = model._modules[f"conv_last{i}"], model._modules[f"bn_end{i}"]
        if isinstance(bn, nn.BatchNorm2d):
            conv = _fold(conv, bn)
        model.add_module(f"last{i}", Conv1x1ReLU(conv.weight, conv.bias))
        model._modules[f"conv_last{i}"] = model._modules[f"bn_end{i}"] = None  # their weights live in last{i}
    return model
