import os
import pickle
import shutil

import pytest
import torch

import emonet
from emonet.models.weights import (UNTRAINED_LABEL, CheckpointError, Weights, download_weights,
                                git_blob_sha1, read_state_dict)


def _predict(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(torch.rand(1, 3, 256, 256))


def test_loads_the_reference_checkpoint_and_reproduces_its_outputs(reference_dir):
    model = emonet.load_model(reference_dir / "emonet8_reference.pth", device="cpu")
    io = torch.load(reference_dir / "emonet8_reference_io.pt", weights_only=True)
    assert not model.training and model.n_expression == 8 and not model.untrained
    with torch.no_grad():
        out = model(io["input"])
    assert torch.allclose(out["expression"], io["expression"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, n", [("emonet_8.pth", 8), ("emonet_5.pth", 5)])
def test_class_count_is_read_from_the_checkpoint(ckpt_dir, name, n):
    model = emonet.load_model(ckpt_dir / name, device="cpu")
    assert model.n_expression == n
    assert _predict(model)["expression"].shape == (1, n)
    # The stored weights really are the ones in use (module. prefix removed, nothing re-initialised).
    stored = read_state_dict(ckpt_dir / name)
    assert all(torch.equal(stored[k], v) for k, v in model.state_dict().items())


def test_a_half_precision_checkpoint_is_widened_into_a_model_that_can_be_trained(ckpt_dir, tmp_path):
    stored = read_state_dict(ckpt_dir / "emonet_8.pth")
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in stored.items()}, tmp_path / "half.pth")
    model = emonet.load_model(tmp_path / "half.pth", device="cpu")
    tensors = list(model.parameters()) + list(model.buffers())
    assert {t.dtype for t in model.parameters()} == {torch.float32}
    assert {t.device.type for t in tensors} == {"cpu"}  # nothing left on the meta device it was built on
    assert all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(stored[k].half().to(v.dtype) if v.is_floating_point() else stored[k], v)
               for k, v in model.state_dict().items())


def test_given_class_count_that_agrees_is_accepted(ckpt_dir):
    assert emonet.load_model(ckpt_dir / "emonet_5.pth", n_expression=5, device="cpu").n_expression == 5


def test_given_class_count_that_disagrees_is_a_clear_error(ckpt_dir):
    with pytest.raises(CheckpointError, match="is an 8-class checkpoint, but 5 classes"):
        emonet.load_model(ckpt_dir / "emonet_8.pth", n_expression=5, device="cpu")


def test_random_weights_are_labelled_untrained():
    model = emonet.load_model("random", n_expression=5, device="cpu")
    assert model.untrained and model.n_expression == 5 and not model.training
    assert "meaningless" in UNTRAINED_LABEL


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        emonet.load_model(tmp_path / "nope.pth", device="cpu")


def test_truncated_file(ckpt_dir, tmp_path):
    data = (ckpt_dir / "emonet_5.pth").read_bytes()
    bad = tmp_path / "truncated.pth"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        emonet.load_model(bad, device="cpu")


@pytest.mark.parametrize("content", [os.urandom(4096), b"", b"just some text\n"])
def test_corrupt_or_empty_file(tmp_path, content):
    bad = tmp_path / "corrupt.pth"
    bad.write_bytes(content)
    with pytest.raises(CheckpointError, match="corrupt|empty"):
        emonet.load_model(bad, device="cpu")


def test_a_checkpoint_of_another_network(tmp_path):
    path = tmp_path / "resnet.pth"
    torch.save(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(8, 2)).state_dict(), path)
    with pytest.raises(CheckpointError, match="not an EmoNet checkpoint"):
        emonet.load_model(path, device="cpu")


def test_not_a_state_dict(tmp_path):
    path = tmp_path / "list.pth"
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="not an EmoNet checkpoint"):
        emonet.load_model(path, device="cpu")


def test_missing_and_unexpected_keys_are_named(ckpt_dir, tmp_path):
    state = read_state_dict(ckpt_dir / "emonet_8.pth")
    state["extra.weight"] = state.pop("l0.bias")
    path = tmp_path / "edited.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"1 missing keys \(l0\.bias\); 1 unexpected keys \(extra\.weight\)"):
        emonet.load_model(path, device="cpu")


def test_wrong_shapes_are_named(ckpt_dir, tmp_path):
    state = read_state_dict(ckpt_dir / "emonet_8.pth")
    state["conv1.weight"] = torch.zeros(64, 3, 5, 5)
    path = tmp_path / "shapes.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="conv1.weight is"):
        emonet.load_model(path, device="cpu")


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (shutil.copyfile, (__file__, self.marker))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_pickle_that_runs_code_is_refused_without_running_it(tmp_path, writer):
    marker = tmp_path / "side_effect_happened"
    path = tmp_path / "evil.pth"
    payload = {"conv1.weight": _RunsCode(str(marker))}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump(payload, fh)
    with pytest.raises(CheckpointError, match="refused"):
        emonet.load_model(path, device="cpu")
    assert not marker.exists()
    # The payload is real: unpickling it without the guard does run it.
    with open(path, "rb") as fh:
        if writer == "pickle.dump":
            pickle.load(fh)
            assert marker.exists()


def _local_weights(src, sha1, n=5):
    return Weights(filename=f"emonet_{n}.pth", url=src.resolve().as_uri(), git_blob_sha1=sha1,
                   n_expression=n, class_names=emonet.class_names(n))


def test_download_is_verified_and_atomic(ckpt_dir, tmp_path, capsys):
    src = ckpt_dir / "emonet_5.pth"
    weights = _local_weights(src, git_blob_sha1(src))
    dest = download_weights(weights, tmp_path / "cache", progress=False)
    assert dest.read_bytes() == src.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["emonet_5.pth"]  # no temporary left
    assert "CC BY-NC-ND" in capsys.readouterr().err  # the licence is shown
    assert emonet.load_model(dest, device="cpu").n_expression == 5


def test_download_with_a_wrong_hash_keeps_nothing(ckpt_dir, tmp_path):
    weights = _local_weights(ckpt_dir / "emonet_5.pth", "0" * 40)
    with pytest.raises(CheckpointError, match="does not match its published hash"):
        download_weights(weights, tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache").iterdir()) == []


def test_failed_download_says_where_to_put_the_file(tmp_path):
    weights = _local_weights(tmp_path / "not-there.pth", "0" * 40)
    with pytest.raises(CheckpointError, match=r"could not download emonet_5.pth .*put it at"):
        download_weights(weights, tmp_path / "cache", progress=False)


def test_pretrained_resolves_a_local_copy_first(ckpt_dir, tmp_path, monkeypatch, capsys):
    # EMONET_HOME is the documented place for downloaded weights; a file there is used without download.
    monkeypatch.setenv("EMONET_HOME", str(tmp_path))
    shutil.copy(ckpt_dir / "emonet_5.pth", tmp_path / "emonet_5.pth")
    monkeypatch.chdir(tmp_path)  # no ./pretrained/ here
    model = emonet.load_model("pretrained", n_expression=5, device="cpu")
    assert model.n_expression == 5
    assert "not the released emonet_5.pth" in capsys.readouterr().err


def test_released_weights_record_url_hash_and_classes():
    w8, w5 = emonet.WEIGHTS[8], emonet.WEIGHTS[5]
    assert w8.url.endswith("/pretrained/emonet_8.pth") and len(w8.git_blob_sha1) == 40
    assert w5.class_names == ("Neutral", "Happy", "Sad", "Surprise", "Fear")
    assert w8.class_names[7] == "Contempt"


def test_git_blob_sha1_matches_git(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"hello\n")
    assert git_blob_sha1(path) == "ce013625030ba8dba906f756967f9e9ca394464a"  # `git hash-object`
