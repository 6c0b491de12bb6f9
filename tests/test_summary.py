"""Per-video summaries: the figures per face and the plot."""
from __future__ import annotations

import numpy as np

from emonet.classes import class_names
from emonet.io.images import read_image
from emonet.results import FaceResult
from emonet.summary import PLOT_FACES, VideoSummary


def _face(face_id: int, k: int) -> FaceResult:
    probs = np.full(8, 0.05)
    probs[k % 8] = 0.65
    return FaceResult(frame=k, face_id=face_id, box=np.array([0.0, 0.0, 10.0, 10.0]), score=0.9, detected=True,
                      expression=k % 8, probabilities=probs, valence=np.sin(k / 10), arousal=np.cos(k / 10),
                      landmarks=np.zeros((68, 2)), matrix=np.eye(2, 3))


def test_the_plot_draws_the_faces_seen_longest_and_the_figures_cover_every_face(tmp_path):
    summary = VideoSummary("clip.mp4", class_names(8), fps=25.0)
    for k in range(300):  # face 0 throughout; faces 1..6 for ever shorter spells
        summary.add(k / 25.0, [_face(0, k)] + [_face(i, k) for i in range(1, 7) if k < 300 // (i + 1)])
    faces = summary.faces()
    assert [f["face_id"] for f in faces] == list(range(7)) and faces[0]["frames"] == 300
    assert faces[0]["share_Neutral"] == round(38 / 300, 5)  # frames 0, 8, ..., 296
    summary.plot(tmp_path / "clip.png")
    image = read_image(tmp_path / "clip.png")
    assert image.shape[0] == round(100 * (1.2 + 2.6 * PLOT_FACES))  # PLOT_FACES panels at 100 dpi
    assert (image < 250).mean() > 0.05  # drawn, not blank


def test_a_video_without_faces_still_has_a_plot(tmp_path):
    summary = VideoSummary("empty.mp4", class_names(5), fps=30.0)
    for k in range(10):
        summary.add(k / 30.0, [])
    assert summary.faces() == [] and summary.to_dict()["frames"] == 10
    summary.plot(tmp_path / "empty.png")
    assert read_image(tmp_path / "empty.png").shape[0] == round(100 * (1.2 + 2.6))


def test_plots_drawn_by_a_process_of_their_own_are_the_same_and_failures_are_reported(tmp_path):
    from emonet.summary import PlotProcess

    summary = VideoSummary("clip.mp4", class_names(8), fps=25.0)
    for k in range(50):
        summary.add(k / 25.0, [_face(0, k)])
    summary.plot(tmp_path / "here.png")
    plots = PlotProcess()
    plots.submit(summary, tmp_path / "there.png")
    plots.submit(summary, tmp_path / "missing" / "folder.png")
    failed = plots.wait()
    assert list(failed) == [str(tmp_path / "missing" / "folder.png")]
    assert np.array_equal(read_image(tmp_path / "there.png"), read_image(tmp_path / "here.png"))


def test_summary_rows_say_no_face_with_the_frame_count_and_untrained_weights():
    from emonet.summary import summary_rows

    empty = VideoSummary("quiet.mp4", class_names(8), 25.0, untrained=True)
    for _ in range(10):
        empty.add(0.0, [])
    empty.note = None
    (row,) = summary_rows(empty.to_dict())
    assert row["frames"] == 10 and row["note"] == "no face" and row["untrained"] == 1 and row["error"] == ""
    (failed,) = summary_rows({"video": "bad.mp4", "error": "bad.mp4: not a video"})
    assert failed["frames"] == 0 and failed["error"] and failed["untrained"] == ""


def test_a_run_s_summary_reaches_the_plotting_process_without_making_it_import_torch(tmp_path):
    # The plotting process imports NumPy and matplotlib only: a summary carrying torch's own types (its version
    # string is one) made it import torch for each collection's first plot, seconds after the last frame.
    import pickle
    import subprocess
    import sys

    from emonet.engine import Engine, EngineConfig
    from emonet.models.weights import load_model
    from emonet.provenance import provenance

    summary = VideoSummary("clip.mp4", class_names(8), fps=25.0)
    summary.add(0.0, [_face(0, 0)])
    summary.provenance = provenance(Engine(load_model("random", device="cpu"), "cpu", EngineConfig(warmup=False)))
    (tmp_path / "summary.pkl").write_bytes(pickle.dumps(summary))
    code = ("import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read()); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "summary.pkl")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
