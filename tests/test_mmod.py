"""dlib's CNN face detector in PyTorch (emonet.detection.mmod): the converted weights, the crop scorer, and the
close look's third check on real photos."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

PORTRAITS = Path(__file__).resolve().parent / "data" / "portraits"
# YuNet's box of the face in obama.jpg (rounded): the crop tools/convert_mmod.py --check scores with dlib.
PORTRAIT, PORTRAIT_BOX = "obama.jpg", (199.0, 46.0, 320.0, 224.0)
CROP_SIZE = 200


def portrait_crop() -> tuple[np.ndarray, Path]:
    """A square crop twice the portrait's face box around its centre, CROP_SIZE pixels, sampled by the close
    look's crops (emonet.detection.crops), rounded to 8-bit RGB (what dlib reads): ``(size, size, 3)`` uint8."""
    from emonet.detection.crops import close_crops

    path = PORTRAITS / PORTRAIT
    image = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
    crop = close_crops([image], [np.array([PORTRAIT_BOX])], [((2.0,), CROP_SIZE)], torch.device("cpu"),
                       scaled=False)[0][0]
    return np.ascontiguousarray(crop.round().clamp(0, 255).byte().permute(1, 2, 0).numpy()), path


# dlib-bin 20.0.1 (cnn_face_detection_model_v1, no upsampling) on the portrait's crop and on the whole portrait,
# as tools/convert_mmod.py --check prints them.
DLIB_CROP_CONFIDENCE = 1.1039487
DLIB_WHOLE_CONFIDENCE, DLIB_WHOLE_BOX = 1.1015457, (187, 76, 323, 213)
DOG = Path(__file__).resolve().parent / "data" / "animals" / "dog.4126.jpg"


def _rgb(path: Path) -> np.ndarray:
    return np.ascontiguousarray(cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB))


@pytest.fixture(scope="module")
def net():
    from emonet.detection.mmod import load_mmod

    return load_mmod("cpu")


def test_the_shipped_weights_load_as_tensors_only():
    from emonet.detection.mmod import MMOD_WEIGHTS, from_dlib

    state = torch.load(MMOD_WEIGHTS, map_location="cpu", weights_only=True)
    assert tuple(state["window"].tolist()) == (80, 80)
    assert state["conv0.weight"].shape == (16, 3, 5, 5) and state["head.weight"].shape == (1, 45, 9, 9)
    from_dlib(state)


def test_a_portraits_crop_scores_what_dlib_reports(net):
    from emonet.detection.mmod import CropScorer

    crop, _ = portrait_crop()
    score = CropScorer(net, CROP_SIZE)(torch.from_numpy(crop).permute(2, 0, 1)[None].float())
    assert score.shape == (1,)
    assert abs(float(score[0]) - DLIB_CROP_CONFIDENCE) < 1e-3


def test_the_whole_portrait_gives_dlibs_detection(net):
    from emonet.detection.mmod import TiledPyramid, detection_map_points

    image = _rgb(PORTRAITS / PORTRAIT)
    pyramid = TiledPyramid(*image.shape[:2])
    with torch.inference_mode():
        out = net(pyramid(net.normalise(torch.from_numpy(image).permute(2, 0, 1)[None].float())))[0, 0]
    _, points = detection_map_points(pyramid.shape)
    best = int(out.reshape(-1).argmax())
    assert abs(float(out.reshape(-1)[best]) - DLIB_WHOLE_CONFIDENCE) < 1e-3
    assert tuple(pyramid.boxes(points[best:best + 1], net.window)[0]) == DLIB_WHOLE_BOX


def test_a_crop_beside_the_face_scores_low(net):
    """The score is the crop's own face: the portrait's face moved out of the crop's middle third is not it."""
    from emonet.detection.mmod import CropScorer

    crop, _ = portrait_crop()
    shifted = np.roll(crop, CROP_SIZE // 2, axis=1)
    score = CropScorer(net, CROP_SIZE)(torch.from_numpy(shifted).permute(2, 0, 1)[None].float())
    assert float(score[0]) < 0.5


def test_the_mapping_puts_the_threshold_at_the_detectors():
    from emonet.detection.close_look import MMOD_AT, MMOD_SLOPE, MMOD_THRESHOLD, mmod_mapped

    c = torch.tensor([MMOD_THRESHOLD, MMOD_THRESHOLD - 0.1 / MMOD_SLOPE, -9.0, 9.0])
    np.testing.assert_allclose(mmod_mapped(c).numpy(), [MMOD_AT, MMOD_AT - 0.1, 0.0, 1.0], atol=1e-6)


def test_a_dog_the_detector_passes_is_turned_down_by_the_mmod_look():
    """A real dog's face (Kaggle's cats and dogs, CC0) that the detector passes: MMOD's look scores it 0. (The
    frame's bottom cuts its box, which scores min(YuNet's, the close look's + END_SLACK): here YuNet's, see
    yunet.edge_rule: a known gap.)"""
    from emonet.detection.yunet import END_CUT, YuNetDetector

    dog = _rgb(DOG)
    assert len(YuNetDetector("cpu", mmod=False).detect([dog])[0]) == 1
    detector = YuNetDetector("cpu")
    verifying = detector.advance(detector.launch([dog]))  # a photo: every candidate looked at, in order
    candidates, mmod = verifying.candidates[0], verifying.looking.mmod_per_image()[0]
    best = int(np.argmax(candidates[:, 4]))
    assert candidates[best, 5] == END_CUT and mmod[best] == 0.0


def test_the_portraits_faces_are_still_found():
    from emonet.detection.yunet import YuNetDetector

    detector = YuNetDetector("cpu")
    for path in sorted(PORTRAITS.glob("*.jpg")):
        found = detector.detect([_rgb(path)])[0]
        assert len(found) == 1 and found[0, 4] >= 0.8, (path.name, found)
