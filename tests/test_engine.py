import copy
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import emonet
from emonet.geometry import decode_heatmaps
from emonet.engine import (Engine, EngineConfig, StreamedForward, compare, engine_net, fold_batchnorm,
                           fold_stack_tails, fuse_stack_ends, model_input, pad_stem_input, pointwise_max_pools,
                           real_face_crops, split_outputs)
from emonet.engine.compile import compile_options
from emonet.engine.transforms import Conv1x1ReLU, MaxPool2x2


@pytest.fixture(scope="module")
def crops():
    return real_face_crops(4)


def test_batchnorm_folding_is_exact(reference_model, crops):
    folded = fold_batchnorm(reference_model)
    assert isinstance(folded.bn1, torch.nn.Identity) and isinstance(folded.bn_end1, torch.nn.Identity)
    assert not isinstance(reference_model.bn1, torch.nn.Identity)  # the original is untouched
    x = crops.float() / 255
    with torch.no_grad():
        a, b = reference_model(x), folded(x)
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-4), key


@pytest.mark.parametrize("attention", [True, False])
def test_folding_the_stack_tails_and_head_input_is_exact(reference_model, crops, attention):
    if attention:
        model = reference_model
    else:  # the head then reads the heatmap as more input channels instead of as a mask
        torch.manual_seed(0)
        model = emonet.EmoNet(n_expression=5, attention=False).eval()
    folded = fold_stack_tails(model)
    assert model.conv1x1_input_emo_2 is not None and model.l0 is not None  # folding works on a copy
    assert folded.conv1x1_input_emo_2 is None and folded.l0 is None and folded.bl0 is None and folded.l1 is None
    assert all(m.weight.shape[0] % 8 == 0 for name, m in folded.named_children() if name.startswith("tail"))
    x = crops.float() / 255
    with torch.no_grad():
        a, b = model(x), folded(x)
    for key in a:
        assert a[key].shape == b[key].shape, key
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-5), key
    on_meta = fold_stack_tails(copy.deepcopy(model).to("meta"))  # the engine folds models on the GPU too
    assert on_meta.tail0.weight.device.type == "meta" and on_meta.head_x.bias.device.type == "meta"
    own = engine_net(model)
    assert fold_stack_tails(own, inplace=True) is own and own.l0 is None  # how the engine folds its one copy


def test_padding_the_stem_input_to_four_channels_is_exact(reference_model, crops):
    padded = pad_stem_input(reference_model).to(memory_format=torch.channels_last)
    assert reference_model.conv1.in_channels == 3 and padded.conv1.in_channels == 4  # a copy
    x = model_input(padded, crops)
    assert x.shape[1] == 4 and not x[:, 3].any() and x.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        a, b = reference_model(crops.float() / 255), padded(x)
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-5), key
    own = engine_net(reference_model)
    assert pad_stem_input(own, inplace=True) is own and own.conv1.in_channels == 4


def test_pointwise_max_pooling_equals_max_pool2d():
    torch.manual_seed(0)
    for shape in [(2, 5, 8, 8), (1, 3, 7, 9), (2, 4, 2, 2)]:
        x = torch.randn(shape).to(memory_format=torch.channels_last)
        x[0, 0, 0, 0], x[0, 1, 1, 1] = float("nan"), float("-inf")
        assert torch.equal(MaxPool2x2()(x).isnan(), F.max_pool2d(x, 2, 2).isnan())
        assert torch.equal(MaxPool2x2()(x).nan_to_num(), F.max_pool2d(x, 2, 2).nan_to_num())


def test_max_pools_swapped_for_the_pointwise_form_is_exact(reference_model, crops):
    pooled = pointwise_max_pools(reference_model)
    swapped = [m for m in pooled.modules() if isinstance(m, MaxPool2x2)]
    assert len(swapped) == 5  # the stem's and the emotion head's four
    assert not any(isinstance(m, MaxPool2x2) for m in reference_model.modules())  # a copy
    x = crops.float() / 255
    with torch.no_grad():
        a, b = reference_model(x), pooled(x)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    own = engine_net(reference_model)
    assert pointwise_max_pools(own, inplace=True) is own and isinstance(own.stem_pool, MaxPool2x2)


@pytest.mark.parametrize("channels_last", [False, True])
def test_stack_ends_fused_into_one_product_with_relu_is_exact(reference_model, crops, channels_last):
    x = crops.float() / 255
    for model in (reference_model, fold_stack_tails(fold_batchnorm(reference_model))):  # BN unfolded or folded
        fused = fuse_stack_ends(model)
        assert isinstance(fused.last0, Conv1x1ReLU) and fused.conv_last1 is None and fused.bn_end1 is None
        assert model.conv_last0 is not None  # a copy
        if channels_last:
            fused = fused.to(memory_format=torch.channels_last)
        with torch.no_grad():
            a, b = model(x), fused(x)
        for key in a:
            assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-5), key
    own = engine_net(reference_model)
    assert fuse_stack_ends(own, inplace=True) is own and own.conv_last0 is None


@pytest.mark.parametrize("heatmaps", [False, True])
def test_eager_fp32_engine_equals_the_model(reference_model, crops, heatmaps):
    engine = Engine(reference_model, "cpu", EngineConfig(warmup=False, heatmaps=heatmaps))
    with torch.no_grad():
        ref = reference_model(crops.float() / 255)
    out = engine(crops)
    # The heatmaps only on request: no tool reads them, and they are 1.1 MB of float32 a crop.
    assert set(out) == {"landmarks", "expression", "valence", "arousal"} | ({"heatmap"} if heatmaps else set())
    for key in set(ref) & set(out):
        assert out[key].dtype == torch.float32
        assert torch.allclose(out[key], ref[key], rtol=1e-5, atol=1e-5), key
    np.testing.assert_array_equal(out["landmarks"].numpy(), decode_heatmaps(ref["heatmap"]))  # spec §5
    assert engine(crops[:0])["landmarks"].shape == (0, 68, 2)
    assert ("heatmap" in engine(crops[:0])) == heatmaps


@pytest.mark.parametrize("config", [
    EngineConfig(channels_last=True, fold_bn=True, warmup=False),
    EngineConfig(precision="bf16", channels_last=True, fold_bn=True, warmup=False),
])
def test_fast_modes_agree_with_fp32_on_real_face_crops(reference_model, crops, config):
    agreement = compare(Engine(reference_model, "cpu", config), reference_model, crops)
    assert agreement.argmax_agreement == 1.0, agreement.format()
    # bf16 keeps 8 bits of mantissa: on the CPU it lands within a few hundredths; fp32 far under 0.01.
    tol = 0.01 if config.precision == "fp32" else 0.05
    assert agreement.max_valence_diff <= tol and agreement.max_arousal_diff <= tol, agreement.format()


def test_unavailable_modes_fall_back_cleanly_on_the_cpu(reference_model, capsys):
    engine = Engine(reference_model, "cpu", EngineConfig(precision="fp16", cuda_graphs=True, warmup=False))
    assert engine.config.precision == "bf16" and not engine.config.cuda_graphs
    assert "CUDA graphs need a GPU" in capsys.readouterr().err


def test_uneven_and_empty_batches(reference_model, crops):
    engine = Engine(reference_model, "cpu", EngineConfig(batch_sizes=(1, 2), warmup=False))
    assert engine(crops[:3])["expression"].shape == (3, 8)
    assert engine(crops[:0])["valence"].shape == (0,)
    with pytest.raises(ValueError, match=r"expected crops of shape \(N, 3, 256, 256\)"):
        engine(torch.zeros(1, 3, 128, 128))


def test_a_fixed_batch_gives_a_crop_the_same_bits_in_any_batch(reference_model, crops):
    engine = Engine(reference_model, "cpu", EngineConfig(channels_last=True, fold_bn=True, fixed_batch=4,
                                                         batch_sizes=(1, 2, 8), warmup=False))
    assert engine.config.batch_sizes == (4,) and engine.config.name.endswith("+b4")
    together = engine(crops[:7])  # slices of 4 and 3 (padded)
    for i in range(7):
        alone = engine(crops[i:i + 1])
        for key in ("expression", "valence", "arousal", "landmarks"):
            assert torch.equal(alone[key], together[key][i:i + 1]), (i, key)
    assert engine(crops[:0])["valence"].shape == (0,)


def test_warmup_is_timed_and_reported(reference_model):
    lines = []
    engine = Engine(reference_model, "cpu", EngineConfig(batch_sizes=(1,)), log=lines.append)
    assert engine.warmup_ms and engine.warmup_ms > 0
    assert "warm-up" in lines[0] and "paid once at load" in lines[0]


@pytest.mark.parametrize("heatmaps", [False, True])
def test_streamed_forward_equals_the_model_where_streams_are_absent(reference_model, crops, heatmaps):
    # Without CUDA the pieces run in order: the split into stem, blocks, tails and head must lose nothing.
    with torch.no_grad():
        ref = reference_model(crops[:2].float() / 255)
        out = split_outputs(StreamedForward(reference_model, torch.device("cpu"), heatmaps=heatmaps)(
            crops[:2].float() / 255), reference_model.n_expression)
    assert ("heatmap" in out) == heatmaps
    for key in set(ref) & set(out):
        assert torch.equal(out[key], ref[key]), key
    np.testing.assert_array_equal(out["landmarks"].numpy(), decode_heatmaps(ref["heatmap"]))


def test_side_streams_are_dropped_on_the_cpu(reference_model, capsys):
    engine = Engine(reference_model, "cpu", EngineConfig(streams=8, warmup=False))
    assert engine.config.streams == 0 and "side streams need a GPU" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("streams", [0, 8])
def test_cuda_graph_mode_agrees_with_fp32(reference_model, streams):
    engine = Engine(reference_model, "cuda:0", EngineConfig(precision="fp16", channels_last=True,
                                                            fold_bn=True, cuda_graphs=True, streams=streams,
                                                            batch_sizes=(1, 8, 16), heatmaps=True))
    crops = real_face_crops(11)
    agreement = compare(engine, copy.deepcopy(reference_model).to("cuda:0"), crops)
    assert agreement.ok, agreement.format()
    # A crop alone (the batch-1 graph) gives what it gives inside a padded batch, to fp16 precision.
    batched = engine(crops)
    alone = engine(crops[3:4])
    for key in batched:
        if key != "landmarks":  # an arg-max: a near tie may flip by a pixel in fp16
            torch.testing.assert_close(alone[key], batched[key][3:4], rtol=0.02, atol=0.02, msg=key)
    # Landmarks decoded inside the graph are those of its own heatmaps.
    np.testing.assert_array_equal(batched["landmarks"].cpu().numpy(), decode_heatmaps(batched["heatmap"]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("lanes", [1, 4])
def test_the_gpu_default_gives_a_crop_the_same_bits_eager_or_graphed_in_any_batch(reference_model, monkeypatch,
                                                                                 tmp_path, lanes):
    crops = real_face_crops(37)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # the default's heuristic kernels
    monkeypatch.setenv("EMONET_HOME", str(tmp_path))  # its batch shape checked here
    config = EngineConfig(precision="fp16", channels_last=True, fold_bn=True, fixed_batch=16, check_batch=True)
    graphed = Engine(reference_model, "cuda:0", replace(config, cuda_graphs=True, lanes=lanes))
    eager = Engine(reference_model, "cuda:0", replace(config, warmup=False))
    assert graphed.config.fixed_batch == eager.config.fixed_batch
    if graphed.config.fixed_batch == 1:
        pytest.skip("this GPU's kernels hold a crop's bits only alone: nothing beside it to test")
    together = graphed(crops)  # slices side by side on the lanes
    for engine in (graphed, eager):
        for i in (0, 5, 10, 20, 36):
            alone = engine(crops[i:i + 1])
            for key in ("expression", "valence", "arousal"):
                assert torch.equal(alone[key], together[key][i:i + 1]), (i, key)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_graphs_captured_in_the_background_answer_with_the_bits_the_first_crops_got(reference_model, monkeypatch):
    crops = real_face_crops(11).to("cuda:0")
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # the default's heuristic kernels
    config = EngineConfig(precision="fp16", channels_last=True, fold_bn=True, fixed_batch=4, cuda_graphs=True,
                          background=True, lanes=2)
    engine = Engine(reference_model, "cuda:0", config, log=lambda m: None)
    assert engine.warmup_ms is None  # nothing waited for
    # Other crops in each call (rolled): an answer overwritten by a later call's replay would show.
    calls = [torch.roll(crops, k, 0) for k in range(3)]
    first = [engine(x) for x in calls]  # while the graphs are captured (or after: either way)
    engine.wait_for_graphs()
    assert engine.graphs_ready_s is not None
    for x, got in zip(calls, first):
        graphed = engine(x)
        for key in ("expression", "valence", "arousal", "landmarks"):
            assert torch.equal(got[key], graphed[key]), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("shared,streams", [(True, 0), (True, 8), (False, 0)])
def test_graphs_sharing_memory_return_each_call_its_own_results(reference_model, shared, streams):
    # The graphs of every batch size read one input buffer and (shared) allocate from one pool: a
    # replay must not change results already returned, whatever order the batch sizes come in.
    config = EngineConfig(precision="fp16", channels_last=True, fold_bn=True, cuda_graphs=True, batch_sizes=(1, 4, 16),
                          streams=streams, share_graph_pool=shared)
    engine = Engine(reference_model, "cuda:0", config)
    plain = Engine(reference_model, "cuda:0", replace(config, cuda_graphs=False))
    crops = real_face_crops(16).to("cuda:0")
    results = [(n, engine(crops[:n])) for n in (16, 1, 5, 16, 4, 1, 3)]
    for n, got in results:
        want = plain(crops[:n])
        for key in ("expression", "valence", "arousal"):
            torch.testing.assert_close(got[key], want[key], rtol=0.02, atol=0.02, msg=f"{key}, batch {n}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_graphs_for_many_batch_sizes_hold_no_more_than_one_graph_does(parity_checkpoint):
    # cuBLAS keeps a workspace (32 MiB on Hopper) for each stream it runs on, for the life of the
    # process; graphs captured on a stream per batch size held one each. A fresh process, so that no
    # earlier engine's streams have workspaces already.
    code = """if True:
        import sys, torch, emonet
        from dataclasses import replace
        from emonet.engine import Engine, EngineConfig
        model = emonet.load_model(sys.argv[1], device="cpu")
        config = EngineConfig(precision="fp16", channels_last=True, fold_bn=True, cuda_graphs=True)
        held = []
        for sizes in ((16,), (1, 2, 4, 8, 16)):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            engine = Engine(model, "cuda:0", replace(config, batch_sizes=sizes), log=lambda m: None)
            torch.cuda.synchronize()
            held.append(torch.cuda.memory_allocated() - before)
            del engine
        print(held[1] - held[0])
    """
    proc = subprocess.run([sys.executable, "-c", code, str(parity_checkpoint)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    more = int(proc.stdout.split()[-1])
    assert more < 8 * 2**20, f"graphs for 5 batch sizes held {more / 2**20:.0f} MiB more than one graph"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_streamed_batches_can_skip_cudnn_autotuning(reference_model, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # as the tools set it; restored after the test
    config = EngineConfig(precision="fp16", channels_last=True, fold_bn=True, cuda_graphs=True, streams=8,
                          batch_sizes=(1, 8, 16), autotune_streamed=False)
    engine = Engine(reference_model, "cuda:0", config)
    assert torch.backends.cudnn.benchmark is True  # switched off only while the small batches warmed up
    agreement = compare(engine, copy.deepcopy(reference_model).to("cuda:0"), real_face_crops(11))
    assert agreement.ok, agreement.format()


def test_compile_settings_are_passed_per_call_and_never_set_globally(reference_model, tmp_path, monkeypatch):
    import torch._inductor.config as inductor_config
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # the engine only sets these when unset
        monkeypatch.setenv(var, str(tmp_path / var))
    gpu = compile_options(EngineConfig(compile="default"), torch.device("cuda"))
    assert gpu == {"freezing": False, "force_pointwise_cat": True, "coordinate_descent_tuning": False}
    tuned_gpu = EngineConfig(compile="default", tune_kernels=True)
    assert compile_options(tuned_gpu, torch.device("cuda"))["coordinate_descent_tuning"] is True
    assert compile_options(tuned_gpu, torch.device("cuda"), "block")["coordinate_descent_tuning"] is False
    tuned = compile_options(EngineConfig(compile="max-autotune", freeze=True), torch.device("cpu"))
    assert tuned["max_autotune"] is True and tuned["freezing"] is True and "force_pointwise_cat" not in tuned

    before = (inductor_config.freezing, inductor_config.max_autotune)
    Engine(reference_model, "cpu", EngineConfig(compile="max-autotune", freeze=True, warmup=False,
                                                cache_dir=str(tmp_path)))  # compiles lazily, on first call
    assert (inductor_config.freezing, inductor_config.max_autotune) == before  # another compile is unaffected
