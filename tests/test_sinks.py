"""Where the video runtime's sinks send their work (emonet.video.sinks)."""
import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from emonet.classes import class_names
from emonet.io.frames import Frame
from emonet.results import FaceResult, face_record
from emonet.video.sinks import RowSink

from emonet.drawing.process import DrawingProcess, LocalDrawing
from emonet.video import Drawers
from emonet.video.config import WAIT_FRAMES


def test_a_short_video_is_drawn_here_and_a_long_or_endless_one_by_a_drawing_process():
    short = Drawers(torch.device("cpu"))
    short.start(300)  # its start would outlast the model's load: none is started
    assert short.process is None and isinstance(short.choose(300), LocalDrawing)
    short.start(WAIT_FRAMES)  # decided with the first video, for all
    assert short.process is None
    short.close()
    for frames in (WAIT_FRAMES, None):  # None: a camera's, of unknown length
        drawers = Drawers(torch.device("cpu"))
        drawers.start(frames)
        try:
            assert isinstance(drawers.choose(frames), DrawingProcess) and drawers.chosen is drawers.process
        finally:
            drawers.close()


def _run(frames: int = 0, untrained: bool = True) -> SimpleNamespace:
    """What a RowSink reads of a run: the engine's classes and weights, and how many frames were read."""
    return SimpleNamespace(engine=SimpleNamespace(class_names=class_names(8), untrained=untrained), frames=frames)


def _face(seed: int) -> FaceResult:
    rng = np.random.default_rng(seed)
    landmarks = rng.uniform(0, 100, (68, 2))  # float64, as crop_to_image gives them
    probabilities = rng.dirichlet(np.ones(8)).astype(np.float32)
    return FaceResult(frame=0, face_id=seed, box=np.array([1.0, 2.0, 30.0, 40.0]), score=0.9, detected=True,
                      expression=int(probabilities.argmax()), probabilities=probabilities, valence=0.1,
                      arousal=-0.2, landmarks=landmarks, matrix=np.eye(2, 3))


def test_json_lines_carry_the_landmarks_as_pairs_and_the_csv_as_columns(tmp_path):
    sink = RowSink(str(tmp_path / "f.csv"), str(tmp_path / "f.jsonl"), landmarks=True)
    sink.open(_run())
    face = _face(3)
    sink.add([Frame(0, 0.0, None), Frame(1, 0.04, None)], [[face], []])
    sink.close(_run(frames=2))
    with (tmp_path / "f.csv").open(newline="") as fh:
        (row, empty) = list(csv.DictReader(fh))
    first, second = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert not any(key.startswith("lm") for key in first) and list(first)[-2:] == ["landmarks", "untrained"]
    assert len(first["landmarks"]) == 68 and all(len(pair) == 2 for pair in first["landmarks"])
    # The very numbers of the CSV's columns, and of the photo tool's JSON for the same face.
    assert [[float(row[f"lm{i}_x"]), float(row[f"lm{i}_y"])] for i in range(68)] == first["landmarks"]
    assert first["landmarks"] == face_record(face, class_names(8))["landmarks"]
    assert second["landmarks"] is None and second["face_id"] is None and empty["lm0_x"] == ""


def test_rows_on_standard_output_begin_with_the_first_frame_not_before(tmp_path, capsys):
    for csv_path, jsonl_path in (("-", None), (None, "-"), ("-", str(tmp_path / "f.jsonl"))):
        sink = RowSink(csv_path, jsonl_path)
        sink.open(_run())  # the model is loaded; the video then gives no frame
        sink.close(_run(frames=0))
        assert capsys.readouterr().out == "" and not list(tmp_path.iterdir())
    sink = RowSink(None, "-")
    sink.open(_run())
    sink.add([Frame(0, 0.0, None)], [[_face(1)]])
    sink.close(_run(frames=1))
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["face_id"] == 1 and not list(tmp_path.iterdir())  # no file named "-"
    with pytest.raises(ValueError, match="both go to standard output"):
        RowSink("-", "-")
