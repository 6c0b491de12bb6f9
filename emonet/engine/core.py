"""The inference engine: EmoNet as fast as the device allows, one object the tools share.

``Engine(model, device, config)`` builds its own network from ``model`` with the exact transforms
(:mod:`.transforms`), optionally compiles it (:mod:`.compile`), and runs batches of 256x256 crops through
it, on a GPU as CUDA graphs captured per batch size (a smaller batch is padded up to the next captured
size) and, up to ``config.streams``, with the hourglass's skip branches on side streams
(:mod:`.forward`). With ``fixed_batch`` every crop runs in a batch of that one size, graphs or not, so
its numbers do not depend on the crops that came with it. A warm-up at load pays cuDNN autotuning,
compilation and graph capture before the first real crop, and its cost is reported on its own. It returns
landmarks decoded on the device, expression logits, valence and arousal; the heatmaps only with
``EngineConfig(heatmaps=True)``.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import replace
from typing import Dict, Optional

import torch

from ..log import say
from ..models import EmoNet
from ..runtime import RuntimeConfig
from . import precompile
from .compile import compiler
from .config import EngineConfig
from .samples import real_face_crops
from .graphs import Graphs, capture_graph, synchronize
from .invariance import device_key, invariant_batch, remember, remembered
from .forward import StreamedForward, no_cudnn_autotuning, packed_forward, packed_forward_heatmaps, \
    split_outputs
from .transforms import engine_net, fold_batchnorm, fold_stack_tails, fuse_stack_ends, pad_stem_input, \
    pointwise_max_pools


class Engine:
    """Runs EmoNet on batches of 256x256 crops; ``engine(crops)`` returns float32 outputs on the device.

    ``crops``: ``(N, 3, 256, 256)``, uint8 in [0, 255] or float in [0, 1], on any device. One caller at a time:
    its calls share the CUDA graphs' buffers.
    """

    def __init__(self, model: EmoNet, device: torch.device | str, config: EngineConfig = EngineConfig(),
                 log=None) -> None:
        self.device = torch.device(device)
        self._log = log or say
        if config.fixed_batch:
            config = replace(config, batch_sizes=(config.fixed_batch,))
        self.config = self._available(config)
        self.n_expression = model.n_expression
        self.class_names = model.class_names
        self.untrained = model.untrained
        self.weights_source = model.weights_source
        self.warmup_ms: Optional[float] = None
        self._dtype = RuntimeConfig(precision=self.config.precision).dtype

        net = engine_net(model)  # the one copy: the transforms below change it in place
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
        self._compiled = self.config.compile is not None
        compile_fn = compiler(self.config, self.device, self._log) if self._compiled else (lambda fn, name, mark=None: fn)
        pieces = []

        def wrap(fn, name, mark=None):
            pieces.append(compile_fn(fn, name, mark))
            return pieces[-1]

        whole = wrap(packed_forward_heatmaps if self.config.heatmaps else packed_forward, "model", self._mark_batch)
        self._forward = lambda x: whole(net, x)
        self._streamed = (StreamedForward(net, self.device, wrap, self.config.heatmaps) if self.config.streams
                          else None)
        self._precompiled = [p for p in pieces if isinstance(p, precompile.Precompiled)]
        if self.config.fixed_batch and self.config.check_batch:
            self._check_batch()
        # (batch size, input dtype) -> (graph, static input, static outputs)
        # (batch size, input dtype) -> (graph, static input, static outputs), per lane: with a fixed batch on a
        # GPU, ``lanes`` copies of the graph, each with its own buffers, memory pool and capture stream (cuBLAS
        # keeps a workspace per stream, and a graph keeps the one it was captured with), each replayed on a
        # stream of its own, so the slices of a large batch run side by side: the same kernels, the same bits.
        lanes = max(1, self.config.lanes) if (self.config.fixed_batch and self.device.type == "cuda") else 1
        self._lanes = [Graphs(self.device, functools.partial(self._capture, lane)) for lane in range(lanes)] \
            if self.config.cuda_graphs else []
        self._graphs = self._lanes[0] if self._lanes else None
        self._lane_streams = [torch.cuda.Stream(self.device) for _ in self._lanes] if lanes > 1 else []
        self._static_inputs: Dict[tuple, torch.Tensor] = {}  # (lane, dtype) -> the lane's input buffer
        self._graph_pools: dict = {}  # lane -> its graphs' memory pool
        # (Side streams would be shared by the eager runs and a capture under way: those modes warm up first.)
        if (self.config.warmup and self.config.background and self._graphs is not None and not self._compiled
                and not self.config.streams):
            self.prepare()
        elif self.config.warmup:
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
        if notes:
            self._log(f"engine: {'; '.join(notes)}")
        return replace(config, **changes)

    def _mark_batch(self, args: tuple) -> None:
        if self.config.dynamic_batch and args[1].shape[0] > 1:
            # One compiled graph serves every batch size > 1 (1 is always specialised): convolutions
            # stay cuDNN calls chosen at run time, so a dynamic batch costs little and saves a
            # compilation per size. dynamic_batch=False trades those compilations for kernels
            # specialised to each size (the benchmark measures both).
            torch._dynamo.mark_dynamic(args[1], 0)

    @property
    def precompiled(self) -> Optional[Dict[str, int]]:
        """Compiled functions loaded from disk and compiled in this process (None: not precompiling)."""
        if not self._precompiled:
            return None
        return {"loaded": sum(p.loaded for p in self._precompiled),
                "compiled": sum(p.compiled for p in self._precompiled)}

    def _check_batch(self) -> None:
        """``fixed_batch`` as checked on this device (:mod:`.invariance`): halved until every crop gets the same
        bits wherever it sits in the batch, beside whatever other crops; the answer kept for later processes."""
        largest = self.config.fixed_batch
        key = device_key(self.device, f"{self.config.name} ({self.n_expression} classes)")
        batch = remembered(key)
        if batch is None or batch > largest:
            crops = real_face_crops(2 * largest).to(self.device)
            finite = []

            def run(x: torch.Tensor) -> torch.Tensor:
                with torch.inference_mode():
                    out = self._call_model(self._prepare(x))
                finite.append(bool(torch.isfinite(out).all()))
                return out
            batch, failed = invariant_batch(run, largest, crops)
            if all(finite):  # outputs that overflow (untrained weights, say) prove nothing for other weights
                remember(key, batch)
            if failed:
                self._log(f"engine: on this device a batch of {' or '.join(map(str, failed))} gave a crop other "
                          f"numbers in another place of the batch; every crop runs in batches of {batch}")
        self.config = replace(self.config, fixed_batch=batch, batch_sizes=(batch,))

    # -- running -------------------------------------------------------------------------------
    def _prepare(self, crops: torch.Tensor) -> torch.Tensor:
        # Every forward scales the crops itself (emonet.engine.model_input): compiled, in one fused kernel.
        return crops.to(self.device, non_blocking=True)

    def _call_model(self, x: torch.Tensor) -> torch.Tensor:
        """The packed outputs (:func:`split_outputs`) of the model on prepared input."""
        if self._streamed is not None and x.shape[0] <= self.config.streams:
            # The kernels chosen here (at warm-up) are the ones the graph keeps.
            with contextlib.nullcontext() if self.config.autotune_streamed else no_cudnn_autotuning():
                return self._streamed(x)
        return self._forward(x)

    def _run_eager(self, crops: torch.Tensor) -> Dict[str, torch.Tensor]:
        with torch.inference_mode():
            return self._split(self._call_model(self._prepare(crops)))

    def _capture(self, lane: int, key: tuple, stream: "torch.cuda.Stream", error_mode: str) -> tuple:
        # Every graph reads the front of one input buffer, and with share_graph_pool allocates from one
        # memory pool: they replay one at a time, on one stream, and each result is copied out right
        # after its replay, so a graph may reuse what another's intermediates used. Captured largest
        # first (warmup), the smaller graphs fit in the largest one's memory (docs/PERFORMANCE.md).
        # Autotuning and compilation happen in capture_graph's runs before the capture.
        batch, dtype_in = key
        if (lane, dtype_in) not in self._static_inputs:
            self._static_inputs[lane, dtype_in] = torch.zeros(max(self.config.batch_sizes), 3, 256, 256,
                                                              device=self.device, dtype=dtype_in)
        static_in = self._static_inputs[lane, dtype_in][:batch]
        if lane not in self._graph_pools and self.config.share_graph_pool:
            self._graph_pools[lane] = torch.cuda.graph_pool_handle()
        graph, static_out = capture_graph(lambda: self._call_model(self._prepare(static_in)), stream, error_mode,
                                          self._graph_pools.get(lane))
        return graph, static_in, static_out

    def _split(self, flat: torch.Tensor) -> Dict[str, torch.Tensor]:
        return split_outputs(flat, self.n_expression)

    def _run_fixed(self, crops: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Pad to the next configured batch size: graphs and compiled code are specialised to shapes."""
        n = crops.shape[0]
        batch = min(b for b in self.config.batch_sizes if b >= n)
        entry = self._graphs.get((batch, crops.dtype)) if self._graphs is not None else None
        if entry is None:  # no graphs, or this one's is being captured in the background: the same network
            return self._run_eager_padded(crops, batch)
        graph, static_in, static_out = entry
        static_in[:n].copy_(crops, non_blocking=True)  # rows past n keep old data: BN is per-sample
        graph.replay()
        return self._split(static_out[:n].clone())

    def _run_eager_padded(self, crops: torch.Tensor, batch: int) -> Dict[str, torch.Tensor]:
        """``crops`` run eagerly in a batch of exactly ``batch`` (padded with the last crop): a graph's shape."""
        n = crops.shape[0]
        if n < batch:
            crops = torch.cat([crops, crops[-1:].expand(batch - n, -1, -1, -1)])
        return {k: v[:n] for k, v in self._run_eager(crops).items()}

    def _run_lanes(self, crops: torch.Tensor) -> Dict[str, torch.Tensor]:
        """A fixed batch's slices spread over the lanes (see __init__), each lane's replays on its own stream,
        the outputs back on the caller's stream; a slice whose lane's graph is not ready yet runs eagerly there
        (the same numbers)."""
        batch, current = self.config.fixed_batch, torch.cuda.current_stream(self.device)
        outs, used = [], set()
        for j, start in enumerate(range(0, crops.shape[0], batch)):
            part, lane = crops[start:start + batch], j % len(self._lanes)
            # In the background where the graphs are prepared so (another lane's capture may be under way there).
            entry = self._lanes[lane].get((batch, part.dtype), later=self.config.background)
            if entry is None:
                outs.append(self._run_eager_padded(part, batch))
                continue
            graph, static_in, static_out = entry
            stream, n = self._lane_streams[lane], part.shape[0]
            if lane not in used:
                stream.wait_stream(current)  # the crops (and anything before them) are ready
                used.add(lane)
            with torch.cuda.stream(stream):
                if part.is_cuda:
                    part.record_stream(stream)  # not reused by the caller's stream before this copy is done
                static_in[:n].copy_(part, non_blocking=True)  # rows past n keep old data: a crop is computed alone
                graph.replay()
                out = static_out[:n].clone()
            out.record_stream(current)
            outs.append(self._split(out))
        for lane in used:
            current.wait_stream(self._lane_streams[lane])
        if len(outs) == 1:
            return outs[0]
        return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}

    def __call__(self, crops: torch.Tensor) -> Dict[str, torch.Tensor]:
        """EmoNet on ``(N, 3, 256, 256)`` uint8 crops: landmarks ``(N, 68, 2)`` in crop pixels (decoded
        from the heatmaps, spec §5), expression logits, valence and arousal, and with
        ``EngineConfig(heatmaps=True)`` the heatmaps ``(N, 68, 64, 64)``; float32."""
        if crops.ndim != 4 or tuple(crops.shape[1:]) != (3, 256, 256):
            raise ValueError(f"expected crops of shape (N, 3, 256, 256), got {tuple(crops.shape)}")
        if crops.shape[0] == 0:
            return {k: v[:0] for k, v in self._run_eager(crops[:1].new_zeros(1, 3, 256, 256)).items()}
        if not (self.config.cuda_graphs or self.config.compile or self.config.fixed_batch):
            return self._run_eager(crops)
        if self._lane_streams:
            return self._run_lanes(crops)
        largest = max(self.config.batch_sizes)
        outs = [self._run_fixed(crops[i:i + largest]) for i in range(0, crops.shape[0], largest)]
        if len(outs) == 1:
            return outs[0]
        return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}

    def prepare(self, dtype_in: torch.dtype = torch.uint8) -> None:
        """Capture every configured batch size's graph in the background, largest first (see _capture); crops
        run eagerly until theirs is ready."""
        for graphs in self._lanes:
            graphs.prepare([(b, dtype_in) for b in sorted(self.config.batch_sizes, reverse=True)])
        self._log(f"engine {self.config.name}: its CUDA graphs (batch sizes {', '.join(map(str, self.config.batch_sizes))}) "
                  f"are captured in the background; crops before them run the same network eagerly")

    def wait_for_graphs(self) -> None:
        """Until the graphs being captured in the background, if any, are ready (a benchmark's steady state)."""
        for graphs in self._lanes:
            graphs.wait()

    @property
    def graphs_ready_s(self) -> Optional[float]:
        """Seconds from :meth:`prepare` until every graph was ready (None: not prepared, or not yet)."""
        ready = [graphs.ready_s for graphs in self._lanes]
        return None if not ready or None in ready else max(ready)

    @property
    def background_note(self) -> Optional[str]:
        """For a report: when the graphs captured in the background were ready (None: not prepared so)."""
        lanes = self._lanes
        error = next((graphs.error for graphs in lanes if graphs.error is not None), None)
        ready = self.graphs_ready_s
        if not self.config.background or not lanes or (ready is None and error is None
                                                         and not any(graphs.preparing for graphs in lanes)):
            return None
        if error is not None:
            return (f"its CUDA graphs could not be captured in the background ({error}): crops ran eagerly "
                    f"(the same numbers)")
        if ready is None:
            return "its CUDA graphs were still being captured: crops ran eagerly (the same numbers)"
        return (f"its CUDA graphs were ready {ready:.2f} s after load, captured in the background "
                f"(crops before them ran eagerly: the same numbers)")

    def warmup(self, dtype_in: torch.dtype = torch.uint8) -> float:
        """Run every configured batch size once so real frames do not pay autotuning; returns ms."""
        t0 = time.perf_counter()
        if self._compiled and self.config.background and self._lane_streams:
            # Compiled (or loaded) here, before any lane's capture in the background calls the same function:
            # two threads must not compile it at once.
            for batch in self.config.batch_sizes:
                self._run_eager(torch.zeros(batch, 3, 256, 256, dtype=dtype_in, device=self.device))
        for batch in sorted(self.config.batch_sizes, reverse=True):  # largest first: see _capture
            slices = max(1, len(self._lane_streams))  # a slice for every lane: each captures its graph
            self(torch.zeros(batch * slices, 3, 256, 256, dtype=dtype_in, device=self.device))
        if self.device.type == "cuda":
            synchronize(self.device)
        self.warmup_ms = (time.perf_counter() - t0) * 1e3
        autotuned = self.device.type == "cuda" and torch.backends.cudnn.benchmark
        paid = [name for name, on in (("cuDNN autotuning", autotuned),
                                      ("compilation", self._compiled),
                                      ("CUDA graph capture", self.config.cuda_graphs)) if on]
        self._log(f"engine warm-up ({self.config.name}, batch sizes "
                  f"{', '.join(map(str, self.config.batch_sizes))}): {self.warmup_ms / 1e3:.2f} s "
                  f"({', '.join(paid) or 'first-call allocations'}), paid once at load")
        return self.warmup_ms
