"""The inference engine: the network as fast as the device allows.

| module | concern |
| --- | --- |
| :mod:`.config` | :class:`EngineConfig` and the ``--engine`` presets |
| :mod:`.transforms` | exact transforms that build the engine's own network (:class:`EngineNet`) |
| :mod:`.forward` | the forward functions run and compiled: whole model, or pieces on side CUDA streams |
| :mod:`.compile`, :mod:`.precompile` | ``torch.compile`` options, and compiled code kept between processes |
| :mod:`.core` | :class:`Engine`: CUDA graphs, warm-up, batching |
| :mod:`.check` | :func:`compare` a fast engine with fp32 on real face crops (the sample photo ships here) |
"""
from .config import PRESETS, EngineConfig
from .core import Engine
from .check import Agreement, agreement, compare, conditioned_model, real_face_crops, true_fp32, varied_face_crops
from .forward import StreamedForward, model_input, split_outputs
from .transforms import EngineNet, engine_net, fold_batchnorm, fold_stack_tails, fuse_stack_ends, pad_stem_input, \
    pointwise_max_pools

__all__ = ["PRESETS", "EngineConfig", "Engine", "Agreement", "agreement", "compare", "conditioned_model", "real_face_crops", "true_fp32",
           "varied_face_crops", "StreamedForward", "model_input",
           "split_outputs", "EngineNet", "engine_net", "fold_batchnorm", "fold_stack_tails", "fuse_stack_ends",
           "pad_stem_input", "pointwise_max_pools"]
