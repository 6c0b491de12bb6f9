"""test.py end to end on a small AffectNet-format dataset and a CSV, in one and in two processes."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emonet.engine.check import SAMPLE_PHOTO
from emonet.classes import EXPRESSIONS_8
from emonet.evaluation.datasets import csv_dataset
from emonet.evaluation.loop import PUBLISHED, Predictions, path_from, predictions_csv, published_table
from tests.affectnet_fixture import make_affectnet

pytestmark = pytest.mark.slow  # end-to-end: the tools in processes of their own

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evaluate(*args, torchrun=0, cwd=ROOT):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(torchrun),
                "--master-addr", "127.0.0.1", "--master-port", str(_free_port())] if torchrun else [sys.executable]
    return subprocess.run([*launcher, str(ROOT / "test.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def affectnet_root(tmp_path_factory):
    return make_affectnet(tmp_path_factory.mktemp("affectnet"))


@pytest.fixture(scope="module")
def single_run(affectnet_root, ckpt_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run = evaluate("--dataset", "affectnet", "--root", affectnet_root, "--weights", ckpt_dir / "emonet_8.pth",
                   "--device", "cpu", "--workers", "0", "--batch-size", "4", "--report", out / "report.json",
                   "--predictions", out / "predictions.csv")
    assert run.returncode == 0, run.stderr
    return run, json.loads((out / "report.json").read_text()), out / "predictions.csv"


def test_affectnet_protocol_report(single_run):
    run, report, predictions = single_run
    assert report["n"] == 7 and report["counts"]["kept"] == 7 and report["flip"] is True
    m = report["metrics"]
    assert set(m) == {"expression", "valence", "arousal"}
    assert len(m["expression"]["confusion_matrix"]) == 8 and sum(map(sum, m["expression"]["confusion_matrix"])) == 7
    assert set(m["valence"]) == {"RMSE", "SAGR", "PCC", "CCC", "n"}
    assert report["published"] == PUBLISHED[8]
    assert "published (8 classes)" in run.stderr and "this run" in run.stderr
    dropped = {k: v for k, v in report["counts"].items() if k not in ("in_index", "kept") and v}
    assert dropped and f"dropped {sum(dropped.values())} samples: " in run.stderr  # said on the console
    rows = list(csv.DictReader(predictions.open()))
    assert len(rows) == 7 and rows[0]["image"].endswith("img_0.jpg") and "p_Contempt" in rows[0]


def test_two_processes_give_the_single_process_metrics(single_run, affectnet_root, ckpt_dir, tmp_path):
    run = evaluate("--dataset", "affectnet", "--root", affectnet_root, "--weights", ckpt_dir / "emonet_8.pth",
                   "--device", "cpu", "--workers", "0", "--batch-size", "4", "--report", tmp_path / "r.json",
                   "--predictions", tmp_path / "p.csv", torchrun=2)
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    single = single_run[1]
    assert report["processes"] == 2 and report["n"] == single["n"] == 7  # 7 samples on 2 ranks: one padded
    assert report["metrics"]["expression"]["confusion_matrix"] == single["metrics"]["expression"]["confusion_matrix"]
    for dim in ("valence", "arousal"):
        for key in ("RMSE", "SAGR", "CCC"):
            assert report["metrics"][dim][key] == pytest.approx(single["metrics"][dim][key], abs=1e-5)
        # Untrained weights predict nearly the same value for every face (spread ~2e-4), so PCC divides
        # by a tiny deviation: the 1e-7 rounding differences of other batch compositions move it by 1e-4.
        assert report["metrics"][dim]["PCC"] == pytest.approx(single["metrics"][dim]["PCC"], rel=2e-3)
    ours = [r["pred_valence"] for r in csv.DictReader((tmp_path / "p.csv").open())]
    theirs = [r["pred_valence"] for r in csv.DictReader(single_run[2].open())]
    assert np.allclose(np.array(ours, float), np.array(theirs, float), atol=1e-5)


def test_no_flip_changes_only_valence_and_arousal(single_run, affectnet_root, ckpt_dir, tmp_path):
    run = evaluate("--dataset", "affectnet", "--root", affectnet_root, "--weights", ckpt_dir / "emonet_8.pth",
                   "--device", "cpu", "--workers", "0", "--no-flip", "--report", tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["metrics"]["expression"]["ACC"] == single_run[1]["metrics"]["expression"]["ACC"]
    assert report["metrics"]["valence"]["RMSE"] != single_run[1]["metrics"]["valence"]["RMSE"]


def test_missing_images_stop_the_run_unless_skipped(affectnet_root, ckpt_dir, tmp_path):
    import shutil
    root = tmp_path / "copy"
    shutil.copytree(affectnet_root, root)
    (root / "test" / "1" / "img_1.jpg").unlink()
    args = ["--dataset", "affectnet", "--root", root, "--weights", ckpt_dir / "emonet_8.pth", "--device", "cpu",
            "--workers", "0"]
    run = evaluate(*args)
    assert run.returncode == 2 and "1 of 7 images are missing or empty" in run.stderr and "img_1.jpg" in run.stderr
    run = evaluate(*args, "--skip-missing", "--report", tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "r.json").read_text())["n"] == 6


def test_csv_dataset_with_detector_and_partial_labels(ckpt_dir, tmp_path):
    photo = SAMPLE_PHOTO
    (tmp_path / "labels.csv").write_text(f"path,valence\n{photo},0.4\n{photo},-0.1\n")
    run = evaluate("--dataset", "csv", "--csv", tmp_path / "labels.csv", "--weights", ckpt_dir / "emonet_8.pth",
                   "--device", "cpu", "--workers", "0", "--report", tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    metrics = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert set(metrics) == {"valence"} and metrics["valence"]["n"] == 2


def test_bad_invocations_are_one_line(tmp_path):
    run = evaluate("--dataset", "affectnet", "--root", tmp_path, "--weights", "random", "--device", "cpu")
    assert run.returncode == 2 and "AffectNet index not found" in run.stderr and "Traceback" not in run.stderr
    run = evaluate("--dataset", "csv", "--weights", "random", "--device", "cpu")
    assert run.returncode == 2 and "needs --csv FILE" in run.stderr


def test_help_has_a_try_it_example_and_the_exit_codes():
    run = evaluate("--help")
    assert run.returncode == 0 and "--weights random" in run.stdout and "exit codes:" in run.stdout
    codes = run.stdout[run.stdout.index("exit codes:"):]
    # The evaluation's own codes: images and the dataset, no video tool's frames.
    assert "frame" not in codes and "2 bad input or options (a dataset file, a label" in codes
    assert "3 the report or predictions could not be written" in codes and "130 interrupted" in codes


def test_an_output_that_cannot_be_written_is_one_line_and_exit_3(tmp_path, monkeypatch, capsys):
    import errno

    import emonet.io.atomic
    from emonet.apps.evaluate import main

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(emonet.io.atomic, "write_text", full)
    # A given box: no detector, one face, one engine call.
    (tmp_path / "l.csv").write_text(f"image,valence,x1,y1,x2,y2\n{SAMPLE_PHOTO},0.5,150,40,300,240\n")
    code = main(["--dataset", "csv", "--csv", str(tmp_path / "l.csv"), "--weights", "random", "--device", "cpu",
                 "--workers", "0", "--no-flip", "--report", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 3 and f"error: {tmp_path / 'r.json'}: could not be written (No space left on device)" in err, err
    assert not (tmp_path / "r.json").exists()


def test_published_table_layout():
    text = published_table({"expression": {"ACC": 0.5}, "valence": {"CCC": 0.1, "PCC": 0.2, "RMSE": 0.3,
                                                                   "SAGR": 0.4}}, 8)
    lines = text.splitlines()
    assert "ACC" in lines[0] and "V CCC" in lines[0] and "A SAGR" in lines[0]
    assert lines[2].startswith("published (8 classes)") and "0.750" in lines[2] and "0.820" in lines[2]
    assert lines[3].startswith("this run") and "0.500" in lines[3]
    # A negative value keeps the columns where the header has them.
    negative = published_table({"valence": {"CCC": -0.1, "PCC": -0.2, "RMSE": 0.3, "SAGR": 0.4}}, 8).splitlines()
    bars = [[i for i, c in enumerate(line) if c == "|"] for line in negative if "|" in line]
    assert all(b == bars[0] for b in bars) and "-0.100" in negative[-1]


def _two_faces(path: Path) -> Path:
    """A photo with the sample's face twice: large on the left edge, small near the centre."""
    import cv2

    face = cv2.imread(str(SAMPLE_PHOTO))[40:240, 140:310]
    canvas = np.full((480, 900, 3), 90, np.uint8)
    canvas[40:440, 0:340] = cv2.resize(face, (340, 400))
    canvas[170:310, 390:510] = cv2.resize(face, (120, 140))
    cv2.imwrite(str(path), canvas)
    return path


def test_several_faces_are_said_and_the_face_rule_chooses(ckpt_dir, tmp_path):
    photo = _two_faces(tmp_path / "two.png")
    (tmp_path / "labels.csv").write_text(f"path,valence\n{photo},0.4\n{SAMPLE_PHOTO},-0.1\n")
    boxes = {}
    for rule in ("largest", "central"):
        run = evaluate("--dataset", "csv", "--csv", tmp_path / "labels.csv", "--weights", ckpt_dir / "emonet_8.pth",
                       "--device", "cpu", "--workers", "0", "--face", rule, "--predictions", tmp_path / f"{rule}.csv")
        assert run.returncode == 0, run.stderr
        assert "note: 1 image held several faces" in run.stderr and "--face score|largest|central" in run.stderr
        row = next(r for r in csv.DictReader((tmp_path / f"{rule}.csv").open()) if r["image"].endswith("two.png"))
        assert int(row["faces_found"]) >= 2
        boxes[rule] = float(row["detected_x2"]) - float(row["detected_x1"])
    assert boxes["largest"] > 1.5 * boxes["central"], boxes


def test_nothing_to_score_is_an_error_unless_predictions_only(ckpt_dir, tmp_path):
    (tmp_path / "paths.csv").write_text(f"path\n{SAMPLE_PHOTO}\n")
    common = ("--dataset", "csv", "--csv", tmp_path / "paths.csv", "--weights", ckpt_dir / "emonet_8.pth",
              "--device", "cpu", "--workers", "0")
    run = evaluate(*common)
    assert run.returncode == 2 and "no labels to score against" in run.stderr and "Traceback" not in run.stderr
    run = evaluate(*common, "--predictions", tmp_path / "p.csv")
    assert run.returncode == 0 and "predictions only, nothing scored" in run.stderr, run.stderr
    assert len(list(csv.DictReader((tmp_path / "p.csv").open()))) == 1


def test_half_a_box_is_an_error_naming_the_line(tmp_path):
    (tmp_path / "half.csv").write_text(f"path,valence,x1,y1,x2,y2\n{SAMPLE_PHOTO},0.1,1,2,3,4\n{SAMPLE_PHOTO},0.2,10,20,,\n")
    run = evaluate("--dataset", "csv", "--csv", tmp_path / "half.csv", "--weights", "random", "--device", "cpu")
    assert run.returncode == 2 and "half.csv:3: a box needs all of x1, y1, x2, y2" in run.stderr, run.stderr


def test_argument_errors_are_one_line_pointing_to_help():
    run = evaluate("--dataset", "csv", "--csv", "x.csv", "--batch-size", "0")
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr
    assert "--batch-size must be at least 1, not 0 (see " in run.stderr and "--help)" in run.stderr


def test_a_label_out_of_range_is_one_line_naming_the_row_and_the_range(tmp_path):
    (tmp_path / "l.csv").write_text(f"image,expression,valence,arousal\n{SAMPLE_PHOTO},Happy,0.5,0.1\n"
                                    f"{SAMPLE_PHOTO},Sad,2.5,0.1\n")
    run = evaluate("--dataset", "csv", "--csv", tmp_path / "l.csv", "--weights", "random", "--device", "cpu")
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith("error: "), run.stderr
    assert "l.csv:3: valence 2.5 is outside [-1, 1]" in run.stderr and "Traceback" not in run.stderr


def test_the_predictions_file_reads_back_as_csv_with_the_same_metrics(tmp_path):
    import shutil

    portraits = ROOT / "tests" / "data" / "portraits"
    (tmp_path / "data").mkdir()
    for name in ("biden.jpg", "obama2.jpg"):
        shutil.copy(portraits / name, tmp_path / "data" / name)
    # Paths relative to the CSV's folder; one face the detector finds, one a box gives.
    (tmp_path / "data" / "labels.csv").write_text("image,expression,valence,arousal,x1,y1,x2,y2\n"
                                                  "biden.jpg,Happy,0.5,0.2,,,,\n"
                                                  "obama2.jpg,sad,-0.4,,110,130,280,370\n")
    (tmp_path / "out").mkdir()
    common = ("--weights", "random", "--device", "cpu", "--workers", "0", "--no-flip")
    # Run from the data's parent, with relative paths: the paths written must not depend on where the tool ran.
    first = evaluate("--dataset", "csv", "--csv", "data/labels.csv", *common, "--predictions", "out/p.csv",
                     "--report", "out/first.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "p.csv").open()))
    assert [r["image"] for r in rows] == ["../data/biden.jpg", "../data/obama2.jpg"]
    assert [(r["expression"], r["valence"], r["arousal"]) for r in rows] == [("Happy", "0.5", "0.2"), ("Sad", "-0.4", "")]
    assert all(r["pred_expression"] and -1 <= float(r["pred_valence"]) <= 1 for r in rows)
    assert rows[0]["faces_found"] == "1" and rows[0]["x1"] == "" and rows[1]["x1"] == "110.0"
    again = evaluate("--dataset", "csv", "--csv", tmp_path / "out" / "p.csv", *common,
                     "--report", tmp_path / "again.json")
    assert again.returncode == 0, again.stderr
    metrics = [json.loads(p.read_text())["metrics"] for p in (tmp_path / "out" / "first.json", tmp_path / "again.json")]
    assert set(metrics[0]) == {"expression", "valence", "arousal"} and metrics[0] == metrics[1]
    # Written over the --csv, the predictions would replace the labels being read: refused before any work.
    over = evaluate("--dataset", "csv", "--csv", tmp_path / "out" / "p.csv", *common, "--predictions",
                    tmp_path / "out" / "p.csv")
    assert over.returncode == 2 and "is also an input" in over.stderr, over.stderr


def test_a_predictions_file_gives_back_each_sample_its_crop_labels_and_image(tmp_path):
    lm = " ".join(f"{100 + 40 * np.cos(t):.3f} {120 + 50 * np.sin(t):.3f}" for t in np.linspace(0, 6.2, 68))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "l.csv").write_text("image,expression,valence,arousal,x1,y1,x2,y2,landmarks\n"
                                             f"a.jpg,2,0.1,-0.25,,,,,{lm}\n"
                                             "b.jpg,,,0.3333333333333333,10.5,20,110,140.25,\n")
    given = csv_dataset(tmp_path / "data" / "l.csv", None, EXPRESSIONS_8)
    preds = Predictions(np.arange(2), np.full((2, 8), 1 / 8), np.zeros(2), np.zeros(2))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "p.csv").write_text(predictions_csv(given, preds, tmp_path / "out"))
    back = csv_dataset(tmp_path / "out" / "p.csv", None, EXPRESSIONS_8)
    for a, b in zip(given.samples, back.samples):
        assert a.path.resolve() == b.path.resolve() and a.label == b.label
        assert np.array_equal([a.valence, a.arousal], [b.valence, b.arousal], equal_nan=True)
        assert np.array_equal(a.matrix, b.matrix)  # the same crop, to the bit


def test_a_path_is_relative_only_where_that_reaches_the_file(tmp_path):
    image = tmp_path / "data" / "a.jpg"
    image.parent.mkdir()
    image.write_bytes(b"x")
    (tmp_path / "deep" / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "deep" / "inner")
    assert path_from(tmp_path / "out", image) == str(Path("..") / "data" / "a.jpg")
    # Through the link, ".." is deep/, where no data/ is: the absolute path.
    assert path_from(tmp_path / "link", image) == str(image)
    assert path_from(None, image) == str(image)
