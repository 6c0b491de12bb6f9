"""demo.py end to end (a real subprocess, real files) and the pipeline behind it."""
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from emonet.engine.check import SAMPLE_PHOTO
import emonet
from emonet.detection.blazeface import BlazeFaceDetector
from emonet.detection.whole import WholeImageDetector
from emonet.engine import Engine, EngineConfig
from emonet.io.images import read_image
from emonet.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[1]
PHOTO = SAMPLE_PHOTO


def demo(*args, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "demo.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_photo_to_json_and_annotated_image(tmp_path):
    out = demo("--image", PHOTO, "--weights", "random", "--output", tmp_path / "out", "--json", "-",
               "--device", "cpu")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["untrained"] is True and doc["classes"][7] == "Contempt" and doc["detector"] == "yunet"
    (record,) = doc["images"]
    assert record["image"].endswith("astronaut.jpg") and record["width"] == 512 and record["error"] is None
    (face,) = record["faces"]
    assert set(face) == {"face_id", "box", "score", "detected", "expression", "expression_index", "probabilities",
                         "valence", "arousal", "landmarks"}
    x1, y1, x2, y2 = face["box"]
    assert x1 < 200 and x2 > 250 and y1 < 110 and y2 > 160  # covers the face
    assert abs(sum(face["probabilities"].values()) - 1) < 1e-3 and face["expression"] in doc["classes"]
    assert -1 <= face["valence"] <= 1 and len(face["landmarks"]) == 68
    annotated = read_image(tmp_path / "out" / "astronaut_emonet.jpg")
    assert annotated.shape == (512, 512, 3)
    assert "predictions are meaningless" in out.stderr and "first call" in out.stderr
    assert "steady state" in out.stderr
    # The time from process start to the first result, and where it went.
    startup = doc["latency"]["startup"]
    # (On the CPU the first image is detected after the load, not beside it: the two would share the cores.)
    assert list(startup["stages_s"])[-2:] == ["model, engine and detector", "first image"]
    assert startup["from"] == "process start"
    assert abs(sum(startup["stages_s"].values()) - startup["first_result_s"]) < 1e-3
    assert f"first result {startup['first_result_s']:.2f} s after the process started" in out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the first detection runs beside the load on a GPU")
def test_on_a_gpu_the_first_image_is_detected_while_the_model_loads_and_its_latency_counts_it(tmp_path):
    out = demo("--image", PHOTO, PORTRAIT, "--weights", "random", "--json", "-", "--device", "cuda:0")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [len(r["faces"]) for r in doc["images"]] == [1, 1]
    stages = list(doc["latency"]["startup"]["stages_s"])
    assert stages[-2:] == ["model, engine, detector and the first detection", "first image"]
    # The first detection's first calls on a GPU take far more than 10 ms: its latency holds them.
    latency = doc["latency"]
    assert latency["per_image"]["first_ms"] > latency["emonet_per_image"]["first_ms"] + 10


def test_no_face_bad_image_and_json_file(tmp_path):
    cv2.imwrite(str(tmp_path / "wall.png"), np.full((120, 200, 3), 90, np.uint8))
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    shutil.copy(PHOTO, tmp_path / "face.jpg")
    out = demo("--image", tmp_path, "--weights", "random", "--json", tmp_path / "r.json", "--device", "cpu",
               "--csv", tmp_path / "faces.csv")
    assert out.returncode == 1  # one image could not be read
    assert "broken.jpg: not an image OpenCV can decode" in out.stderr
    assert "wall.png: no face found" in out.stderr and "Traceback" not in out.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    by_name = {Path(r["image"]).name: r for r in doc["images"]}
    assert by_name["wall.png"]["faces"] == [] and by_name["wall.png"]["error"] is None
    assert "decode" in by_name["broken.jpg"]["error"]
    # The CSV beside the JSON: one row per face per image, the same figures.
    with (tmp_path / "faces.csv").open(newline="") as fh:
        rows = {Path(r["image"]).name: r for r in csv.DictReader(fh)}
    assert set(rows) == {"wall.png", "broken.jpg", "face.jpg"}
    assert rows["wall.png"]["face_id"] == "" and rows["wall.png"]["error"] == ""
    assert "decode" in rows["broken.jpg"]["error"]
    (face,) = by_name["face.jpg"]["faces"]
    row = rows["face.jpg"]
    assert row["face_id"] == "0" and row["expression"] == face["expression"] and row["untrained"] == "1"
    assert float(row["valence"]) == face["valence"] and [float(row[k]) for k in ("x1", "y1", "x2", "y2")] == face["box"]
    assert float(row["p_Happy"]) == face["probabilities"]["Happy"]


def test_a_lone_unreadable_image_fails_before_the_engine_is_built(tmp_path):
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    out = demo("--image", tmp_path / "broken.jpg", "--weights", "random", "--device", "cpu")
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "not an image OpenCV can decode" in out.stderr and "EmoNet (" not in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--image", "nowhere.jpg"], "nowhere.jpg: no such file or folder"),
    (["--image", PHOTO, "--weights", "missing.pth"], "checkpoint not found"),
    (["--image", PHOTO, "--device", "cuda:7"], "cuda:7"),
])
def test_bad_input_is_one_clear_line(args, message):
    out = demo(*args)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: ") and message in out.stderr
    assert "Traceback" not in out.stderr


def test_unwritable_output_fails_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = demo("--image", PHOTO, "--weights", "random", "--output", blocker / "out")
    assert out.returncode == 2 and f"{blocker}: is a file, not a folder" in out.stderr and "face 0" not in out.stderr


def test_an_output_that_would_replace_an_input_is_refused(tmp_path):
    photo = tmp_path / "p.jpg"
    photo.write_bytes(PHOTO.read_bytes())
    for flag in ("--output", "--csv", "--json"):
        out = demo("--image", photo, "--weights", "random", "--device", "cpu", flag, f"{tmp_path}/./p.jpg")
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip() == f"error: {photo}: is also an input, which this output would replace; give the " \
                                     f"output another name", out.stderr
    assert photo.read_bytes() == PHOTO.read_bytes() and sorted(tmp_path.iterdir()) == [photo]
    # Annotated into the photos' own folder, which holds an input named as an annotated image: it is kept.
    (tmp_path / "p_emonet.jpg").write_bytes(PHOTO.read_bytes())
    out = demo("--image", tmp_path, "--weights", "random", "--device", "cpu", "--output", tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "p_emonet.jpg").read_bytes() == PHOTO.read_bytes()
    assert {p.name for p in tmp_path.iterdir()} == {"p.jpg", "p_emonet.jpg", "p_emonet_1.jpg", "p_emonet_emonet.jpg"}


def test_help_explains_the_options():
    out = demo("--help")
    assert out.returncode == 0
    for option in ("--image", "--json", "--output", "--weights", "--nclasses", "--device", "--detector",
                   "--refine", "--no-cudnn-benchmark", "--deterministic"):
        assert option in out.stdout
    # The photo tool's own words: nothing of video frames or faces followed between them (the shared model
    # options say those to emonet-video only); '-' is standard output for each data output.
    text = " ".join(out.stdout.split())
    assert "video" not in text and "frame" not in text and "followed" not in text
    assert "--json - or --csv - (one of them) writes that output to stdout" in text
    assert "--json FILE write results as JSON to FILE ('-' for stdout)" in text
    assert "--csv FILE write one row per face per image to FILE ('-' for stdout;" in text


PORTRAIT = ROOT / "tests" / "data" / "portraits" / "obama.jpg"


def test_csv_to_stdout_and_repeated_image_options(tmp_path):
    # `--csv -` is standard output, as `--json -` is (no file named "-"); --image given twice adds both.
    out = demo("--image", PHOTO, "--image", PORTRAIT, "--weights", "random", "--device", "cpu", "--csv", "-",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(out.stdout.splitlines()))
    assert [Path(r["image"]).name for r in rows] == ["astronaut.jpg", "obama.jpg"] and rows[0]["face_id"] == "0"
    assert "2 images, 2 faces" in out.stderr and not list(tmp_path.iterdir())


def test_outputs_that_would_overwrite_each_other_are_one_line_before_the_model_loads(tmp_path):
    (tmp_path / "link.json").symlink_to(tmp_path / "r.json")
    for args, message in [
        (["--json", "-", "--csv", "-"], "error: --json - and --csv -: only one output can go to standard output; "
                                        "give the other a file name"),
        (["--json", tmp_path / "r.json", "--csv", f"{tmp_path}/./r.json"],
         f"error: --json {tmp_path / 'r.json'} and --csv {tmp_path}/./r.json name the same file, so one would "
         f"overwrite the other; give each output a name of its own"),
        (["--output", tmp_path / "a.jpg", "--json", tmp_path / "a.jpg"], "name the same file"),
        (["--csv", tmp_path / "r.json", "--json", tmp_path / "link.json"], "name the same file"),
        (["--output", "-"], "error: --output -: annotated images cannot go to standard output"),
    ]:
        out = demo("--image", PHOTO, "--weights", "random", "--device", "cpu", *args, cwd=tmp_path)
        assert out.returncode == 2 and out.stdout == "", out.stderr
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ") and message in out.stderr, out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["link.json"]  # nothing written, not even the link's target


@pytest.fixture(scope="module")
def engine(reference_model):
    model = reference_model
    return model, Engine(model, "cpu", EngineConfig(warmup=False))


def test_detector_none_reproduces_the_released_demo_preprocessing(engine):
    model, eng = engine
    image = read_image(PHOTO)[60:200, 160:290].copy()  # a tight face crop, not square
    (face,) = Pipeline(eng, WholeImageDetector())([image])[0]
    # The released demo: resize the whole crop to 256x256, RGB, /255, batch of one.
    x = torch.Tensor(cv2.resize(image, (256, 256))).permute(2, 0, 1).unsqueeze(0) / 255.0
    with torch.no_grad():
        ref = model(x)
    assert np.allclose(face.probabilities, torch.softmax(ref["expression"][0], 0).numpy(), atol=1e-6)
    assert face.valence == pytest.approx(float(ref["valence"].clamp(-1, 1)), abs=1e-6)
    assert face.arousal == pytest.approx(float(ref["arousal"].clamp(-1, 1)), abs=1e-6)


def test_refine_recrops_from_the_landmarks(engine):
    _, eng = engine
    image = read_image(PHOTO)
    plain = Pipeline(eng, BlazeFaceDetector("cpu"))([image])[0][0]
    refined = Pipeline(eng, BlazeFaceDetector("cpu"), refine=True)([image])[0][0]
    assert not np.allclose(plain.matrix, refined.matrix)
    assert np.allclose(refined.box, emonet.geometry.landmarks_box(refined.landmarks))


def test_the_bundled_sample_photo_is_reachable_from_any_folder(tmp_path):
    # As after `pip install .`: the README's quick-start line, run outside the checkout.
    code = "import sys; from emonet.apps.photo import main; sys.exit(main(prog='emonet-photo'))"
    run = subprocess.run([sys.executable, "-c", code, "--image", "sample", "--weights", "random", "--device", "cpu",
                          "--json", "faces.json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "faces.json").read_text())
    assert doc["images"][0]["image"] == str(SAMPLE_PHOTO) and len(doc["images"][0]["faces"]) == 1
    assert doc["weights"]["untrained"] is True and doc["precision"] == "fp32" and doc["emonet_version"]
    assert "1 image, 1 face," in run.stderr
