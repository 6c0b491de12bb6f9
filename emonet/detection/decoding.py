"""Decoding BlazeFace's raw outputs on the CPU, in NumPy: MediaPipe's SSD anchors, the boxes and scores over them
(:func:`decode_blazeface`), face-alignment's weighted non-maximum suppression (:func:`weighted_nms`), and one image's
detections from several views merged into one face each (:func:`merge_detections`).
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np

from .views import FINE_SIZES_KEPT


@functools.lru_cache(maxsize=FINE_SIZES_KEPT + 1)  # the square input's and a few fine-view sizes'
def ssd_anchors(height: int = 16, width: int = 16) -> np.ndarray:
    """MediaPipe's SSD anchors (x, y, w, h) in units of the network's input side: for its square input
    (``16x16``) 896 of them, 16x16 cells x 2, then 8x8 cells x 6; for a larger input of ``height`` x ``width``
    cells of the first grid (the network is fully convolutional), the same two grids laid over it."""
    rows = []
    for cells, per_cell in ((1, 2), (2, 6)):  # cells of 1/16 of the input side, then of 1/8
        for y in range(height // cells):
            for x in range(width // cells):
                rows += [[(x + 0.5) * cells / 16, (y + 0.5) * cells / 16, 1.0, 1.0]] * per_cell
    anchors = np.array(rows, dtype=np.float32)
    anchors.setflags(write=False)  # shared by every caller
    return anchors


def decode_blazeface(net, raw_boxes: np.ndarray, raw_scores: np.ndarray, anchors: np.ndarray,
                     min_score: Optional[float] = None) -> list[np.ndarray]:
    """face-alignment's ``BlazeFace._tensors_to_detections`` in NumPy: the same detections, per image an
    ``(k, 17)`` float32 array (ymin, xmin, ymax, xmax, six keypoints, score).

    The library does it with some thirty torch operations on arrays of all the anchors, each paying torch's
    per-operation overhead on the CPU (more than the network costs);
    ``tests/test_detection.py`` checks this against the library's own code.
    """
    floor = net.min_score_thresh if min_score is None else min_score
    # The sigmoid only of the anchors that can pass (a handful of thousands): first a test of the raw score
    # against the floor's logit, a little under it, then the exact test on the few left. All images at once.
    logit = np.log(floor / (1.0 - floor)) - 1e-3 if 0.0 < floor < 1.0 else -np.inf
    if not len(raw_boxes):
        return []
    image, rows = np.nonzero(raw_scores[..., 0] >= logit)  # image by image, anchor by anchor
    clipped = np.clip(raw_scores[image, rows, 0], -net.score_clipping_thresh, net.score_clipping_thresh)
    score = (1.0 / (1.0 + np.exp(-clipped.astype(np.float64)))).astype(np.float32)
    passed = score >= floor
    image, rows, score = image[passed], rows[passed], score[passed]
    raw, a = raw_boxes[image, rows].astype(np.float32), anchors[rows].astype(np.float32)
    ax, ay, aw, ah = a[:, 0:1], a[:, 1:2], a[:, 2:3], a[:, 3:4]
    out = np.empty((len(raw), 17), dtype=np.float32)
    xc = raw[:, 0:1] / net.x_scale * aw + ax
    yc = raw[:, 1:2] / net.y_scale * ah + ay
    w = raw[:, 2:3] / net.w_scale * aw
    h = raw[:, 3:4] / net.h_scale * ah
    out[:, 0:1], out[:, 1:2], out[:, 2:3], out[:, 3:4] = yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    out[:, 4:16:2] = raw[:, 4::2] / net.x_scale * aw + ax
    out[:, 5:16:2] = raw[:, 5::2] / net.y_scale * ah + ay
    out[:, 16] = score
    return np.split(out, np.searchsorted(image, np.arange(1, len(raw_boxes))))


def weighted_nms(detections: np.ndarray, threshold: float) -> np.ndarray:
    """face-alignment's BlazeFace weighted non-maximum suppression in NumPy (see :func:`decode_blazeface`).

    Overlapping detections (IoU above ``threshold``) are blended, weighted by score, into one whose score
    is their mean. Returns ``(faces, 17)``, in the order found (most confident first).
    """
    if not len(detections):
        return np.zeros((0, detections.shape[1] if detections.ndim == 2 else 17), np.float32)
    boxes = detections[:, :4]
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    remaining = np.argsort(-detections[:, 16], kind="stable")
    faces = []
    while len(remaining):
        first = detections[remaining[0]]
        others = boxes[remaining]
        inter = (np.clip(np.minimum(first[2:4], others[:, 2:4]) - np.maximum(first[:2], others[:, :2]), 0, None)
                 .prod(axis=1))
        iou = inter / (areas[remaining[0]] + areas[remaining] - inter)
        mask = iou > threshold
        mask[0] = True  # the first always goes (a degenerate box, IoU 0 or NaN with itself, would loop forever)
        overlapping, remaining = remaining[mask], remaining[~mask]
        face = first.copy()
        if len(overlapping) > 1:
            scores = detections[overlapping, 16:17]
            total = scores.sum()
            face[:16] = (detections[overlapping, :16] * scores).sum(axis=0) / total
            face[16] = total / len(overlapping)
        faces.append(face)
    return np.stack(faces)


def merge_detections(parts: Sequence[np.ndarray], iou: float = 0.3) -> np.ndarray:
    """One image's detections from several views, a face once (the best-scoring box), best first."""
    found = [p for p in parts if len(p)]
    if sum(len(p) for p in found) < 2:  # nothing to merge: at most one face
        return found[0] if found else np.zeros((0, 5))
    faces = np.concatenate(found)
    faces = faces[np.argsort(-faces[:, 4])]
    overlaps = _iou_matrix(faces[:, :4]) > iou
    kept, covered = [], np.zeros(len(faces), bool)
    for i in range(len(faces)):  # greedy: a face is left out only by one kept before it
        if not covered[i]:
            kept.append(i)
            covered |= overlaps[i]
    return faces[kept] if kept else np.zeros((0, 5))


def suppress_sorted(boxes: np.ndarray, counts: np.ndarray, iou: float = 0.3) -> np.ndarray:
    """Greedy non-maximum suppression of many images' boxes at once, each image's best first: ``boxes`` ``(B, M, 4)``
    ``x1, y1, x2, y2``, of which image ``b`` has its first ``counts[b]``. Returns ``(B, M)``: which are kept (a box
    is left out only by one kept before it that overlaps it by more than ``iou``, as :func:`merge_detections`)."""
    b, m = boxes.shape[:2]
    overlaps = _iou_matrix(boxes) > iou
    covered = np.arange(m)[None, :] >= np.asarray(counts)[:, None]  # past an image's boxes: never kept
    kept = np.zeros((b, m), bool)
    for i in range(m):  # the images side by side, box by box
        take = ~covered[:, i]
        kept[:, i] = take
        covered |= take[:, None] & overlaps[:, i, :]
    return kept


def _iou_matrix(boxes: np.ndarray) -> np.ndarray:
    """IoU of every pair of ``x1, y1, x2, y2`` boxes ``(..., M, 4)`` -> ``(..., M, M)`` (0 where the union is empty)."""
    first, second = boxes[..., :, None, :], boxes[..., None, :, :]
    w = np.clip(np.minimum(first[..., 2], second[..., 2]) - np.maximum(first[..., 0], second[..., 0]), 0, None)
    h = np.clip(np.minimum(first[..., 3], second[..., 3]) - np.maximum(first[..., 1], second[..., 1]), 0, None)
    inter = w * h
    areas = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    union = areas[..., :, None] + areas[..., None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
