"""One path for every face: images -> detect -> crops -> engine -> :class:`~emonet.results.FaceResult`.

Photos, video frames and dataset images all go through :class:`Pipeline`. A face is first *planned*
(:class:`PlannedFace`: which image, which id, the box and score as they are at that moment, and the crop
matrix), then every planned face of a batch of images is cropped and run through the engine in one call
(:meth:`Pipeline.launch`), and :meth:`Pipeline.collect` turns the outputs into results: the one place
where that happens. Video frames and live streams add tracking on top (:mod:`emonet.scheduler`), which
decides which frames are re-detected and where faces are cropped in between, and runs many videos or
streams through one detector call and one engine batch a step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import cv2
import numpy as np
import torch

from .log import say
from .detection import FaceDetector
from .detection.whole import WholeImageDetector
from .engine import Engine
from .engine.graphs import synchronize
from .geometry import CROP_SIZE, box_to_matrix, crop_frames, crop_to_image, landmarks_box, to_tensor
from .results import FaceResult


@dataclass(frozen=True)
class PlannedFace:
    """A face to read: its image (index in the batch), id, box and score as planned, and its crop."""

    image: int                      # index of the image in the batch handed to launch
    frame: int                      # index recorded in the result (photo number, frame number)
    face_id: int
    box: Optional[np.ndarray]       # x1, y1, x2, y2; None: the result's box is its own landmarks' box
    score: float
    detected: bool
    matrix: np.ndarray              # image -> crop affine


@dataclass
class Pending:
    """Planned faces whose engine outputs are on their way back (one copy, waited for in collect)."""

    faces: list[PlannedFace]
    outputs: Optional[torch.Tensor] = None   # per face: logits, valence, arousal, 68 x 2 landmarks (crop px)
    done: Optional["torch.cuda.Event"] = None
    flipped: bool = False                    # two more columns: the mirrored crop's valence and arousal


@dataclass
class Outputs:
    """A launch's outputs on the host (see :meth:`Pipeline.read`)."""

    values: np.ndarray               # (n, classes + 2): per face its raw logits, valence and arousal
    landmarks: np.ndarray            # (n, 68, 2): x, y in image pixels


Smoother = Callable[[np.ndarray], np.ndarray]


class Pipeline:
    """``pipeline(images)`` -> per image, a list of :class:`FaceResult` (RGB uint8 ``(H, W, 3)`` images in)."""

    def __init__(self, engine: Engine, detector: Optional[FaceDetector] = None, refine: bool = False,
                 max_faces: Optional[int] = None) -> None:
        self.engine = engine
        self.detector = detector
        self.whole_image = isinstance(detector, WholeImageDetector)
        self.refine = refine and not self.whole_image
        self.max_faces = max_faces

    # -- the steps ---------------------------------------------------------------------------
    def plan(self, images: Sequence[np.ndarray], detections: Sequence[np.ndarray],
             frames: Optional[Sequence[int]] = None) -> list[PlannedFace]:
        """Every detected face of every image, cropped by the detector's convention; ids are per-image indices."""
        planned = []
        for i, (image, dets) in enumerate(zip(images, detections)):
            for k, det in enumerate(dets[: self.max_faces] if self.max_faces else dets):
                box = np.asarray(det[:4], dtype=np.float64)
                planned.append(PlannedFace(i, frames[i] if frames is not None else i, k, box, float(det[4]), True,
                                           self.detector.crop_matrix(box, image.shape)))
        return planned

    def crops(self, images: Sequence, faces: Sequence[PlannedFace]) -> torch.Tensor:
        """The planned faces' ``(N, 3, 256, 256)`` uint8 crops on the engine's device (images: arrays or
        ``(H, W, 3)`` tensors already there)."""
        if self.whole_image:
            # Exactly the released demo's preprocessing: the whole image resized to 256x256.
            resized = [cv2.resize(np.asarray(images[f.image]), (CROP_SIZE, CROP_SIZE)) for f in faces]
            return to_tensor(np.stack(resized)) if resized else torch.zeros(0, 3, CROP_SIZE, CROP_SIZE,
                                                                             dtype=torch.uint8)
        return crop_frames(images, [(f.image, f.matrix) for f in faces], self.engine.device)

    def launch(self, images: Sequence, faces: list[PlannedFace], crops: Optional[torch.Tensor] = None,
               flip: bool = False) -> Pending:
        """Crop the planned faces (unless ``crops`` are given, one per face) and queue them through the
        engine; the outputs come back without waiting. ``flip`` also reads the mirrored crops (the
        evaluation protocol's test-time flip, spec §7)."""
        pending = Pending(faces, flipped=flip)
        if not faces:
            return pending
        if crops is None:
            crops = self.crops(images, faces)
        out = self.engine(crops)
        # Every output leaves the device in one copy (landmarks decoded there).
        columns = [out["expression"], out["valence"][:, None], out["arousal"][:, None], out["landmarks"].flatten(1)]
        if flip:
            mirrored = self.engine(crops.flip(-1))
            columns += [mirrored["valence"][:, None], mirrored["arousal"][:, None]]
        packed = torch.cat(columns, dim=1)
        if packed.device.type == "cuda":
            pending.outputs = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            pending.outputs.copy_(packed, non_blocking=True)
            pending.done = torch.cuda.Event()
            pending.done.record()
        else:
            pending.outputs = packed
        return pending

    def collect(self, pending: Pending, smoothers: Optional[Sequence[Optional[Smoother]]] = None) -> list[FaceResult]:
        """The planned faces' results, in order (waits for them): :meth:`read`, then :meth:`results`.

        ``smoothers`` (one per face, or None) map a face's raw ``logits, valence, arousal`` to the values
        reported (video smoothing, spec §6); the landmarks are never smoothed.
        """
        return self.results(pending, self.read(pending), smoothers)

    def read(self, pending: Pending) -> Outputs:
        """Wait for a launch's outputs: per face its raw values and its landmarks in image pixels."""
        n = self.engine.n_expression
        if not pending.faces:
            return Outputs(np.zeros((0, n + 2)), np.zeros((0, 68, 2)))
        if pending.done is not None:
            pending.done.synchronize()
        outputs = pending.outputs.numpy().astype(np.float64)
        if pending.flipped:
            # Valence and arousal: the mean of the crop's and the mirrored crop's raw outputs, clamped after;
            # the expression and landmarks are the unflipped crop's (spec §7).
            outputs[:, n:n + 2] = (outputs[:, n:n + 2] + outputs[:, -2:]) / 2
            outputs = outputs[:, :-2]
        landmarks = crop_to_image([f.matrix for f in pending.faces], outputs[:, n + 2:].reshape(len(outputs), -1, 2))
        return Outputs(outputs[:, :n + 2], landmarks)

    def results(self, pending: Pending, outputs: Outputs, smoothers: Optional[Sequence[Optional[Smoother]]] = None,
                boxes: Optional[Sequence[np.ndarray]] = None) -> list[FaceResult]:
        """The planned faces' results from their outputs (see :meth:`collect`): the one place network outputs
        become results. ``boxes``: each face's box as reported (default: its planned box, else its landmarks')."""
        n = self.engine.n_expression
        results = []
        for k, face in enumerate(pending.faces):
            landmarks = outputs.landmarks[k]
            if boxes is not None:
                box = boxes[k]
            else:
                box = face.box if face.box is not None else landmarks_box(landmarks)
            raw = outputs.values[k]
            smooth = smoothers[k] if smoothers is not None else None
            values = smooth(raw) if smooth is not None else raw
            probs = np.exp(values[:n] - values[:n].max())
            probs /= probs.sum()
            results.append(FaceResult(
                frame=face.frame, face_id=face.face_id, box=box,
                score=face.score, detected=face.detected, expression=int(probs.argmax()), probabilities=probs,
                valence=float(np.clip(values[n], -1, 1)), arousal=float(np.clip(values[n + 1], -1, 1)),
                landmarks=landmarks, matrix=face.matrix))
        return results

    # -- photos and dataset images ---------------------------------------------------------------
    def __call__(self, images: Sequence[np.ndarray], boxes: Optional[Sequence[np.ndarray]] = None,
                 frames: Optional[Sequence[int]] = None) -> list[list[FaceResult]]:
        """Faces of each image; ``boxes`` (per image ``(k, 5)``) skips detection when given."""
        if boxes is None and self.detector is None:
            raise ValueError("this pipeline has no detector: pass the faces' boxes")
        detections = list(boxes) if boxes is not None else self.detector.detect(images)
        planned = self.plan(images, detections, frames)
        results = self.collect(self.launch(images, planned))
        if self.refine and results:
            # Second pass: re-crop from EmoNet's own landmarks with the training convention (spec §5); the
            # box reported is then the landmarks' box.
            planned = [PlannedFace(f.image, f.frame, f.face_id, None, f.score, f.detected,
                                   box_to_matrix(landmarks_box(r.landmarks))) for f, r in zip(planned, results)]
            results = self.collect(self.launch(images, planned))
        per_image: list[list[FaceResult]] = [[] for _ in images]
        for face, result in zip(planned, results):
            per_image[face.image].append(result)
        return per_image

    def warmup(self, shape: tuple = (720, 1280, 3), log: Optional[Callable[[str], None]] = None) -> float:
        """On a GPU, run detection (its close look too), cropping, EmoNet and landmark decoding once on a blank
        ``shape`` image.

        The engine warms itself at load; this pays the rest of the first image's one-off costs (the
        detector's autotuning and graphs, lazy loading of kernels) and reports them on one line. Where graphs
        are prepared in the background it is one eager pass that loads the kernels the first images would
        wait for, while the graphs are captured. Nothing on a CPU (nothing to pay ahead), nor for an engine
        built without warm-up. ``log`` takes the report line (default: standard error). Returns the seconds
        spent.
        """
        if self.engine.device.type != "cuda" or not self.engine.config.warmup:
            return 0.0
        t0 = time.perf_counter()
        if self.detector is not None:
            self.detector.warmup(shape)
        h, w = shape[:2]
        self([np.zeros(shape, np.uint8)], boxes=[np.array([[w / 4, h / 4, w / 2, h / 2, 1.0]])])
        synchronize(self.engine.device)
        seconds = time.perf_counter() - t0
        what = "first kernels" if self.engine.config.background else "detector autotuning, first kernels"
        (log or say)(f"pipeline warm-up ({what}): {seconds:.2f} s")
        return seconds
