"""How the engine runs EmoNet: :class:`EngineConfig`, and the named presets the tools offer (``--engine``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from ..choices import ENGINES


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs EmoNet. ``EngineConfig()`` is the plain eager fp32 model."""

    precision: str = "fp32"                 # fp32 | tf32 | fp16 | bf16
    channels_last: bool = False
    fold_bn: bool = False                   # exact folding: BNs into convolutions, 1x1 convolutions composed
    compile: Optional[str] = None           # None | "default" | "max-autotune"
    freeze: bool = False                    # inductor freezing: constant-folds weights, but bypasses the on-disk graph cache
    cuda_graphs: bool = False
    batch_sizes: Sequence[int] = (1,)       # captured (graphs) or warmed-up batch sizes; larger input is chunked
    # > 0: every crop goes through the network in a batch of exactly this many (padded; larger input in
    # slices of it), whatever batch_sizes says. Reduced-precision kernels round differently from one batch
    # shape to the next, so only one shape gives a crop the same numbers in any job, batch or process.
    fixed_batch: int = 0
    # With fixed_batch: that size checked on the device before the first crop (emonet.engine.invariance), and
    # halved until a crop gets the same bits wherever it sits in the batch.
    check_batch: bool = False
    # With fixed_batch and graphs on a GPU: that many copies of the graph, replayed side by side on streams of
    # their own, for the slices of a large batch (one shape's small kernels leave most of a large GPU idle).
    lanes: int = 1
    dynamic_batch: bool = True              # compile: one graph for every batch > 1 (False: one per batch size)
    streams: int = 0                        # batches up to this size run the hourglass skip branches on side CUDA streams
    # With side streams, cuDNN's autotuned kernels ran batch 1 slower than its heuristic picks, and
    # autotuning cost warm starts seconds (docs/PERFORMANCE.md); the large batches keep autotuning.
    autotune_streamed: bool = False         # True: cudnn.benchmark decides for the streamed batches too
    share_graph_pool: bool = True           # CUDA graphs: one memory pool for all, captured largest first
    warmup: bool = True
    # CUDA graphs captured in a thread of their own while the first crops run the same network eagerly (the
    # same kernels: the same numbers), rather than by a warm-up that the first results wait for.
    background: bool = False
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
        if self.fixed_batch:
            parts.append(f"b{self.fixed_batch}")
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
assert tuple(PRESETS) == ENGINES  # the command lines' choices (emonet.choices)

# On a CPU: the exact network (fp32, folded; no warm-up: the CPU has nothing to autotune, and a batch-16
# warm-up would cost seconds), and bf16 where asked for.
CPU_FP32 = EngineConfig(channels_last=True, fold_bn=True, warmup=False)
CPU_BF16 = EngineConfig(precision="bf16", channels_last=True, fold_bn=True, warmup=False)
