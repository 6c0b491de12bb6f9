import json

import pytest
import torch

from emonet.models import EmoNet


@pytest.mark.parametrize("n", [8, 5])
def test_state_dict_keys_and_shapes_equal_the_released_ones(reference_dir, n):
    expected = json.loads((reference_dir / "emonet_state_dict_keys.json").read_text())[f"emonet_{n}"]
    got = [[k, list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in EmoNet(n).state_dict().items()]
    assert got == expected


def test_outputs_match_the_released_model_on_the_reference(reference_dir):
    state = torch.load(reference_dir / "emonet8_reference.pth", weights_only=True)
    io = torch.load(reference_dir / "emonet8_reference_io.pt", weights_only=True)
    model = EmoNet(8).eval()
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    with torch.no_grad():
        out = model(io["input"])
    assert set(out) == {"heatmap", "expression", "valence", "arousal"}
    for key in out:
        assert out[key].shape == io[key].shape
        rel = (out[key] - io[key]).norm() / io[key].norm()
        assert rel < 1e-5, f"{key}: relative error {rel:.2e}"


@pytest.mark.parametrize("attention", [True, False])
def test_output_shapes_with_and_without_attention(attention):
    model = EmoNet(5, attention=attention).eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, 256, 256))
    assert out["heatmap"].shape == (2, 68, 64, 64)
    assert out["expression"].shape == (2, 5)
    assert out["valence"].shape == (2,) and out["arousal"].shape == (2,)
    head_in = model.conv1x1_input_emo_2.in_channels
    assert head_in == (768 if attention else 836)


def test_behaves_as_any_module():
    model = EmoNet(8)
    assert model.training and model.untrained
    assert not model.eval().training
    model = model.to(torch.float64)
    assert next(model.parameters()).dtype == torch.float64
    assert model.class_names[1] == "Happy" and len(EmoNet(5).class_names) == 5


def test_no_hard_coded_cuda_in_the_package():
    from pathlib import Path
    import emonet
    sources = Path(emonet.__file__).parent.rglob("*.py")
    assert not [p for p in sources if ".cuda()" in p.read_text()]


@pytest.mark.parametrize("n", [8, 5])
def test_outputs_match_the_released_model_on_the_compact_reference(parity, n):
    # Weights rebuilt from the compact reference's seed; its outputs are the released model's.
    model, inputs, expected = parity(n)
    with torch.no_grad():
        out = model(inputs.float() / 255)
    for key in ("expression", "valence", "arousal"):
        rel = (out[key] - expected[key]).norm() / expected[key].norm()
        assert rel < 1e-5, (key, float(rel))
    heat = out["heatmap"]
    subset = heat[:, expected["heatmap_channels"]]
    assert ((subset - expected["heatmap_subset"]).norm() / expected["heatmap_subset"].norm()) < 1e-5
    assert torch.equal(heat.flatten(2).argmax(2), expected["heatmap_argmax"])
    torch.testing.assert_close(heat.sum((2, 3)), expected["heatmap_channel_sums"], rtol=1e-4, atol=1e-3)
