import json
import subprocess
import sys
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


def test_one_or_two_calls_after_the_first_are_no_steady_state():
    timer = LatencyTimer("cpu")
    with timer.measure(n_items=2):
        pass
    for calls in (2, 3):
        with timer.measure(n_items=2):
            pass
        s = timer.summary()
        assert s.calls == calls and s.items == 2 * calls and s.median_ms is None and s.throughput is None
        assert f"{calls - 1} call" in s.format() and "too few for a steady-state figure" in s.format()
    with timer.measure(n_items=2):
        pass
    assert timer.summary().median_ms is not None  # three after the first


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA events need a GPU"))])
def test_a_region_timed_by_the_caller_takes_its_place_in_order(device):
    timer = LatencyTimer(device)
    timer.record(250.0, 2)  # timed elsewhere (a photo detected while the model loaded)
    with timer.measure(1):
        time.sleep(0.001)
    timer.record(500.0, 1)  # after a region whose CUDA events are not read yet
    for _ in range(2):
        with timer.measure(1):
            time.sleep(0.001)
    times = timer.times_ms
    assert times[0] == 250.0 and times[2] == 500.0 and all(0 <= t < 250 for t in times[1:2] + times[3:])
    summary = timer.summary()
    assert summary.first_ms == 250.0 and summary.calls == 5 and summary.items == 6


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


def test_process_age_counts_from_the_process_start():
    # A warm start is timed from the process's start, not from when emonet was imported.
    code = "import time; time.sleep(0.5); from emonet.timing import process_age; print(process_age())"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t
    assert 0.48 <= float(out) <= wall + 0.02  # /proc counts in 10 ms steps


def test_startup_clock_splits_the_time_to_the_first_result_into_stages():
    code = ("import time; from emonet.timing import StartupClock; time.sleep(0.3); c = StartupClock(); "
            "time.sleep(0.2); c.mark('model'); c.mark('model'); time.sleep(0.1); c.mark('first result'); "
            "import json; print(json.dumps(c.as_dict())); print(c.format())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    report = json.loads(out[0])
    stages = report["stages_s"]
    assert list(stages) == ["Python start-up and imports", "model", "first result"]  # a stage is marked once
    assert stages["Python start-up and imports"] >= 0.29 and 0.19 <= stages["model"] and 0.09 <= stages["first result"]
    assert abs(sum(stages.values()) - report["first_result_s"]) < 1e-3 and report["from"] == "process start"
    assert out[1].startswith(f"first result {report['first_result_s']:.2f} s after the process started: Python")
