"""The close look's second opinion (emonet.detection.onet): MTCNN's ONet, weights shipped with the package."""
import numpy as np
import pytest
import torch

from emonet.detection.blazeface import BlazeFaceDetector, zoomed_crops
from emonet.detection.onet import ONET_SIZE, load_onet, onet_input


def test_the_shipped_weights_load_safely_and_tell_a_real_face_from_a_cats():
    data = pytest.importorskip("skimage.data", reason="scikit-image holds the sample photos")
    onet = load_onet("cpu")  # (tensors only: weights_only)
    candidates = BlazeFaceDetector("cpu", verify=False, min_score=0.5)  # the back model's own candidates
    scores = {}
    for name in ("astronaut", "chelsea"):
        image = np.ascontiguousarray(getattr(data, name)()[..., :3])
        boxes = candidates.detect([image])[0][:1, :4]
        assert len(boxes), name
        crops = torch.nn.functional.avg_pool2d(zoomed_crops(image, boxes, (1.0,), 4 * ONET_SIZE, torch.device("cpu")), 4)
        with torch.no_grad():
            scores[name] = float(onet(onet_input(crops))[0])
    assert scores["astronaut"] > 0.9 and scores["chelsea"] < 0.5, scores  # the cat's face fooled the back model
