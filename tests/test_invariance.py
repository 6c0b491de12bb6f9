import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from emonet.engine import Engine, EngineConfig
from emonet.engine.invariance import (batch_spread, device_key, invariant_batch, position_invariant, remember,
                                      remembered, shapes_file)
from emonet.engine.samples import real_face_crops


def _crops(n):
    return torch.arange(n * 6, dtype=torch.float64).reshape(n, 6) / 7.0


def _per_row(x):
    return (x * 3.0).sin()  # each row from itself only


def _running_sum(x):
    return x.cumsum(0)  # each row from the rows before it: a result that depends on the place in the batch


def _mean_beside(x):
    return x - x.mean(0, keepdim=True)  # each row from the whole batch


@pytest.mark.parametrize("batch", [2, 4, 8])
def test_a_function_of_each_row_alone_passes(batch):
    assert position_invariant(_per_row, _crops(2 * batch), batch)


@pytest.mark.parametrize("run", [_running_sum, _mean_beside])
def test_a_function_of_the_place_or_of_the_others_fails(run):
    assert not position_invariant(run, _crops(8), 4)


def test_the_largest_passing_size_is_kept_and_the_failed_ones_said():
    def small_batches_only(x):  # rows computed alone in batches of up to 2, together beyond
        return _per_row(x) if len(x) <= 2 else _mean_beside(x)
    assert invariant_batch(small_batches_only, 16, _crops(32)) == (2, [16, 8, 4])
    assert invariant_batch(_per_row, 16, _crops(32)) == (16, [])
    assert invariant_batch(_mean_beside, 8, _crops(16)) == (1, [8, 4, 2])


def test_the_spread_over_batches_is_zero_for_rows_computed_alone_and_measured_otherwise():
    crops = _crops(5)
    assert batch_spread(_per_row, crops, (1, 2, 3, 8, 16)) == 0.0
    spread = batch_spread(_mean_beside, crops, (1, 2, 3, 8, 16))
    alone = torch.zeros(6)  # alone, a row minus its own mean is 0: the spread is the largest row off the mean
    assert spread == max((_mean_beside(crops[torch.arange(n) % 5]) - alone).abs().max().item() for n in (2, 3, 8, 16))


def test_too_few_crops_for_the_check_is_an_error():
    with pytest.raises(ValueError, match="needs 8 crops"):
        position_invariant(_per_row, _crops(7), 4)


def test_bits_are_compared_so_a_nan_in_the_same_place_matches_itself():
    def nan_rows(x):
        out = _per_row(x)
        out[:, 0] = float("nan")
        return out
    assert position_invariant(nan_rows, _crops(8), 4)


def test_an_engine_that_checks_its_batch_keeps_a_shape_that_holds(reference_model, tmp_path, monkeypatch):
    monkeypatch.setenv("EMONET_HOME", str(tmp_path))
    engine = Engine(reference_model, "cpu", EngineConfig(channels_last=True, fold_bn=True, fixed_batch=4,
                                                         check_batch=True, warmup=False))
    batch = engine.config.fixed_batch
    assert batch in (4, 2, 1) and engine.config.batch_sizes == (batch,)
    crops = real_face_crops(2 * batch + 1)
    together = engine(crops)
    for i in (0, batch - 1, 2 * batch):  # each crop alone, and among others at another place
        alone = engine(crops[i:i + 1])
        for key in ("expression", "valence", "arousal", "landmarks"):
            assert torch.equal(alone[key], together[key][i:i + 1]), (i, key)


def test_the_checked_shape_is_kept_per_device_and_network_and_read_by_the_next_engine(reference_model, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("EMONET_HOME", str(tmp_path))
    config = EngineConfig(channels_last=True, fold_bn=True, fixed_batch=4, check_batch=True, warmup=False)
    first = Engine(reference_model, "cpu", config)
    key = device_key(torch.device("cpu"), "fp32+cl+fold+b4 (8 classes)")
    assert remembered(key) == first.config.fixed_batch and shapes_file().parent == tmp_path
    remember(key, 2)  # what the next engine finds is what it runs, with no check
    assert Engine(reference_model, "cpu", config).config.batch_sizes == (2,)
    assert remembered(device_key(torch.device("cpu"), "another network")) is None


def test_an_unreadable_shapes_file_means_checking_again(tmp_path, monkeypatch):
    monkeypatch.setenv("EMONET_HOME", str(tmp_path))
    shapes_file().write_text("{not json")
    assert remembered("any") is None
    remember("any", 4)  # and the file is written whole again
    assert remembered("any") == 4
    shapes_file().write_text('{"any": true, "other": 0}')  # not a batch size
    assert remembered("any") is None and remembered("other") is None


def test_processes_keeping_their_shapes_at_once_lose_none(tmp_path):
    code = ("import sys; from emonet.engine.invariance import remember\n"
            "for i in range(40): remember(f'{sys.argv[1]} {i}', 8)")
    env = {"EMONET_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    root = Path(__file__).resolve().parents[1]  # the package, installed or not
    procs = [subprocess.Popen([sys.executable, "-c", code, name], env=env, cwd=root) for name in ("a", "b", "c")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert len(json.loads((tmp_path / "batch-shapes.json").read_text())) == 120
