import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: the tools in processes of their own

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args, message", [
    (["--weights", "missing.pth"], "checkpoint not found"),
    (["--modes", "warp-speed"], "unknown mode(s) warp-speed"),
    (["--video", "missing.mp4"], "missing.mp4: no such video file"),
    (["--batch-sizes", "8,x"], "expected positive whole numbers separated by commas"),
    (["--profile", "compile-graph:x"], "positive whole batch size"),
    (["--device", "cuda:7"], "device cuda:7"),  # no GPU, or no eighth one
    (["--device", "banana"], "unknown device 'banana'"),
    (["--sweep", "10,15"], "a multiple of the shortest"),
    (["--serve-load", "127.0.0.1:8000"], "--serve-load takes the service's URL, as http://127.0.0.1:8000"),
    (["--serve-load", "http://127.0.0.1:8000", "--serve-clip", "missing.mp4"], "missing.mp4: no such video file"),
    (["--serve-load", "http://127.0.0.1:8000", "--serve-warmup", "0.01"],
     "--serve-warmup is 0 (none) or at least a frame's time at 30 frames/s (1/30 s), not 0.01"),
    (["--serve-load", "http://127.0.0.1:8000", "--serve-warmup", "inf"], "--serve-warmup is 0 (none) or at least"),
    (["--serve-load", "http://127.0.0.1:8000", "--serve-seconds", "nan"],
     "--serve-seconds is at least a frame's time at 30 frames/s (1/30 s), not nan"),
])
def test_bad_arguments_fail_fast_with_one_line(args, message):
    out = subprocess.run([sys.executable, "-m", "emonet.bench", "--device", "cpu", "--quick", *args],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_startup_floor_is_measured_in_a_fresh_process():
    from emonet.bench import startup_floor
    floor = startup_floor("cpu")
    assert "error" not in floor, floor
    assert 0 < floor["import_torch_s"] < floor["process_s"] and floor["device_init_s"] >= 0


def test_a_report_only_run_saves_its_markdown_where_asked(tmp_path):
    from emonet.bench import main
    report = tmp_path / "warp.md"
    assert main(["--warp", "--device", "cpu", "--markdown", str(report)]) == 0
    text = report.read_text()
    assert text.startswith("Crops from a 1280x720 frame on cpu") and "| 16 |" in text
    assert not list(tmp_path.glob("*.tmp"))


def test_photo_benchmark_times_every_way_in_fresh_processes():
    from emonet.bench.run import photo_benchmark
    text = photo_benchmark(None, "cpu", repeat=1, crops=3)
    rows = [line for line in text.splitlines() if line.startswith("| ") and " s |" in line]
    assert len(rows) == 7 and "released demo's way" in rows[0] and "3 tight crops" in rows[4]
    assert "nan" not in text  # every process succeeded
    assert "- demo.py (YuNet, the default), run 1: first result" in text


def test_a_way_that_fails_is_said_failed_with_its_reason_never_timed(tmp_path):
    from emonet.bench.run import photo_benchmark
    text = photo_benchmark(str(tmp_path / "missing.jpg"), "cpu", repeat=1, crops=2)
    assert "| demo.py (YuNet, the default) | failed | failed | — |" in text
    assert "- demo.py (YuNet, the default) failed (exit 2: error:" in text and "missing.jpg" in text
    assert "| 2 tight crops: demo.py --detector none | " in text and "nan" not in text


def test_a_long_clip_is_the_short_one_repeated_with_every_frame_in_time(tmp_path):
    import av
    from emonet.bench.run import make_clip, repeat_clip
    base = make_clip(tmp_path / "base.mp4", width=160, height=120, frames=15, fps=30.0)
    long = repeat_clip(base, 3, tmp_path / "long.mp4")
    with av.open(str(long)) as container:
        times = [float(f.pts * f.time_base) for f in container.decode(video=0)]
    assert len(times) == 45 and all(abs(t - i / 30) < 1e-3 for i, t in enumerate(times))


def test_the_job_sweep_runs_every_job_in_a_fresh_process_and_reads_their_reports(capsys):
    from emonet.bench.run import job_sweep
    # Clips of up to `short` seconds, and every photo set but the largest, run `repeat` times.
    # (The largest set has a steady state: three images after the first.)
    text = job_sweep("cpu", seconds=(1,), photos=(2, 4), released=False, repeat=2, short=0)
    rows = [line for line in text.splitlines() if line.startswith("| video") or line.startswith("| photos")]
    assert len(rows) == 4 and "failed" not in "".join(rows) and "–" not in "".join(rows), text
    assert "| video, analysis | 1 s (30 frames) |" in rows[0] and "| photos | 4 (4 images) |" in rows[-1]
    assert all(row.endswith("×** |") for row in rows[:2] + rows[3:])
    assert "| photos | 2 (2 images, the median of 2 runs) |" in rows[2] and re.search(r"×\*\* \([\d.]+, [\d.]+\) \|$", rows[2])
    assert "\r" not in capsys.readouterr().err  # standard error is no terminal here: lines, not bar redraws


def test_off_a_terminal_the_mode_comparison_writes_lines_not_bar_redraws(tmp_path):
    with open(tmp_path / "err.txt", "w") as err:
        out = subprocess.run([sys.executable, "-m", "emonet.bench", "--device", "cpu", "--quick", "--modes", "released",
                              "--batch-sizes", "2", "--iters", "1"], stdout=subprocess.PIPE, stderr=err, text=True,
                             timeout=600, cwd=ROOT)
    text = (tmp_path / "err.txt").read_bytes().decode()  # as written: read_text would turn each \r into \n
    assert out.returncode == 0 and "| released |" in out.stdout
    assert "\r" not in text and "released: batch 1 " in text, text


def test_help_names_the_command_and_shows_examples():
    out = subprocess.run([sys.executable, "-m", "emonet.bench", "--help"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.startswith("usage: emonet-bench")
    assert "examples:" in out.stdout and "emonet-bench --device cpu --quick" in out.stdout
    assert "under a minute" not in out.stdout
    # How long the quick look takes, as a range for a named kind of machine, idle and busy.
    said = " ".join(out.stdout.split())
    assert "2-core machine: about 40 s with the cores idle, 80 s to 5 min while other work" in said


def test_the_auto_mode_is_the_tools_gpu_default():
    import torch

    from emonet.bench.run import GPU_DEFAULT, MODES
    from emonet.build import engine_config
    from emonet.engine import EngineConfig

    (auto,) = [m for m in MODES if m.name == "auto"]
    assert "auto" in GPU_DEFAULT and not auto.cudnn_benchmark
    assert EngineConfig(**auto.engine) == engine_config("auto", torch.device("cuda", 0))
    (served,) = [m for m in MODES if m.name == "auto-compiled"]
    assert served.compiled and not served.cudnn_benchmark
    assert EngineConfig(**served.engine) == engine_config("auto", torch.device("cuda", 0), compiled=True)


def test_a_repeated_jobs_row_is_its_median_run_whose_columns_give_its_ratio():
    from emonet.bench.run import sweep_table
    run = lambda wall, first, load, rate=None: {"wall_s": wall, "first_result_s": first, "model_load_s": load,  # noqa: E731
                                                 "frames_per_s": rate, "images_per_s": None, "graphs_ready_s": 0.5}
    jobs = [("video, analysis", "10 s", 300), ("video, analysis", "1 min", 1800)]
    runs = [[(run(6.0, 4.9, 0.6), 3.5), (run(5.0, 4.2, 0.5), 3.4), (run(8.5, 5.9, 0.7), 4.6)],
            [(run(9.0, 4.5, 0.6, rate=900.0), 3.6)]]
    rows = [line for line in sweep_table(jobs, runs) if line.startswith("| video")]
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert cells[1] == "10 s (300 frames, the median of 3 runs)"
    wall, floor, load, frames = float(cells[2]), float(cells[3]), float(cells[5]), float(cells[6])
    assert (wall, floor, load) == (6.0, 3.5, 0.6) and frames == round(300 / 900, 2)
    assert cells[4] == "4.90 (+1.40)" and cells[7].startswith(f"**{wall / (floor + load + 300 / 900):.2f}×** (")


def test_each_mode_reports_its_spread_over_batches_beside_its_agreement(tmp_path):
    from emonet.bench import main
    report, data = tmp_path / "modes.md", tmp_path / "modes.json"
    assert main(["--modes", "fp32-eager", "--device", "cpu", "--quick", "--batch-sizes", "2", "--iters", "3",
                 "--weights", "random", "--markdown", str(report), "--json", str(data)]) == 0
    (row,) = json.loads(data.read_text())["modes"]
    assert row["cold"]["warmup_s"] == 0.0  # as the tools' CPU engines: no warm-up, nothing to autotune
    spread = row["cold"]["batch_spread"]
    assert row["cold"]["batch_spread_sizes"] == [1, 3, 8] and 0 <= spread < 1e-3  # the CPU's fp32: tiny, or 0
    header, _, line = [l for l in report.read_text().splitlines() if l.startswith("|")][:3]
    assert header.split("|")[-2].strip() == "spread over batches"
    assert line.split("|")[-2].strip() == ("0" if spread == 0 else f"{spread:.2g}")
    assert "alone and in batches of 1, 3, 8" in report.read_text()



@pytest.mark.parametrize("stage", ["model, engine and detector", "model, engine, detector and the first detection"])
def test_the_sweep_reads_the_model_load_of_a_photo_on_either_device(stage):
    # On a GPU the photo tool's load stage holds its first detection too (run beside the load).
    from emonet.bench.sweep import report_figures
    from emonet.timing import StartupClock

    clock = StartupClock()
    clock.stages = [("Python start-up and imports", 2.0), (stage, 2.75), ("first image", 2.9)]
    figures = report_figures(clock.format() + "\n")
    assert figures["first_result_s"] == 2.9 and figures["model_load_s"] == 0.75
