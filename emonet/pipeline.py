"""Frames -> faces -> predictions: detect every face, crop it as EmoNet was trained, run the batch, map back.

The same pipeline serves photos and video frames. All faces of all images in one call go through the
engine as one batch.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import cv2
import numpy as np
import torch

from .detection import FaceDetector, WholeImageDetector
from .engine import Engine
from .geometry import CROP_SIZE, box_to_matrix, crop_faces, crop_to_image, landmarks_box, to_tensor


@dataclass
class Face:
    """One face: where it is, and what EmoNet reads from it."""

    box: np.ndarray                 # x1, y1, x2, y2 in image pixels (the detector's, or the refined one)
    score: float                    # detection score
    expression: int                 # arg-max class index
    probabilities: np.ndarray       # softmax over the classes
    valence: float                  # clamped to [-1, 1]
    arousal: float                  # clamped to [-1, 1]
    landmarks: np.ndarray           # (68, 2) x, y in image pixels
    matrix: np.ndarray = field(repr=False)   # image -> crop affine used for the final prediction
    raw: np.ndarray = field(repr=False, default=None)  # logits, valence, arousal before clamping

    def top(self, class_names: Sequence[str], k: int = 3) -> list[tuple[str, float]]:
        """The k most probable classes with their probabilities."""
        order = np.argsort(-self.probabilities)[:k]
        return [(class_names[i], float(self.probabilities[i])) for i in order]


class Pipeline:
    """``pipeline(images)`` -> per image, a list of :class:`Face` (RGB uint8 images in)."""

    def __init__(self, engine: Engine, detector: FaceDetector, refine: bool = False,
                 max_faces: Optional[int] = None) -> None:
        self.engine = engine
        self.detector = detector
        self.refine = refine and not isinstance(detector, WholeImageDetector)
        self.max_faces = max_faces

    def crops(self, image: np.ndarray, matrices: Sequence[np.ndarray]) -> torch.Tensor:
        """The face crops of one image, ``(k, 3, 256, 256)`` uint8 on the engine's device."""
        if isinstance(self.detector, WholeImageDetector):
            # Exactly the released demo's preprocessing: the whole image resized to 256x256.
            return to_tensor(cv2.resize(image, (CROP_SIZE, CROP_SIZE))[None])
        return crop_faces(image, matrices, self.engine.device)

    def _predict(self, images, matrices_per_image) -> dict[str, torch.Tensor]:
        crops = [self.crops(img, mats) for img, mats in zip(images, matrices_per_image) if len(mats)]
        batch = torch.cat(crops) if crops else torch.zeros(0, 3, CROP_SIZE, CROP_SIZE, dtype=torch.uint8)
        return self.engine(batch)

    def warmup(self, shape: tuple = (720, 1280, 3)) -> float:
        """On a GPU, run detection, cropping, EmoNet and landmark decoding once on a blank ``shape`` image.

        The engine warms itself at load; this pays the rest of the first image's one-off costs (the
        detector's autotuning, lazy loading of the decoding kernels) and reports them on one line.
        The CPU has nothing of the kind to pay ahead. Returns the seconds spent.
        """
        if self.engine.device.type != "cuda":
            return 0.0
        t0 = time.perf_counter()
        self.detector.warmup(shape)
        h, w = shape[:2]
        self([np.zeros(shape, np.uint8)], boxes=[np.array([[w / 4, h / 4, w / 2, h / 2, 1.0]])])
        torch.cuda.synchronize(self.engine.device)
        seconds = time.perf_counter() - t0
        print(f"pipeline warm-up (detector autotuning, first kernels): {seconds:.2f} s", file=sys.stderr)
        return seconds

    def __call__(self, images: Sequence[np.ndarray],
                 boxes: Optional[Sequence[np.ndarray]] = None) -> list[list[Face]]:
        """Faces of each image; ``boxes`` (per image ``(k, 5)``) skips detection when given."""
        detections = list(boxes) if boxes is not None else self.detector.detect(images)
        if self.max_faces:
            detections = [d[: self.max_faces] for d in detections]
        matrices = [[self.detector.crop_matrix(b[:4], img.shape) for b in dets]
                    for img, dets in zip(images, detections)]
        out = self._predict(images, matrices)
        flat = [m for mats in matrices for m in mats]
        landmarks = crop_to_image(flat, out["landmarks"].cpu().numpy())
        if self.refine and flat:
            # Second pass: re-crop from EmoNet's own landmarks with the training convention (spec §5).
            refined = [box_to_matrix(landmarks_box(p)) for p in landmarks]
            it = iter(refined)
            matrices = [[next(it) for _ in mats] for mats in matrices]
            flat = refined
            out = self._predict(images, matrices)
            landmarks = crop_to_image(flat, out["landmarks"].cpu().numpy())
        return self._faces(out, detections, matrices, landmarks)

    def _faces(self, out, detections, matrices, landmarks) -> list[list[Face]]:
        n = self.engine.n_expression
        probs = torch.softmax(out["expression"], dim=1).cpu().numpy()
        logits = out["expression"].cpu().numpy()
        val, aro = out["valence"].cpu().numpy(), out["arousal"].cpu().numpy()
        results, k = [], 0
        for dets, mats in zip(detections, matrices):
            faces = []
            for det, m in zip(dets, mats):
                box = landmarks_box(landmarks[k]) if self.refine else np.asarray(det[:4], dtype=np.float64)
                faces.append(Face(
                    box=box, score=float(det[4]), expression=int(probs[k].argmax()),
                    probabilities=probs[k], valence=float(np.clip(val[k], -1, 1)),
                    arousal=float(np.clip(aro[k], -1, 1)), landmarks=landmarks[k], matrix=m,
                    raw=np.concatenate([logits[k, :n], [val[k], aro[k]]])))
                k += 1
            results.append(faces)
        return results
