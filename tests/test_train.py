"""emonet-train on real faces: a student whose head differs from a fixed teacher's, fine-tuned on the teacher's
labels, moves towards the teacher; its checkpoint gives the photo tool the numbers of the trainer's evaluation;
bad input is one line; an interrupted run resumes."""
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from emonet.detection.blazeface import BlazeFaceDetector
from emonet.engine import Engine, EngineConfig, conditioned_model
from emonet.engine.check import SAMPLE_PHOTO
from emonet.pipeline import Pipeline
from emonet.train import TrainConfig, augment, train
from emonet.train.objective import objective

PORTRAITS = sorted((Path(__file__).parent / "data" / "portraits").glob("*.jpg")) + [SAMPLE_PHOTO]


def variants(out: Path, per_photo: int = 6, seed: int = 0) -> list[Path]:
    """Each real photo moved, scaled, turned a little, mirrored or not, its light changed: images of real faces
    that differ from each other (PNG: the pixels the trainer reads are these)."""
    rng = np.random.default_rng(seed)
    paths = []
    for photo in PORTRAITS:
        image = cv2.imread(str(photo))
        h, w = image.shape[:2]
        for k in range(per_photo):
            m = cv2.getRotationMatrix2D((w / 2, h / 2), rng.uniform(-8, 8), rng.uniform(0.85, 1.15))
            m[:, 2] += rng.uniform(-0.06, 0.06, 2) * (w, h)
            moved = cv2.warpAffine(image, m, (w, h), borderMode=cv2.BORDER_REFLECT)
            moved = np.clip((moved.astype(np.float32) - 128) * rng.uniform(0.7, 1.3) + 128 + rng.uniform(-30, 30),
                            0, 255).astype(np.uint8)
            if k % 2:
                moved = moved[:, ::-1]
            paths.append(out / f"{photo.stem}_{k}.png")
            cv2.imwrite(str(paths[-1]), moved)
    return paths


@pytest.fixture(scope="module")
def teacher():
    return conditioned_model()


@pytest.fixture(scope="module")
def labelled(teacher, tmp_path_factory) -> tuple[Path, Path]:
    """A CSV of real face images labelled by the teacher (through BlazeFace's detector and crop), and a
    student checkpoint: the teacher with its last layers drawn afresh."""
    root = tmp_path_factory.mktemp("train")
    paths = variants(root)
    pipeline = Pipeline(Engine(teacher, "cpu", EngineConfig(warmup=False)), BlazeFaceDetector("cpu"))
    with open(root / "labels.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "expression", "valence", "arousal"])
        for path in paths:
            faces = pipeline([cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)])[0]
            assert faces, f"no face found in {path.name}"
            top = faces[0]  # the detector's best-scoring face: the one the trainer takes
            w.writerow([path.name, top.expression, f"{top.valence:.6f}", f"{top.arousal:.6f}"])
    student = {k: v.clone() for k, v in teacher.state_dict().items()}
    # The outputs' layer mixed up: the class logits' rows rolled by three, valence read from minus the
    # arousal's row and arousal from the valence's (on the teacher's scale, so the learning rate is an
    # ordinary one).
    order = [3, 4, 5, 6, 7, 0, 1, 2, 9, 8]
    sign = torch.tensor([1.0] * 8 + [-1.0, 1.0])
    for name in ("weight", "bias"):
        value = student[f"emo_fc_2.3.{name}"][order]
        student[f"emo_fc_2.3.{name}"] = value * (sign[:, None] if value.ndim == 2 else sign)
    torch.save(student, root / "student.pth")
    return root / "labels.csv", root / "student.pth"


def read_log(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def test_a_student_fine_tuned_on_a_teachers_labels_moves_towards_it_and_its_checkpoint_reads_the_same(labelled, tmp_path):
    labels, student = labelled
    # The labels' detector (BlazeFace, the fixture's), so the student reads the crops the teacher labelled.
    config = TrainConfig(out_dir=str(tmp_path / "run"), csv=str(labels), weights=str(student), train="head",
                         epochs=30, batch_size=8, lr=1e-3, val_fraction=0.25, augment=False, device="cpu",
                         progress=False, detector="blazeface")
    result = train(config)
    before, after = result.before, result.after
    print(json.dumps({"before": {k: before[k].get("CCC", before[k].get("ACC")) for k in before},
                      "after": {k: after[k].get("CCC", after[k].get("ACC")) for k in after}}))
    assert after["valence"]["CCC"] >= before["valence"]["CCC"] + 0.3
    assert after["arousal"]["CCC"] >= before["arousal"]["CCC"] + 0.3
    assert after["expression"]["ACC"] >= before["expression"]["ACC"] + 0.2
    rows = read_log(result.log)
    assert [r["epoch"] for r in rows] == list(range(1, 31)) and rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000
    meta = json.loads((tmp_path / "run" / "best.meta.json").read_text())
    assert meta["base_weights"]["sha256"] and meta["seed"] == 0 and meta["data"]["val_samples"] == 8

    # The photo tool, given the checkpoint, reads a validation face as the trainer's evaluation did.
    with open(tmp_path / "run" / "best.predictions.csv", newline="") as fh:
        row = next(csv.DictReader(fh))
    out = tmp_path / "photo.json"
    done = subprocess.run([sys.executable, "-m", "emonet.apps.photo", "--image", row["image"], "--weights",
                           str(result.best), "--device", "cpu", "--detector", "blazeface", "--json", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    face = json.loads(out.read_text())["images"][0]["faces"][0]
    assert face["valence"] == pytest.approx(float(row["pred_valence"]), abs=1e-4)
    assert face["arousal"] == pytest.approx(float(row["pred_arousal"]), abs=1e-4)
    assert face["expression"] == row["pred_expression"]


def run_train(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emonet.apps.train", "--device", "cpu", "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("rows, says", [
    ([["missing.png", "Happy", "0.1", "0.2"]], "missing or empty"),
    ([["{img}", "Happy", "1.5", "0.2"]], "valence 1.5 is outside [-1, 1]"),
    ([["{img}", "Gleeful", "0.1", "0.2"]], "unknown expression 'Gleeful'"),
    ([["{img}", "9", "0.1", "0.2"]], "expression index 9 outside 0-7"),
    ([], "no rows"),
])
def test_bad_training_sets_are_one_line_and_exit_2(tmp_path, rows, says):
    image = tmp_path / "face.jpg"
    image.write_bytes(PORTRAITS[0].read_bytes())
    with open(tmp_path / "labels.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "expression", "valence", "arousal"])
        w.writerows([[c.format(img=image.name) for c in row] for row in rows])
    done = run_train("--csv", str(tmp_path / "labels.csv"), "--weights", "random", "--out", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith("error: ")
    assert says in done.stderr


def test_a_class_count_the_checkpoint_does_not_have_is_refused(labelled, tmp_path):
    labels, student = labelled
    done = run_train("--csv", str(labels), "--weights", str(student), "--nclasses", "5", "--out", str(tmp_path))
    assert done.returncode == 2 and "8-class checkpoint" in done.stderr and "Traceback" not in done.stderr


def test_sigterm_saves_a_state_that_resume_finishes_as_an_uninterrupted_run(labelled, tmp_path):
    import signal

    labels, student = labelled
    common = ["--csv", str(labels), "--weights", str(student), "--train", "head", "--no-augment",
              "--batch-size", "4", "--lr", "1e-3", "--val-fraction", "0.25"]
    whole = run_train(*common, "--epochs", "4", "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr

    args = [sys.executable, "-m", "emonet.apps.train", "--device", "cpu", "--quiet", *common, "--epochs", "4",
            "--out", str(tmp_path / "cut")]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    seen = ""
    while "epoch 1:" not in seen:  # stopped once an epoch is done
        line = proc.stderr.readline()
        assert line, f"the run ended early: {seen}"
        seen += line
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, seen + rest
    assert "--resume" in rest and (tmp_path / "cut" / "last.state").is_file()
    # Another command cannot go on with the state: one line, exit 2, the state kept.
    other = run_train(*["all" if a == "head" else a for a in common], "--epochs", "4", "--out", str(tmp_path / "cut"),
                      "--resume")
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr
    assert "its --train was head and this command gives all" in other.stderr
    resumed = run_train(*common, "--epochs", "4", "--out", str(tmp_path / "cut"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r"resuming .*last\.state: epoch [2-4] of 4, from its step \d+", resumed.stderr), resumed.stderr
    cut, uncut = read_log(tmp_path / "cut" / "log.csv"), read_log(tmp_path / "whole" / "log.csv")
    assert [list(r) for r in cut] == [list(r) for r in uncut]
    np.testing.assert_allclose([list(r.values()) for r in cut], [list(r.values()) for r in uncut], rtol=1e-6)


@pytest.mark.slow
def test_under_torchrun_a_stop_asked_of_one_process_stops_both_at_the_same_step_and_saves_a_state(labelled,
                                                                                                  tmp_path):
    # Neither process waits for the other in a collective it will never join: no hang, a state to resume from.
    import os
    import signal
    import socket
    import time

    labels, student = labelled
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp"
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                 "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "emonet.apps.train",
                                 "--device", "cpu", "--quiet", "--csv", str(labels), "--weights", str(student),
                                 "--train", "head", "--no-augment", "--epochs", "400", "--batch-size", "2",
                                 "--val-fraction", "0.25", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 300
        while not ((out / "log.csv").is_file() and len(read_log(out / "log.csv")) >= 1):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[1][-3000:]
            time.sleep(0.2)
        workers = []
        for pid in os.listdir("/proc"):
            try:
                stat = open(f"/proc/{pid}/stat").read()
                environ = open(f"/proc/{pid}/environ", "rb").read()
            except (OSError, ValueError):
                continue
            if pid.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == launcher.pid:
                workers.append((b"\0RANK=1\0" in b"\0" + environ, int(pid)))
        (second,) = [pid for is_second, pid in workers if is_second]
        os.kill(second, signal.SIGTERM)  # the second process only
        launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    state = torch.load(out / "last.state", weights_only=True)
    assert state["epoch"] < 400 and len(read_log(out / "log.csv")) == state["epoch"]


def test_augmentation_is_seeded_and_mirrors_shifts_and_recolours_within_range():
    from emonet.engine.check import real_face_crops
    x = real_face_crops(4).float().div(255.0)
    a = augment(x, torch.Generator().manual_seed(3))
    b = augment(x, torch.Generator().manual_seed(3))
    c = augment(x, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == x.shape and 0 <= float(a.min()) and float(a.max()) <= 1
    assert float((a - x).abs().mean()) > 0.01  # changed, yet still the face: close to it or its mirror
    assert min(float((a - x).abs().mean()), float((a - x.flip(-1)).abs().mean())) < 0.2


def test_the_objective_is_least_for_the_targets_themselves_and_skips_absent_ones():
    torch.manual_seed(0)
    labels, valence, arousal = torch.tensor([0, 1, 2, -1]), torch.tensor([0.5, -0.2, 0.1, float("nan")]), \
        torch.tensor([0.3, 0.4, -0.6, 0.0])
    exact = {"expression": torch.nn.functional.one_hot(labels.clamp(min=0), 8).float() * 20,
             "valence": torch.nan_to_num(valence), "arousal": arousal}
    loss, terms = objective(exact, labels, valence, arousal)
    assert float(loss) < 1e-3 and set(terms) == {"ce", "valence_rmse", "valence_pcc", "valence_ccc",
                                                 "arousal_rmse", "arousal_pcc", "arousal_ccc"}
    wrong = {k: torch.randn_like(v) for k, v in exact.items()}
    assert float(objective(wrong, labels, valence, arousal)[0]) > 1.0
    # The absent targets' samples change nothing: the loss is that of the others alone.
    some = slice(0, 3)
    alone = objective({k: v[some] for k, v in wrong.items()}, labels[some], valence[some], arousal[some])[0]
    moved = {k: v.clone() for k, v in wrong.items()}
    moved["expression"][3], moved["valence"][3] = 5.0, 0.9
    assert float(objective(moved, labels, valence, arousal)[0]) == pytest.approx(
        float(objective(wrong, labels, valence, arousal)[0]), abs=1e-6)
    assert float(objective(wrong, labels, valence, arousal.clone().index_fill_(0, torch.tensor([3]), float("nan")))[0]) \
        == pytest.approx(float(alone), abs=1e-5)
    # Nothing to learn from (no target, or one valence: correlation needs two): zero, and no gradient's NaN.
    out = {k: v.clone().requires_grad_() for k, v in wrong.items()}
    nan = torch.full((4,), float("nan"))
    none, terms = objective(out, torch.full((4,), -1), nan, nan.clone().index_fill_(0, torch.tensor([1]), 0.2))
    none.backward()
    assert float(none.detach()) == 0.0 and all(float(t.detach()) == 0.0 for t in terms.values())
    assert all(torch.isfinite(v.grad).all() and not v.grad.any() for v in out.values())


def test_torchrun_trains_on_two_processes_the_frozen_network_untouched(labelled, tmp_path):
    import socket

    from emonet.models.weights import read_state_dict

    labels, student = labelled
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(port), "-m", "emonet.apps.train", "--device", "cpu",
                           "--quiet", "--csv", str(labels), "--weights", str(student), "--train", "head",
                           "--epochs", "2", "--batch-size", "8", "--val-fraction", "0.25", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                             "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert [r["epoch"] for r in read_log(tmp_path / "log.csv")] == [1, 2]
    before, after = read_state_dict(student), read_state_dict(tmp_path / "best.pth")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("emo_fc_2.") for k in changed)


def test_the_loader_gives_the_batches_in_order_from_its_reading_processes():
    from emonet.train.data import CropSet, loader

    rng = np.random.default_rng(0)
    n = 12
    data = CropSet(rng.integers(0, 256, (n, 256, 256, 3), dtype=np.uint8), np.arange(n) % 8,
                   rng.uniform(-1, 1, n).astype(np.float32), np.full(n, np.nan, np.float32),
                   [f"{i}.png" for i in range(n)])
    order = [np.sort(b) for _ in range(2) for b in np.array_split(rng.permutation(n), 4)]
    got = list(loader(data, iter(order), workers=2))
    assert [g[4].tolist() for g in got] == [b.tolist() for b in order]
    for (pixels, labels, valence, arousal, index), b in zip(got, order):
        assert pixels.dtype == torch.uint8 and np.array_equal(pixels.numpy(), data.crops[b])
        assert labels.tolist() == data.labels[b].tolist() and torch.equal(valence, torch.from_numpy(data.valence[b]))
        assert torch.isnan(arousal).all()



READER = """
import signal, sys, time
import numpy as np
from emonet.train.data import CropSet, Reader
n = 16
data = CropSet(np.zeros((n, 8, 8, 3), np.uint8), np.zeros(n, np.int64), np.zeros(n, np.float32),
               np.zeros(n, np.float32), ["x"] * n)
reader = Reader(data, [np.arange(4) + i % 12 for i in range(100_000)], workers=2)
"""

READING_THROUGH_A_STOP = """
import multiprocessing, signal, sys, time
multiprocessing.set_start_method(sys.argv[1])
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))  # as the trainer does: finish the step, save
""" + READER + """
try:
    print("reading", flush=True)  # the stop comes while the reading processes may still be starting
    while not stopped:
        time.sleep(0.001)
    after = sum(1 for _, batch in zip(range(20), reader))  # the reading goes on after the stop
finally:
    reader.close()
print("read after the stop:", after, flush=True)
"""

FAILING_WHILE_READING = READER + """
try:
    next(reader)
    raise RuntimeError("the step failed")
finally:
    reader.close()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])  # Linux's default before Python 3.14, and macOS's
def test_a_job_stopped_as_a_whole_leaves_the_trainer_its_reading_processes_to_finish_the_step(method):
    # A batch scheduler's cancel or time limit, systemd and `timeout` send SIGTERM to every process of the job: the
    # reading processes leave it to the trainer (which saves a state first) and read on.
    import os
    import signal

    proc = subprocess.Popen([sys.executable, "-c", READING_THROUGH_A_STOP, method], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "reading"
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "read after the stop: 20", out + err


def test_a_run_that_fails_while_reading_ends_its_reading_processes_and_exits():
    # They leave SIGTERM to the trainer, which is how the interpreter's exit ends them: the reader, closed,
    # ends them itself (without, the process waits for them forever).
    out = subprocess.run([sys.executable, "-c", FAILING_WHILE_READING], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "the step failed" in out.stderr

@pytest.mark.parametrize("n, size, least, sizes", [
    (2574, 256, 2, [234] * 11), (257, 256, 2, [129, 128]), (10, 4, 2, [4, 3, 3]), (8, 4, 2, [4, 4]), (0, 4, 2, []),
    (5, 2, 2, [3, 2]), (3, 2, 2, [3]),  # never a batch of one: BatchNorm cannot train on it
    (9, 4, 4, [5, 4]),  # under torchrun on two processes: two crops each at least
])
def test_an_epoch_is_cut_into_as_few_batches_as_hold_it_of_near_equal_sizes(n, size, least, sizes):
    from emonet.train.data import batches

    got = batches(n, size, torch.Generator().manual_seed(3), least=least)
    assert [len(b) for b in got] == sizes
    assert sorted(np.concatenate(got).tolist() if got else []) == list(range(n))  # every sample once
    again = batches(n, size, torch.Generator().manual_seed(3), least=least)
    assert all(np.array_equal(a, b) for a, b in zip(got, again))  # the seed alone decides


def test_a_damaged_state_is_refused_in_one_line(labelled, tmp_path):
    labels, student = labelled
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last.state").write_bytes(b"not a state")
    done = run_train("--csv", str(labels), "--weights", str(student), "--out", str(tmp_path / "run"), "--resume")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "last.state: cannot be read as a saved state" in done.stderr
