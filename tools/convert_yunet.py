#!/usr/bin/env python
"""Convert libfacedetection.train's YuNet checkpoint (``weights/yunet_n.pth``) to the weights emonet ships.

The source is the checkpoint in ShiqiYu/libfacedetection.train (Apache-2.0; commit below), read with
``weights_only=True``; only the network's tensors are kept (no optimizer, no metadata). The result,
``emonet/detection/yunet.pth``, is committed, with the repository's ONNX export of the same network
(``tests/data/yunet_n_dynamic.onnx``) as the reference the check and the tests compare with.

``--check`` proves the conversion: on real photos, OpenCV's own ``FaceDetectorYN`` running the ONNX file must
find the same faces as emonet's detector with the shipped weights (boxes to 0.01 px, scores to 1e-4).

    python tools/convert_yunet.py --checkpoint yunet_n.pth    # convert, then check
    python tools/convert_yunet.py --check                      # check the committed weights only
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emonet.io.atomic import write_bytes  # noqa: E402 - after the checkout's path

SOURCE = "ShiqiYu/libfacedetection.train@0047ac24a weights/yunet_n.pth"
SOURCE_SHA256 = "9c7c9e14a4d60e57491d77e4d8b0d451bd834f300e05c0dea7fd1f6533817b06"
OUT = ROOT / "emonet" / "detection" / "yunet.pth"
ONNX = ROOT / "tests" / "data" / "yunet_n_dynamic.onnx"
CHECK_IMAGES = [ROOT / "emonet" / "engine" / "astronaut.jpg", *sorted((ROOT / "tests" / "data" / "portraits").glob("*.jpg"))]


def convert(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The network's tensors from the training checkpoint (read without unpickling code)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    return {k: v.clone() for k, v in state.items() if not k.endswith("num_batches_tracked")}


def opencv_faces(image_bgr: np.ndarray, threshold: float) -> np.ndarray:
    """OpenCV's FaceDetectorYN on the ONNX export: ``(k, 5)`` x1, y1, x2, y2, score, best first."""
    import cv2

    h, w = image_bgr.shape[:2]
    detector = cv2.FaceDetectorYN.create(str(ONNX), "", (w, h), threshold, 0.3, 5000)
    _, faces = detector.detect(image_bgr)
    if faces is None:
        return np.zeros((0, 5))
    boxes = np.concatenate([faces[:, :2], faces[:, :2] + faces[:, 2:4], faces[:, 14:15]], axis=1)
    return boxes[np.argsort(-boxes[:, 4], kind="stable")]


def check(weights: Path = OUT) -> float:
    """The largest difference between OpenCV's detections and emonet's on the check images; raises if not equal."""
    import cv2

    from emonet.detection.yunet import YuNetDetector

    # The network alone (no frame mirrored past its sides), as OpenCV runs it.
    detector = YuNetDetector("cpu", weights=weights, max_side=100_000, min_score=0.5, verify=False, mirror=False)
    worst = 0.0
    for path in CHECK_IMAGES:
        bgr = cv2.imread(str(path))
        ours = detector.detect([bgr[..., ::-1].copy()])[0]
        theirs = opencv_faces(bgr, 0.5)
        if ours.shape != theirs.shape:
            raise SystemExit(f"{path.name}: OpenCV finds {len(theirs)} faces, emonet {len(ours)}")
        box, score = np.abs(ours[:, :4] - theirs[:, :4]).max(initial=0), np.abs(ours[:, 4] - theirs[:, 4]).max(initial=0)
        if box > 0.01 or score > 1e-4:
            raise SystemExit(f"{path.name}: boxes differ by {box:.4f} px, scores by {score:.2e}")
        worst = max(worst, box)
        print(f"{path.name}: {len(ours)} faces, boxes within {box:.5f} px, scores within {score:.1e}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, help="libfacedetection.train's weights/yunet_n.pth")
    parser.add_argument("--check", action="store_true", help="only check the committed weights")
    args = parser.parse_args()
    if not args.check:
        if args.checkpoint is None:
            parser.error("--checkpoint is needed to convert (or --check)")
        if not args.checkpoint.is_file():
            raise SystemExit(f"{args.checkpoint}: no such file; it is {SOURCE}")
        digest = hashlib.sha256(args.checkpoint.read_bytes()).hexdigest()
        if digest != SOURCE_SHA256:
            raise SystemExit(f"{args.checkpoint} is not {SOURCE} (sha256 {digest})")
        with tempfile.TemporaryDirectory() as tmp:  # checked before they replace the shipped weights
            new = Path(tmp) / OUT.name
            torch.save(convert(args.checkpoint), new)
            check(new)
            write_bytes(OUT, new.read_bytes())
        print(f"wrote {OUT}")
        return
    check()
    print("YuNet conversion checked against OpenCV's FaceDetectorYN")


if __name__ == "__main__":
    main()
