"""Where a face's marks go (emonet.drawing.opencv): a crowded photo's labels and circumplexes stay apart,
inside the image and below the banner; small faces get a compact label."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from emonet.classes import class_names
from emonet.drawing.opencv import COMPACT_BELOW, annotate, banner_height, place_faces
from emonet.engine.check import SAMPLE_PHOTO
from emonet.models.weights import UNTRAINED_LABEL

NAMES = class_names(8)


def _rect(corner, sprite_or_side) -> tuple:
    x, y = corner
    h, w = (sprite_or_side.shape[:2] if hasattr(sprite_or_side, "shape") else (sprite_or_side, sprite_or_side))
    return (x, y, x + w, y + h)


def _overlap(a, b) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


@pytest.fixture(scope="module")
def group_faces():
    """A 6-face group photo (the sample face, three by two, tightly packed) read by the real pipeline."""
    from emonet.detection import create_detector
    from emonet.engine import Engine
    from emonet.engine.config import CPU_FP32
    from emonet.models.weights import load_model
    from emonet.pipeline import Pipeline

    face = cv2.cvtColor(cv2.imread(str(SAMPLE_PHOTO)), cv2.COLOR_BGR2RGB)[30:250, 130:330]
    face = cv2.resize(face, (150, 165))
    photo = np.full((400, 560, 3), 120, np.uint8)
    for row in range(2):
        for col in range(3):
            photo[40 + row * 180:205 + row * 180, 20 + col * 180:170 + col * 180] = face
    engine = Engine(load_model("random", device="cpu"), "cpu", CPU_FP32)
    pipeline = Pipeline(engine, create_detector("blazeface", torch.device("cpu")))
    faces = pipeline([photo])[0]
    assert len(faces) == 6
    return photo, faces


def test_a_crowded_photos_labels_do_not_overlap_each_other_or_other_faces(group_faces):
    photo, faces = group_faces
    top = banner_height(photo.shape[1])
    placed = place_faces(faces, NAMES, photo.shape, top, [f"#{i}" for i in range(len(faces))])
    labels = [_rect(m.label_at, m.label) for m in placed]
    discs = [_rect((m.disc_center[0] - m.disc_radius - 1, m.disc_center[1] - m.disc_radius - 1), 2 * m.disc_radius + 3)
             for m in placed]
    h, w = photo.shape[:2]
    for i, rect in enumerate(labels):
        assert rect[0] >= 0 and rect[1] >= top and rect[2] <= w and rect[3] <= h, rect  # inside, below the banner
        for j, other in enumerate(labels):
            assert i == j or not _overlap(rect, other), (i, j)
        for j, m in enumerate(placed):
            assert i == j or not _overlap(rect, m.box), ("label", i, "covers face", j)
    for i, rect in enumerate(discs):
        assert rect[1] >= top and rect[3] <= h
        assert not any(_overlap(rect, other) for other in labels), i
    out = annotate(photo, faces, NAMES, banner=UNTRAINED_LABEL)
    assert out.shape == photo.shape and not np.array_equal(out, photo)


def test_small_faces_get_a_compact_one_line_label(group_faces):
    photo, faces = group_faces
    def sized(side: float):
        return type(faces[0])(**{**faces[0].__dict__, "box": np.array([10.0, 10.0, 10.0 + side, 10.0 + side])})
    (big,) = place_faces([sized(2 * COMPACT_BELOW)], NAMES, photo.shape)
    (tiny,) = place_faces([sized(COMPACT_BELOW - 20)], NAMES, photo.shape)
    assert tiny.label.shape[0] < big.label.shape[0] / 1.5  # one short line against two
