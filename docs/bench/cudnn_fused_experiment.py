"""Experiment (seventh session): EmoNet's BN + ReLU run inside cuDNN's convolutions (graph API).

Not part of the package. Every convolution in a ConvBlock reads ``relu(bn(x))``; the engine writes that
activation with an elementwise kernel and the convolution reads it back, and those passes are half of
the batch-256 time (docs/PERFORMANCE.md, "Sixth session"). cuDNN's graph API can fuse a per-channel
scale, shift and ReLU into the convolution's operand load (a prologue). PyTorch does not expose it;
the cuDNN frontend's Python package does (``pip install nvidia-cudnn-frontend==1.16.0``, which uses the
libcudnn torch loaded). This script measures it (raw output of the seventh session's runs on an H100:
``docs/bench/h100-cudnn-fused.txt``):

    python docs/bench/cudnn_fused_experiment.py probe            # which forms of the graph cuDNN runs
    python docs/bench/cudnn_fused_experiment.py conv [BATCH]     # each ConvBlock convolution alone
    python docs/bench/cudnn_fused_experiment.py model [BATCH...] # whole compiled engine, fused vs not

``conv``: for each convolution shape of the network at ``BATCH`` (default 256): cuDNN's own convolution
(what the engine runs), that plus a BN + ReLU pass, and the fused graph with every engine plan cuDNN
offers timed; each checked against fp32. ``model``: the engine's compiled whole-model graph at each batch
size with a CUDA graph, as is and with every ConvBlock's BN + ReLU + convolution a fused cuDNN call (a
``torch.library`` custom op, so Inductor still fuses the concatenations and residual adds around it).
"""
from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from emonet.timing import time_calls  # noqa: E402

import cudnn  # noqa: E402  (after torch: reuses the libcudnn torch loaded)

CL = torch.channels_last
_HANDLES: dict = {}
_GRAPHS: dict = {}


def _handle():
    dev = torch.cuda.current_device()
    if dev not in _HANDLES:
        _HANDLES[dev] = cudnn.create_handle()
    return _HANDLES[dev]


def _nhwc(shape):
    n, c, h, w = shape
    return [h * w * c, 1, w * c, c]


class FusedConv:
    """``conv(relu(x * scale + shift), weight)`` as one cuDNN graph (NHWC, stride 1, 'same' padding)."""

    def __init__(self, x_shape, w_shape, dtype: torch.dtype, prologue: bool = True, float_affine: bool = False,
                 genstats: bool = False, every_engine: bool = False):
        io = cudnn.data_type.HALF if dtype == torch.float16 else cudnn.data_type.BFLOAT16
        self.handle = _handle()
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        n, c, h, w = x_shape
        k, _, r, s = w_shape
        self.X = g.tensor(name="X", dim=list(x_shape), stride=_nhwc(x_shape), data_type=io)
        self.W = g.tensor(name="W", dim=list(w_shape), stride=_nhwc(w_shape), data_type=io)
        a = self.X
        self.prologue = prologue
        if prologue:
            adt = cudnn.data_type.FLOAT if float_affine else io
            self.S = g.tensor(name="S", dim=[1, c, 1, 1], stride=[c, 1, c, c], data_type=adt)
            self.B = g.tensor(name="B", dim=[1, c, 1, 1], stride=[c, 1, c, c], data_type=adt)
            a = g.relu(input=g.bias(input=g.scale(input=a, scale=self.S), bias=self.B))
        self.Y = g.conv_fprop(image=a, weight=self.W, padding=[r // 2, s // 2], stride=[1, 1],
                              dilation=[1, 1], compute_data_type=cudnn.data_type.FLOAT)
        self.Y.set_output(True).set_data_type(io).set_dim([n, k, h, w]).set_stride(_nhwc((n, k, h, w)))
        self.stats = None
        if genstats:  # cuDNN's ConvBNfprop pattern (BN training) ends in per-channel statistics
            self.stats = g.genstats(input=self.Y)
            for t in self.stats:
                t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
        g.validate()
        g.build_operation_graph()
        if every_engine:  # not only what the heuristics list: every engine cuDNN has for this graph
            for engine in range(g.get_engine_count()):
                try:
                    g.create_execution_plan(engine, {})
                except Exception:
                    pass
        else:
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
        g.check_support()
        try:
            g.build_plans(cudnn.build_plan_policy.ALL)
        except Exception:  # some listed plans may not build; then only the heuristics' choice
            g.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
        self.graph = g
        self.n_plans = g.get_execution_plan_count()
        self.plan = None  # index chosen by tune(); None: the graph's default (heuristics' first)
        self.ws_size = max(g.get_workspace_size(), 1)
        try:
            self.ws_size = max([self.ws_size] + [g.get_workspace_size_plan_at_index(i) for i in range(self.n_plans)])
        except Exception:
            self.ws_size = max(self.ws_size, 256 << 20)
        self.y_shape = (n, k, h, w)

    def pack(self, x, weight, y, scale=None, shift=None):
        vp = {self.X: x, self.W: weight, self.Y: y}
        if self.stats is not None:
            k = self.y_shape[1]
            for t in self.stats:
                vp[t] = torch.empty(1, k, 1, 1, device=x.device)
        if self.prologue:
            vp[self.S] = scale
            vp[self.B] = shift
        return vp

    def run(self, x, weight, scale=None, shift=None, y=None, plan=None):
        if y is None:
            y = torch.empty(self.y_shape, device=x.device, dtype=x.dtype).contiguous(memory_format=CL)
        ws = torch.empty(self.ws_size, device=x.device, dtype=torch.uint8)
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        plan = self.plan if plan is None else plan
        vp = self.pack(x, weight, y, scale, shift)
        if plan is None:
            self.graph.execute(vp, ws, handle=self.handle)
        else:
            self.graph.execute_plan_at_index(vp, ws, plan, handle=self.handle)
        return y

    def tune(self, x, weight, scale, shift, iters: int = 10) -> list:
        """Time every plan that runs; keep the fastest. Returns [(index, ms or error)]."""
        out = []
        for i in range(self.n_plans):
            try:
                self.run(x, weight, scale, shift, plan=i)
                torch.cuda.synchronize()
                ms = _time(lambda: self.run(x, weight, scale, shift, plan=i), iters)
                out.append((i, ms))
            except Exception as e:  # a plan cuDNN listed may still refuse these tensors
                out.append((i, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"))
        ok = [(ms, i) for i, ms in out if isinstance(ms, float)]
        if ok:
            self.plan = min(ok)[1]
        return out


def _time(fn, iters: int) -> float:
    return time_calls(fn, "cuda", iters + 1).median_ms


def _fused(x, scale, shift, weight):
    """The tuned graph for these shapes, or None where cuDNN has no engine for them."""
    key = (tuple(x.shape), tuple(weight.shape), x.dtype)
    if key not in _GRAPHS:
        try:
            fc = FusedConv(x.shape, weight.shape, x.dtype, genstats=True)
            fc.tune(x, weight, scale, shift, iters=5)
        except Exception as e:
            print(f"no fused engine for x {tuple(x.shape)} w {tuple(weight.shape)}: {str(e).splitlines()[0][:100]}")
            fc = None
        _GRAPHS[key] = fc
    return _GRAPHS[key]


@torch.library.custom_op("emonet_exp::bn_relu_conv", mutates_args=())
def bn_relu_conv(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``conv2d(relu(x * scale + shift), weight, padding=k // 2)`` through one cuDNN graph."""
    x = x.contiguous(memory_format=CL)
    weight = weight.contiguous(memory_format=CL)
    scale, shift = scale.to(x.dtype).contiguous(), shift.to(x.dtype).contiguous()
    fc = _fused(x, scale, shift, weight)
    if fc is None:
        return F.conv2d(torch.relu(x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)), weight,
                        padding=weight.shape[-1] // 2)
    return fc.run(x, weight, scale, shift)


@bn_relu_conv.register_fake
def _(x, scale, shift, weight):
    n, _, h, w = x.shape
    return torch.empty_strided((n, weight.shape[0], h, w), _nhwc((n, weight.shape[0], h, w)),
                               dtype=x.dtype, device=x.device)


@torch.no_grad()
def add_affines(net: torch.nn.Module) -> None:
    """Give every ConvBlock its BNs as per-channel (scale, shift) buffers, computed once in fp32."""
    for m in net.modules():
        if isinstance(m, ConvBlock):
            bns = {"1": m.bn1, "2": m.bn2, "3": m.bn3}
            if m.downsample is not None:
                bns["d"] = m.downsample[0]
            for key, bn in bns.items():
                scale = bn.weight.float() * torch.rsqrt(bn.running_var.float() + bn.eps)
                m.register_buffer(f"fs{key}", scale)
                m.register_buffer(f"fb{key}", bn.bias.float() - bn.running_mean.float() * scale)


def fused_block_forward(self, x):
    """ConvBlock.forward with each BN + ReLU + convolution one cuDNN call (CUDA, fp16/bf16 only)."""
    if x.device.type != "cuda" or x.dtype == torch.float32:
        return _ORIGINAL(self, x)
    o1 = bn_relu_conv(x, self.fs1, self.fb1, self.conv1.weight)
    o2 = bn_relu_conv(o1, self.fs2, self.fb2, self.conv2.weight)
    o3 = bn_relu_conv(o2, self.fs3, self.fb3, self.conv3.weight)
    residual = x if self.downsample is None else bn_relu_conv(x, self.fsd, self.fbd, self.downsample[2].weight)
    return torch.cat((o1, o2, o3), dim=1) + residual


from emonet.models.emonet import ConvBlock  # noqa: E402

_ORIGINAL = ConvBlock.forward

# (C_in, C_out, kernel, H): the network's ConvBlock convolutions, most of the time first.
SHAPES = [(256, 128, 3, 64), (128, 64, 3, 64), (64, 64, 3, 64), (256, 128, 3, 32), (128, 64, 3, 32),
          (64, 64, 3, 32), (256, 128, 3, 16), (128, 256, 1, 64), (64, 64, 3, 128)]


def conv_main(batch: int) -> None:
    torch.backends.cudnn.benchmark = True
    dt = torch.float16
    ew = torch.compile(lambda x, s, b: torch.relu(x * s + b))
    print(f"batch {batch}, fp16 NHWC; ms per call (median of 20, CUDA events); cudnn backend "
          f"{cudnn.backend_version()}", flush=True)
    for cin, cout, k, hw in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(batch, cin, hw, hw, device="cuda", dtype=dt, generator=g).contiguous(memory_format=CL)
        w = (torch.randn(cout, cin, k, k, device="cuda", dtype=dt, generator=g) / (cin * k * k) ** 0.5
             ).contiguous(memory_format=CL)
        s = (torch.rand(cin, device="cuda", generator=g) + 0.5).to(dt)
        b = (torch.randn(cin, device="cuda", generator=g) * 0.5).to(dt)
        pad = k // 2
        act = ew(x, s.view(1, -1, 1, 1), b.view(1, -1, 1, 1))
        flop = 2 * batch * hw * hw * cout * cin * k * k
        t_conv = _time(lambda: F.conv2d(act, w, padding=pad), 20)
        t_both = _time(lambda: F.conv2d(ew(x, s.view(1, -1, 1, 1), b.view(1, -1, 1, 1)), w, padding=pad), 20)
        line = (f"{cin:>3}->{cout:<3} {k}x{k} {hw:>3}x{hw:<3} cudnn conv {t_conv:7.3f} ({flop / t_conv / 1e9:4.0f} TF/s)"
                f"  bn+relu pass + conv {t_both:7.3f}")
        try:
            t0 = time.perf_counter()
            fc = FusedConv(x.shape, w.shape, dt, genstats=True)
            build = time.perf_counter() - t0
            res = fc.tune(x, w, s, b, iters=20)
            ok = sorted(ms for _, ms in res if isinstance(ms, float))
            y = fc.run(x, w, s, b)
            ref = F.conv2d(torch.relu(x.float() * s.float().view(1, -1, 1, 1) + b.float().view(1, -1, 1, 1)),
                           w.float(), padding=pad)
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            err_unfused = ((F.conv2d(act, w, padding=pad).float() - ref).abs().max() / ref.abs().max()).item()
            best = ok[0] if ok else float("nan")
            line += (f"  fused {best:7.3f} ({flop / best / 1e9:4.0f} TF/s) = {t_both / best:4.2f}x; "
                     f"{len(ok)}/{fc.n_plans} plans ran, build {build:.1f} s; rel err fused {err:.1e}, "
                     f"unfused {err_unfused:.1e}")
            fails = [ms for _, ms in res if not isinstance(ms, float)]
            if fails:
                line += f"; first refusal: {fails[0]}"
        except Exception as e:
            line += f"  fused: not supported ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        print(line, flush=True)


def model_main(batches: list[int]) -> None:
    from emonet.checkpoints import load_model
    from emonet.engine import Engine, EngineConfig
    from emonet.runtime import RuntimeConfig, configure

    dev = configure(RuntimeConfig(device="cuda", cudnn_benchmark=True))
    net = load_model("random", device="cpu")
    add_affines(net)
    g = torch.Generator().manual_seed(0)
    crops = torch.randint(0, 256, (max(batches), 3, 256, 256), dtype=torch.uint8, generator=g).to(dev)
    outs = {}
    for name in ("inductor", "cudnn-fused"):
        ConvBlock.forward = fused_block_forward if name == "cudnn-fused" else _ORIGINAL
        torch._dynamo.reset()  # Dynamo's code cache would otherwise reuse the other variant's graphs
        for batch in batches:
            t0 = time.perf_counter()
            engine = Engine(net, dev, EngineConfig(precision="fp16", channels_last=True, fold_bn=True,
                                                   compile="default", cuda_graphs=True, batch_sizes=(batch,),
                                                   precompile=False, cache_dir=f"/tmp/cf-{name}"),
                            log=lambda m: None)
            warm = time.perf_counter() - t0
            x = crops[:batch]
            s = time_calls(partial(engine, x), dev, 31 if batch > 8 else 201, n_items=batch, warmup=3)
            outs[(name, batch)] = engine(x)
            print(f"{name:12s} batch {batch:>3}: {s.median_ms:8.3f} ms median, {s.p90_ms:8.3f} p90, "
                  f"{s.throughput:8.1f} crops/s; engine build + warm-up {warm:.1f} s", flush=True)
            del engine
            torch.cuda.empty_cache()
    ConvBlock.forward = _ORIGINAL
    for batch in batches:
        a, b = outs[("inductor", batch)], outs[("cudnn-fused", batch)]
        same = (a["expression"].argmax(1) == b["expression"].argmax(1)).float().mean().item()
        dv = (a["valence"] - b["valence"]).abs().max().item()
        da = (a["arousal"] - b["arousal"]).abs().max().item()
        dl = (a["landmarks"] - b["landmarks"]).abs().max().item()
        print(f"batch {batch}: fused vs inductor (random weights): arg-max agree {same:.3f}, "
              f"|dV| {dv:.4f}, |dA| {da:.4f}, landmarks max |d| {dl:.2f} px", flush=True)


def probe_main() -> None:
    """Which forms of the fused graph cuDNN runs at all, on the main shape (batch 32)."""
    dt = torch.float16
    x = torch.randn(32, 256, 64, 64, device="cuda", dtype=dt).contiguous(memory_format=CL)
    w = (torch.randn(128, 256, 3, 3, device="cuda", dtype=dt) / 48).contiguous(memory_format=CL)
    print(f"cudnn backend {cudnn.backend_version()}", flush=True)
    for opts in [dict(), dict(float_affine=True), dict(genstats=True), dict(genstats=True, float_affine=True),
                 dict(every_engine=True), dict(every_engine=True, genstats=True),
                 dict(prologue=False, every_engine=True)]:
        try:
            fc = FusedConv(x.shape, w.shape, dt, **opts)
            adt = torch.float32 if opts.get("float_affine") else dt
            s = torch.ones(256, device="cuda", dtype=adt)
            b = torch.zeros(256, device="cuda", dtype=adt)
            res = fc.tune(x, w, s, b, iters=5)
            names = []
            for i, ms in res:
                try:
                    names.append(f"{fc.graph.get_plan_name_at_index(i)}={ms if isinstance(ms, str) else f'{ms:.3f}'}")
                except Exception:
                    names.append(f"#{i}={ms}")
            print(f"{opts}: {fc.n_plans} plans: {'; '.join(names)}", flush=True)
        except Exception as e:
            print(f"{opts}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "conv"
    if what == "probe":
        probe_main()
    elif what == "conv":
        conv_main(int(sys.argv[2]) if len(sys.argv) > 2 else 256)
    else:
        model_main([int(b) for b in sys.argv[2:]] or [256, 1])
