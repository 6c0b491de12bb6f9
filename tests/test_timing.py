import time

import pytest
import torch

import emonet
from emonet.timing import FIRST_CALL_NOTE, FIRST_CALL_NOTE_CPU, LatencyTimer, model_cost, time_calls


def test_first_call_is_kept_apart_from_the_steady_state():
    timer = LatencyTimer("cpu")
    for delay in (0.05, 0.01, 0.01, 0.01, 0.02):
        with timer.measure(n_items=4):
            time.sleep(delay)
    s = timer.summary()
    assert s.calls == 5 and s.items == 20
    assert s.first_ms >= 50
    assert 10 <= s.median_ms < 40  # sleep(0.01) never returns early; a busy machine can make it late
    assert s.p90_ms >= s.median_ms
    assert s.throughput == pytest.approx(16 / ((s.mean_ms * 4) / 1e3))
    text = s.format()
    assert "first call" in text and "steady state" in text and FIRST_CALL_NOTE_CPU in text
    assert "cuDNN" in FIRST_CALL_NOTE  # what a GPU report says instead


def test_time_calls_runs_the_warm_up_untimed_and_keeps_the_first_timed_call_apart():
    delays = iter([0.03, 0.03, 0.02, 0.005, 0.005, 0.005])
    s = time_calls(lambda: time.sleep(next(delays)), "cpu", calls=4, n_items=8, warmup=2)
    assert s.calls == 4 and s.items == 32
    assert s.first_ms >= 20 and 5 <= s.median_ms < 20


def test_summary_with_one_or_no_calls():
    timer = LatencyTimer("cpu")
    assert timer.summary().first_ms is None
    with timer.measure():
        pass
    s = timer.summary()
    assert s.first_ms is not None and s.median_ms is None
    assert "no steady-state figure" in s.format()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU")
def test_cuda_events_time_device_work():
    timer = LatencyTimer("cuda:0")
    x = torch.rand(2048, 2048, device="cuda:0")
    for _ in range(3):
        with timer.measure():
            x @ x
    assert all(t > 0 for t in timer.times_ms)


def test_model_cost_is_the_published_one():
    cost = model_cost(emonet.EmoNet(8))
    assert round(cost.parameters / 1e6, 2) == 13.96
    assert round(cost.flops_per_crop / 1e9, 1) == 33.9
    assert "13.96 M parameters" in cost.format()
