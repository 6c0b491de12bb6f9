import os
import pickle

import numpy as np
import pytest

from emonet.classes import EXPRESSIONS_8
from emonet.evaluation.datasets import AFFECTNET_5_MAP, DatasetError, affectnet, csv_dataset, keep_affectnet, safe_load_pickle
from tests.affectnet_fixture import make_affectnet


@pytest.mark.parametrize("expr, v, a, kept", [
    (0, 0.1, 0.1, True), (0, 0.2, 0.1, False),             # neutral: I < 0.2
    (1, 0.3, 0.0, True), (1, -0.3, 0.0, False), (1, 0.15, 0.0, False),  # happy: v > 0, I > 0.2
    (2, -0.3, 0.1, True), (2, 0.3, 0.1, False),            # sad: v < 0
    (3, 0.0, 0.3, True), (3, 0.0, -0.3, False),            # surprise: a > 0
    (4, -0.3, 0.0, True), (4, 0.0, 0.3, True), (4, 0.3, 0.3, False), (4, -0.3, -0.1, False),  # fear
    (5, -0.25, 0.0, False), (5, -0.35, 0.0, True),         # disgust: I > 0.3
    (6, 0.0, 0.3, True), (6, 0.3, -0.1, False),            # anger: a > 0
    (7, -0.3, 0.0, True), (7, 0.3, 0.0, False),            # contempt: v < 0
    (8, 0.5, 0.5, False), (10, 0.0, 0.0, False),           # not faces
])
def test_each_cleaning_rule(expr, v, a, kept):
    assert keep_affectnet(expr, v, a, True, 8) is kept


def test_expression_correct_is_required():
    assert not keep_affectnet(1, 0.5, 0.0, False, 8)


def test_five_class_protocol_keeps_0_1_2_3_6_and_maps_anger_to_4():
    assert AFFECTNET_5_MAP == {0: 0, 1: 1, 2: 2, 3: 3, 6: 4}
    assert keep_affectnet(6, 0.0, 0.3, True, 5) and not keep_affectnet(4, -0.3, 0.0, True, 5)
    assert not keep_affectnet(7, -0.3, 0.0, True, 5)


def test_affectnet_index_is_read_and_cleaned(tmp_path):
    make_affectnet(tmp_path)
    ds8, counts8 = affectnet(tmp_path, "test", 8, EXPRESSIONS_8)
    ds5, counts5 = affectnet(tmp_path, "test", 5, EXPRESSIONS_8[:5])
    assert counts8 == {"in_index": 10, "not_in_class_set": 1, "expression_incorrect": 1, "intensity_rule": 1,
                       "kept": 7}
    assert counts5["kept"] == 5 and counts5["not_in_class_set"] == 3
    assert sorted(s.label for s in ds5.samples) == [0, 1, 2, 3, 4]  # anger (6) became 4
    crop, label, v, a, index = ds8[0]
    assert crop.shape == (3, 256, 256) and crop.dtype.is_floating_point is False and index == 0
    # The crop comes from the landmark box: the face fills the middle of it.
    assert crop.float().mean() > 40


def test_a_malicious_index_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "side_effect"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    (tmp_path / "test_fullpath.pkl").write_bytes(pickle.dumps({"a.jpg": {"expression": Evil()}}))
    with pytest.raises(DatasetError, match="refused to load it.*posix.mkdir"):
        affectnet(tmp_path, "test", 8, EXPRESSIONS_8)
    assert not marker.exists()


def test_numpy_arrays_and_plain_containers_load(tmp_path):
    path = tmp_path / "ok.pkl"
    data = {"x": np.arange(6.0).reshape(3, 2), "y": [1, "two", (3.0,)], "z": {1, 2}, "w": np.float32(1.5)}
    path.write_bytes(pickle.dumps(data, protocol=4))
    back = safe_load_pickle(path)
    assert np.array_equal(back["x"], data["x"]) and back["y"] == [1, "two", (3.0,)] and back["w"] == 1.5


def test_csv_dataset_names_indices_boxes_and_landmarks(tmp_path):
    lm = " ".join(f"{100 + i} {120 + i % 20}" for i in range(68))
    (tmp_path / "labels.csv").write_text(
        "image,expression,valence,arousal,x1,y1,x2,y2,landmarks\n"
        "a.jpg,happy,0.5,0.1,10,20,110,140,\n"
        "b.jpg,6,,-0.2,,,," + f",{lm}\n"
        "c.jpg,,0.3,,,,,,\n")
    ds = csv_dataset(tmp_path / "labels.csv", None, EXPRESSIONS_8)
    a, b, c = ds.samples
    assert a.label == 1 and a.matrix is not None and a.box.tolist() == [10, 20, 110, 140]
    assert b.label == 6 and np.isnan(b.valence) and b.arousal == -0.2 and b.matrix is not None
    assert c.label == -1 and c.matrix is None  # left for the detector


@pytest.mark.parametrize("text, message", [
    ("file,expression\na.jpg,Joy\n", "unknown expression 'Joy'"),
    ("image,expression\na.jpg,9\n", "outside 0-7"),
    ("name,expression\na.jpg,1\n", "needs an image path column"),
    ("image,valence\na.jpg,high\n", "'high' is not a number"),
    ("image,landmarks\na.jpg,1 2 x\n", "l.csv:2: 'x' is not a number"),
    ("image,valence\na.jpg,2.5\n", r"l.csv:2: valence 2.5 is outside \[-1, 1\]"),
    ("image,arousal\na.jpg,0.1\nb.jpg,-3\n", r"l.csv:3: arousal -3 is outside \[-1, 1\]"),
    ("image,valence\na.jpg,inf\n", r"l.csv:2: valence inf is outside \[-1, 1\]"),
    # AffectNet's "no label" code is no label in a CSV: an empty cell is.
    ("image,valence,arousal\na.jpg,-2,-2\n", r"valence -2 is outside \[-1, 1\].*leave the cell empty for no label"),
    ("image,expression\na.jpg,-1\n", "l.csv:2: expression index -1 outside 0-7, the model's 8 classes"),
    ("image,expression\na.jpg,1.5\n", "l.csv:2: expression '1.5' is no class index"),
])
def test_csv_errors_name_the_line(tmp_path, text, message):
    (tmp_path / "l.csv").write_text(text)
    with pytest.raises(DatasetError, match=message):
        csv_dataset(tmp_path / "l.csv", None, EXPRESSIONS_8)


def test_labels_at_the_ends_of_their_ranges_and_empty_cells_are_kept(tmp_path):
    (tmp_path / "l.csv").write_text("image,expression,valence,arousal\na.jpg,7,-1,1\nb.jpg,0.0,1.0,-1.0\nc.jpg,,,\n")
    a, b, c = csv_dataset(tmp_path / "l.csv", None, EXPRESSIONS_8).samples
    assert (a.label, a.valence, a.arousal) == (7, -1.0, 1.0) and (b.label, b.valence, b.arousal) == (0, 1.0, -1.0)
    assert c.label == -1 and np.isnan(c.valence) and np.isnan(c.arousal)


def test_an_index_outside_a_five_class_model_names_its_classes(tmp_path):
    (tmp_path / "l.csv").write_text("image,expression\na.jpg,6\n")
    with pytest.raises(DatasetError, match="l.csv:2: expression index 6 outside 0-4, the model's 5 classes"):
        csv_dataset(tmp_path / "l.csv", None, EXPRESSIONS_8[:5])


def test_affectnet_no_label_codes_are_dropped_with_their_class_not_refused(tmp_path):
    # AffectNet gives its None, Uncertain and Non-Face classes (8-10) valence and arousal -2: outside the
    # class set, so dropped as such before any range applies.
    t = np.linspace(0, 2 * np.pi, 68, endpoint=False)
    lm = np.stack([100 + 40 * np.cos(t), 100 + 50 * np.sin(t)], axis=1).astype(np.float32)
    index = {"a.jpg": {"expression": 1, "valence": 0.6, "arousal": 0.2, "landmarks_fan": lm},
             **{f"{c}.jpg": {"expression": c, "valence": -2.0, "arousal": -2.0, "landmarks_fan": lm} for c in (8, 9, 10)}}
    (tmp_path / "test_fullpath.pkl").write_bytes(pickle.dumps(index))
    ds, counts = affectnet(tmp_path, "test", 8, EXPRESSIONS_8)
    assert counts["not_in_class_set"] == 3 and counts["kept"] == 1 and ds.samples[0].valence == 0.6


@pytest.mark.parametrize("data, message", [
    (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "not a text CSV"),   # a JPEG given as the CSV
])
def test_a_file_that_is_no_csv_is_one_error(tmp_path, data, message):
    (tmp_path / "l.csv").write_bytes(data)
    with pytest.raises(DatasetError, match=message):
        csv_dataset(tmp_path / "l.csv", None, EXPRESSIONS_8)
