"""Experiment (sixth session): convolutions with EmoNet's BatchNorm + ReLU fused in, as Triton kernels.

Not part of the package: measured slower than what the engine runs (docs/PERFORMANCE.md, "Sixth
session"). Kept so the numbers can be reproduced and the idea retried on another Triton or GPU.

    python docs/bench/fused_conv_experiment.py 256          # on a GPU: against cuDNN and Inductor
    TRITON_INTERPRET=1 python docs/bench/fused_conv_experiment.py --check   # CPU: correctness only

Every convolution inside a ConvBlock reads ``relu(bn(x))``. Run as separate kernels, each BN + ReLU
writes that activation to memory and the convolution reads it back. Here the convolution applies
BN + ReLU to each input tile as it loads it (a prologue), and its epilogue adds the block's residual and
writes straight into the block's output at the branch's channel offset, so the concatenation is never a
pass either. ``conv`` is one implicit-GEMM convolution (NHWC, stride 1, same padding, 1x1 or 3x3);
``FusedBlock`` is a whole ConvBlock out of three (four with a downsample).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from emonet.models.emonet import ConvBlock  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch ships no Triton
    triton = None


def available(device: torch.device) -> bool:
    """Whether the fused kernels can run on ``device``."""
    return triton is not None and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


if triton is not None:
    def _configs():
        out = []
        for bm, bn, bk, warps, stages in [(128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 64, 64, 4, 4),
                                          (256, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 64, 64, 4, 4),
                                          (128, 32, 64, 4, 4), (128, 64, 32, 4, 5), (128, 32, 32, 4, 5),
                                          (64, 32, 32, 4, 4)]:
            out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                                     num_warps=warps, num_stages=stages))
        return out

    def _prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}  # constexpr arguments arrive among kwargs
        c_in, c_out = args["C_IN"], args["C_OUT"]
        kept = [c for c in configs if c.kwargs["BLOCK_K"] <= c_in and c_in % c.kwargs["BLOCK_K"] == 0
                and c.kwargs["BLOCK_N"] <= max(c_out, 32)]
        return kept or configs[-1:]

    @triton.jit
    def _conv_kernel(X, Wt, SCALE, SHIFT, BIAS, RAW, RES, OUT,
                     M, H, W, raw_stride, res_stride, res_col, out_stride, out_col,
                     C_IN: tl.constexpr, C_OUT: tl.constexpr, KS: tl.constexpr, PRO: tl.constexpr,
                     HAS_BIAS: tl.constexpr, STORE_RAW: tl.constexpr, HAS_RES: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(C_OUT, BLOCK_N)
        # Grouped order: neighbouring programs share input rows in L2.
        group = GROUP_M * num_n
        first_m = (pid // group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % group) % size_m
        pid_n = (pid % group) // size_m

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_ok = offs_m < M
        n_ok = offs_n < C_OUT
        w_i = offs_m % W
        h_i = (offs_m // W) % H
        KB: tl.constexpr = C_IN // BLOCK_K
        PAD: tl.constexpr = KS // 2
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(KS * KS * KB):
            tap = kk // KB
            c0 = (kk % KB) * BLOCK_K
            dy = tap // KS - PAD
            dx = tap % KS - PAD
            ok = m_ok & (h_i + dy >= 0) & (h_i + dy < H) & (w_i + dx >= 0) & (w_i + dx < W)
            # In NHWC a neighbour is a fixed row offset away: (dy * W + dx) pixels.
            rows = offs_m + dy * W + dx
            a = tl.load(X + rows[:, None] * C_IN + (c0 + offs_k)[None, :], mask=ok[:, None], other=0.0)
            if PRO:
                scale = tl.load(SCALE + c0 + offs_k)
                shift = tl.load(SHIFT + c0 + offs_k)
                act = tl.maximum(a.to(tl.float32) * scale[None, :] + shift[None, :], 0.0)
                # The convolution pads the activation, not its input: zero outside the image.
                a = tl.where(ok[:, None], act, 0.0).to(X.dtype.element_ty)
            b = tl.load(Wt + (tap * C_IN + c0 + offs_k)[:, None] * C_OUT + offs_n[None, :],
                        mask=n_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)

        if HAS_BIAS:
            acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        mask = m_ok[:, None] & n_ok[None, :]
        if STORE_RAW:
            tl.store(RAW + offs_m[:, None] * raw_stride + offs_n[None, :], acc.to(RAW.dtype.element_ty), mask=mask)
        if HAS_RES:
            acc += tl.load(RES + offs_m[:, None] * res_stride + res_col + offs_n[None, :], mask=mask).to(tl.float32)
        tl.store(OUT + offs_m[:, None] * out_stride + out_col + offs_n[None, :], acc.to(OUT.dtype.element_ty),
                 mask=mask)


if triton is not None:
    _tuned_kernel = triton.autotune(configs=_configs(), key=["M", "C_IN", "C_OUT", "KS", "PRO", "STORE_RAW", "HAS_RES"],
                                    prune_configs_by={"early_config_prune": _prune})(_conv_kernel)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``(C_out, C_in, k, k)`` convolution weights as the kernel's ``(k*k*C_in, C_out)`` matrix."""
    c_out, c_in, kh, kw = weight.shape
    return weight.permute(2, 3, 1, 0).reshape(kh * kw * c_in, c_out).contiguous()


def bn_affine(bn: torch.nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Inference BatchNorm as float32 ``(scale, shift)``: ``bn(x) = x * scale + shift``."""
    scale = bn.weight.float() / torch.sqrt(bn.running_var.float() + bn.eps)
    return scale.contiguous(), (bn.bias.float() - bn.running_mean.float() * scale).contiguous()


def conv(x: torch.Tensor, wt: torch.Tensor, ks: int, scale: Optional[torch.Tensor] = None,
         shift: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
         raw: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None, res_col: int = 0,
         out: Optional[torch.Tensor] = None, out_col: int = 0,
         block: Optional[tuple[int, int, int]] = None) -> torch.Tensor:
    """``conv(relu(x * scale + shift))`` on NHWC ``x`` (a channels_last tensor), stride 1, same padding.

    ``wt`` from :func:`pack_weight`. Without ``scale`` there is no prologue. With ``raw`` the plain
    result is also stored there; with ``residual``, ``residual[..., res_col:res_col + C_out]`` is added
    before the result is stored into ``out[..., out_col:out_col + C_out]`` (a new tensor when ``out``
    is None). Tensors are seen as ``(pixels, channels)`` matrices, channels contiguous. ``block``
    fixes the tiles ``(BLOCK_M, BLOCK_N, BLOCK_K)`` instead of autotuning them.
    """
    n, c_in, h, w = x.shape
    c_out = wt.shape[1]
    m = n * h * w
    if m * max(c_in, c_out) >= 2**31:
        raise ValueError("batch too large for the fused kernels' 32-bit indexing; use smaller batches")
    if out is None:
        out = torch.empty(n, c_out, h, w, device=x.device, dtype=x.dtype, memory_format=torch.channels_last)
    dummy = wt
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(c_out, meta["BLOCK_N"]),)
    if block is None:
        kernel, meta = _tuned_kernel, {}
    else:  # fixed tiles, no autotuning (Triton's interpreter cannot time configurations)
        kernel, meta = _conv_kernel, dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), block), GROUP_M=8)
    kernel[grid](x, wt, scale if scale is not None else dummy, shift if shift is not None else dummy,
                       bias if bias is not None else dummy, raw if raw is not None else dummy,
                       residual if residual is not None else dummy, out,
                       m, h, w, raw.shape[1] if raw is not None else 0,
                       residual.shape[1] if residual is not None else 0, res_col, out.shape[1], out_col,
                       C_IN=c_in, C_OUT=c_out, KS=ks, PRO=scale is not None, HAS_BIAS=bias is not None,
                       STORE_RAW=raw is not None, HAS_RES=residual is not None, **meta)
    return out


class FusedBlock:
    """A ConvBlock's inference forward out of fused convolutions; equal to ``block(x)`` up to rounding."""

    def __init__(self, block: torch.nn.Module, dtype: torch.dtype, tiles: Optional[tuple[int, int, int]] = None) -> None:
        self.tiles = tiles
        def prep(conv_module, bn):
            scale, shift = bn_affine(bn)
            return pack_weight(conv_module.weight.detach()).to(dtype), scale, shift
        self.c1 = prep(block.conv1, block.bn1)
        self.c2 = prep(block.conv2, block.bn2)
        self.c3 = prep(block.conv3, block.bn3)
        self.ds = prep(block.downsample[2], block.downsample[0]) if block.downsample is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        c1, c2 = self.c1[0].shape[1], self.c2[0].shape[1]
        c_out = c1 + c2 + self.c3[0].shape[1]
        new = lambda c: torch.empty(n, c, h, w, device=x.device, dtype=x.dtype, memory_format=torch.channels_last)
        out, o1, o2 = new(c_out), new(c1), new(c2)
        t = self.tiles
        residual = x if self.ds is None else conv(x, self.ds[0], 1, self.ds[1], self.ds[2], block=t)
        conv(x, self.c1[0], 3, *self.c1[1:], raw=o1, residual=residual, res_col=0, out=out, out_col=0, block=t)
        conv(o1, self.c2[0], 3, *self.c2[1:], raw=o2, residual=residual, res_col=c1, out=out, out_col=c1, block=t)
        conv(o2, self.c3[0], 3, *self.c3[1:], residual=residual, res_col=c1 + c2, out=out, out_col=c1 + c2, block=t)
        return out


def check() -> None:
    """Fixed tiles, tiny shapes: the kernel against PyTorch (runs in Triton's CPU interpreter)."""
    torch.manual_seed(0)
    for cin, cout, ks, hw in [(64, 32, 3, 8), (32, 32, 3, 5), (64, 128, 1, 6)]:
        x = torch.randn(2, cin, hw, hw).contiguous(memory_format=torch.channels_last)
        w = torch.randn(cout, cin, ks, ks) / (cin * ks * ks) ** 0.5
        s, t = torch.rand(cin) + 0.5, torch.randn(cin) * 0.2
        ref = F.conv2d(torch.relu(x * s[None, :, None, None] + t[None, :, None, None]), w, padding=ks // 2)
        print(f"conv {cin}->{cout} k{ks}: max |diff| {(conv(x, pack_weight(w), ks, s, t, block=(16, 16, 16)) - ref).abs().max():.1e}")
    blk = ConvBlock(64, 128).eval()
    for m in blk.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 64, 6, 6).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        print(f"block 64->128: max |diff| {(FusedBlock(blk, torch.float32, (16, 16, 16))(x) - blk(x)).abs().max():.1e}")


def benchmark(B: int) -> None:
    """Each convolution shape at batch B: Inductor's BN+ReLU pass + cuDNN against the fused kernel."""
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)

    def timeit(fn, iters=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(3):
            a.record()
            for _ in range(iters):
                fn()
            b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) / iters)
        return sorted(ts)[1]

    bnrelu = torch.compile(lambda x, s, t: torch.relu(x * s[None, :, None, None] + t[None, :, None, None]).to(x.dtype))
    for (cin, cout, ks, hw) in [(256, 128, 3, 64), (128, 64, 3, 64), (64, 64, 3, 64), (128, 128, 3, 64), (64, 64, 3, 128),
                                (64, 32, 3, 128), (32, 32, 3, 128), (128, 256, 1, 64), (256, 256, 1, 64)]:
        x = torch.randn(B, cin, hw, hw, device=dev, dtype=torch.half).contiguous(memory_format=torch.channels_last)
        wgt = (torch.randn(cout, cin, ks, ks, device=dev) / (cin * ks * ks) ** 0.5).half().contiguous(memory_format=torch.channels_last)
        s = torch.rand(cin, device=dev) + 0.5; t = torch.randn(cin, device=dev) * 0.2
        y = bnrelu(x, s, t)
        flops = 2 * B * hw * hw * cout * cin * ks * ks
        t_bn = timeit(lambda: bnrelu(x, s, t))
        t_cd = timeit(lambda: F.conv2d(y, wgt, padding=ks // 2))
        wt = pack_weight(wgt)
        t0 = time.perf_counter(); got = conv(x, wt, ks, s, t); torch.cuda.synchronize(); tune = time.perf_counter() - t0
        t_tr = timeit(lambda: conv(x, wt, ks, s, t))
        t_tr_plain = timeit(lambda: conv(y, wt, ks))
        ref = F.conv2d(y, wgt, padding=ks // 2)
        err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        print(f"{cin:3d}->{cout:3d} k{ks} {hw:3d}^2: bn+relu {t_bn:.3f} + cudnn {t_cd:.3f} ({flops / t_cd / 1e9:.0f} TF/s) = {t_bn + t_cd:.3f} ms"
              f" | triton fused {t_tr:.3f} ({flops / t_tr / 1e9:.0f} TF/s), plain {t_tr_plain:.3f} | rel err {err:.1e} | tune {tune:.1f}s"
              f" | {_tuned_kernel.best_config}", flush=True)

    for (cin, cout, hw) in [(256, 256, 64), (64, 128, 128), (128, 256, 64)]:
        blk = ConvBlock(cin, cout).to(dev).eval()
        for m in blk.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2); m.running_var.uniform_(0.5, 1.5); m.weight.data.uniform_(0.5, 1.5); m.bias.data.uniform_(-0.2, 0.2)
        blk = blk.half().to(memory_format=torch.channels_last)
        x = torch.randn(B, cin, hw, hw, device=dev, dtype=torch.half).contiguous(memory_format=torch.channels_last)
        comp = torch.compile(blk)
        fb = FusedBlock(blk, torch.half)
        with torch.inference_mode():
            ref = comp(x); got = fb(x)
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            t_c = timeit(lambda: comp(x)); t_f = timeit(lambda: fb(x))
        print(f"block {cin}->{cout} {hw}^2: inductor {t_c:.3f} ms, fused {t_f:.3f} ms ({t_c / t_f:.2f}x) rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    else:
        benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
