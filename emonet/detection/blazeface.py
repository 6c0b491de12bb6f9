"""MediaPipe BlazeFace (256x256 "back" model) in PyTorch, with face-alignment's network.

The weights ship with this package (``blazeface.pth``, converted once from the MediaPipe TFLite files
by ``tools/convert_blazeface.py``; Apache-2.0, see ``NOTICE.blazeface``). Works offline. The whole image
is letterboxed, never centre-cropped, so faces at the sides of a wide frame are found. On a GPU the
network runs as a CUDA graph and accepts frames already uploaded there.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ..engine.graphs import Graphs, capture_graph
from .onet import ONET_SIZE, load_onet, onet_input
from .base import DetectorError, FaceDetector

WEIGHTS = Path(__file__).resolve().parent / "blazeface.pth"
FINE_SIZES_KEPT = 8  # fine-view input sizes whose CUDA graphs and anchors are kept (a video has one; see FINE_SCALE)
# The close look's networks after its crops (the front model, its decoding, ONet, the scores' mean) run on at most
# this many candidates at once; on a GPU as one CUDA graph per padded count (eagerly they are some sixty small
# launches, each paid on the host).
CLOSE_LOOK_BATCH = 32


@functools.lru_cache(maxsize=FINE_SIZES_KEPT + 1)  # the square input's and a few fine-view sizes'
def _anchors(height: int = 16, width: int = 16) -> np.ndarray:
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


# A face is found in two steps. The 256-px "back" model proposes candidates over the whole image (and its
# fine view and tiles) from CANDIDATE_SCORE; each is then looked at again close up: by the 128-px "front" model,
# in square crops VERIFY_ZOOMS times the candidate's size around it (the mean of those looks, each the best
# detection covering the crop's centre), and by MTCNN's ONet (.onet), trained on other data, at ONET_ZOOMS; the
# score is the mean of the front model's look and ONet's two. Chosen on real photos with and without faces, and
# on mosaics of the latter at many scales (docs/PERFORMANCE.md, *Face detection*): the front model alone left
# the non-faces it was chosen on 0.1 under its threshold but a dog's face, held out, only 0.096 under, and missed
# turned faces at 0.75-0.80; with ONet's looks the non-faces stay 0.15 under DEFAULT_MIN_SCORE, held-out ones
# too, and every annotated face at 40-100 px passes. Candidates from 0.3: from 0.5 the back model never proposed
# one of those faces (about 2.5 times as many candidates a 1080p frame, each looked at close up).
CANDIDATE_SCORE = 0.3
VERIFY_ZOOMS = (1.8, 2.4, 3.0)
ONET_ZOOMS = (1.0, 1.25)
DEFAULT_MIN_SCORE = 0.83
# Without the close look (verify=False), the first model's own score, the mean over the overlapping
# detections that pass: from 0.7 a coffee cup did not pass (0.67), a cat's face (0.77) did.
UNVERIFIED_MIN_SCORE = 0.7
TILE_MARGIN = 0.1  # unverified: the score a face seen only in a tile or the fine view needs above min_score
# The fine view: an image whose long side is over FINE_FROM (three times the network's input) is also seen
# whole at FINE_SCALE, at most FINE_MAX_SIDE long, the network run over all of it at once (it is fully
# convolutional: its anchors are laid over the larger grid). A 40-px face of a 1080p frame is 24 px there.
# Chosen on real photos (docs/PERFORMANCE.md, *Face detection*): 0.5 to 0.75 found the same faces; 0.6 leaves a
# margin to the smallest scale that still did. It replaced 45 tiles of 384 px that showed a 1080p frame at 2/3
# (the same faces, three times the pixels). On smaller images it let a photo of cells reach 0.70.
FINE_FROM = 3
FINE_SCALE = 0.6
FINE_MAX_SIDE = 1536
# On a GPU the fine view runs up to this many images as they are, not padded to a power of two: per image it is
# some four times the whole view's work, and a video's chunk has two or three such frames (three as four would be
# a third more of it); more are padded (a graph per count and size, each keeping its memory).
FINE_UNPADDED = 4
# Over this long side (4K frames, scans, mosaics) the image is also searched in overlapping tiles (see tile_grid).
TILES_FROM = 2560
# A face at least this many pixels of the whole view's input (its box's longer side) is found by the whole view
# alone: on VOC faces pasted into 1080p frames (docs/PERFORMANCE.md, *Face detection*), from 24 px (180 px of a
# 1080p frame) it found every face the fine view and close look found; from 11 px most, not all.
WHOLE_VIEW_LEAST = 24


def tile_grid(height: int, width: int, least: int) -> list[tuple[int, int, int]]:
    """Overlapping square tiles ``(x, y, side)`` of an image whose long side exceeds ``least`` pixels.

    The side is half the long side, between ``least`` and twice that (so a tile is seen at a quarter of
    its size or more), at most the short side; tiles overlap by half, so a face smaller than half a tile
    lies whole inside one. None for an image that is not larger.
    """
    long, short = max(height, width), min(height, width)
    if long <= least:
        return []
    side = min(short, max(least, min(2 * least, long // 2)))

    def starts(length: int) -> list[int]:
        if length <= side:
            return [0]
        n = int(np.ceil((length - side) / (side / 2))) + 1
        return [int(round(v)) for v in np.linspace(0, length - side, n)]
    return [(x, y, side) for y in starts(height) for x in starts(width)]


def _inside_tile(faces: np.ndarray, x: int, y: int, side: int, shape: tuple) -> np.ndarray:
    """A tile's detections, less those cut by one of its edges inside the image (another view sees them whole)."""
    h, w = shape
    margin = 0.02 * side
    keep = np.ones(len(faces), bool)
    keep &= ~((faces[:, 0] < margin) & (x > 0))
    keep &= ~((faces[:, 1] < margin) & (y > 0))
    keep &= ~((faces[:, 2] > side - margin) & (x + side < w))
    keep &= ~((faces[:, 3] > side - margin) & (y + side < h))
    return faces[keep].copy()


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


def _iou_matrix(boxes: np.ndarray) -> np.ndarray:
    """IoU of every pair of ``x1, y1, x2, y2`` boxes (0 where the union is empty)."""
    w = np.clip(np.minimum(boxes[:, None, 2], boxes[None, :, 2]) - np.maximum(boxes[:, None, 0], boxes[None, :, 0]), 0, None)
    h = np.clip(np.minimum(boxes[:, None, 3], boxes[None, :, 3]) - np.maximum(boxes[:, None, 1], boxes[None, :, 1]), 0, None)
    inter = w * h
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = areas[:, None] + areas[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def zoomed_crops(image: Union[np.ndarray, torch.Tensor], boxes: np.ndarray, zooms: Sequence[float], size: int,
                 device: torch.device) -> torch.Tensor:
    """Square crops ``zoom`` times each box's longer side around its centre (black beyond the image), each
    resampled to ``size``: ``(len(boxes) * len(zooms), 3, size, size)`` in [-1, 1] on ``device``, box by box
    (one image's; :func:`close_crops` makes many images' crops at once, the same values)."""
    return close_crops([image], [boxes], [(zooms, size)], device)[0]


# Images of one size sampled together by close_crops, their pyramid held at once: at most this many, and of
# this many pixels together (eight 1080p frames; a single larger image goes alone).
CROP_BATCH = 8
CROP_PIXELS = 1 << 24


def close_crops(images: Sequence[Union[np.ndarray, torch.Tensor]], boxes: Sequence[np.ndarray],
                looks: Sequence[tuple[Sequence[float], int]], device: torch.device,
                scaled: bool = True) -> list[torch.Tensor]:
    """Per look ``(zooms, size)``, the square crops ``zoom`` times each box's longer side around its centre
    (black beyond the image), resampled to ``size``, of every image's boxes: ``(crops, 3, size, size)`` in
    [-1, 1] (``scaled=False``: in [0, 255], for :func:`scale_crops`) on ``device``, image by image, box by box,
    zoom by zoom.

    Each crop is sampled bilinearly from the level of a pyramid of 2x2 means (the image, halved again and
    again) where its step is 1 to 2 pixels, so a crop much larger than ``size`` is not aliased. Images of one
    size are sampled together (one pyramid for a batch of them; per look and level one sampling call, their
    crops side by side): a crop's values do not depend on what else is sampled with it. Everything the device
    needs to know (each sampling call's coordinates, each crop's place) is worked out first and sent in one copy.
    """
    boxes = [np.asarray(b, np.float64).reshape(-1, 4) for b in boxes]
    counts = [sum(len(b) for b in boxes) * len(zooms) for zooms, _ in looks]
    first = np.cumsum([0] + [len(b) for b in boxes])  # each image's first box, counted over all images
    groups: dict = {}
    for i, image in enumerate(images):
        if len(boxes[i]):
            groups.setdefault(tuple(image.shape[:2]), []).append(i)
    # The plan: per batch of images, per pyramid level, per look, one sampling call (a _Sampling).
    batches: list[tuple[list[int], list[list[_Sampling]]]] = []
    coordinates: list[np.ndarray] = []
    taken = [0] * len(looks)  # per look, the crops sampled so far (empty slots included)
    places = [np.zeros(count, np.int64) for count in counts]  # per look, each crop's row among them
    used = 0
    for (height, width), members in groups.items():
        step = max(1, min(CROP_BATCH, CROP_PIXELS // max(height * width, 1)))
        top = max(int(np.floor(np.log2(max(min(height, width), 1)))), 0)  # the images' last halving
        for start in range(0, len(members), step):
            batch = members[start:start + step]
            plans = [_crop_plan([boxes[i] for i in batch], [first[i] for i in batch], zooms, size, top)
                     for zooms, size in looks]
            calls: list[list[_Sampling]] = [[] for _ in range(max(int(p[3].max()) for p in plans) + 1)]
            for n, ((zooms, size), (image, rows, geometry, levels)) in enumerate(zip(looks, plans)):
                for k in np.unique(levels):
                    chosen = np.flatnonzero(levels == k)
                    xy, slot, slots = _sample_coordinates(len(batch), height >> k, width >> k, image[chosen],
                                                          geometry[chosen], 2.0 ** k, size)
                    places[n][rows[chosen]] = taken[n] + image[chosen] * slots + slot
                    taken[n] += len(batch) * slots
                    calls[k].append(_Sampling(n, size, slots, used, xy.size))
                    coordinates.append(xy.reshape(-1))
                    used += xy.size
            batches.append((batch, calls))
    order = [places[n] if not np.array_equal(places[n], np.arange(taken[n])) else None for n in range(len(looks))]
    sent = np.concatenate(coordinates + [o.astype(np.float32) for o in order if o is not None]) if coordinates else None
    sent = _to_device(torch.from_numpy(sent), device) if sent is not None else None
    parts: list[list[torch.Tensor]] = [[] for _ in looks]
    for batch, calls in batches:
        level = _frames_on(device, [images[i] for i in batch])
        for k, at_level in enumerate(calls):
            if k:
                level = torch.nn.functional.avg_pool2d(level, 2)  # halves (an odd last row or column is left out)
            for call in at_level:
                parts[call.look].append(_sample(level, sent, call.start, call.slots, call.size))
    out = []
    for n, ((zooms, size), found) in enumerate(zip(looks, parts)):
        if not found:
            out.append(torch.zeros((0, 3, size, size), device=device))
            continue
        crops = torch.cat(found) if len(found) > 1 else found[0]
        if order[n] is not None:  # back into image, box and zoom order, without the empty slots
            at = used + sum(len(o) for o in order[:n] if o is not None)
            crops = crops[sent[at:at + len(order[n])].long()]
        out.append(scale_crops(crops) if scaled else crops)
    return out


def scale_crops(crops: torch.Tensor) -> torch.Tensor:
    """Crops' pixels in [0, 255] -> [-1, 1], in place, as the letterbox scales a whole image."""
    return crops.div_(127.5).sub_(1.0)


@dataclass(frozen=True)
class _Sampling:
    """One sampling call of :func:`close_crops`: its look, crop size, slots per image, and where its coordinates
    lie in what was sent to the device."""

    look: int
    size: int
    slots: int
    start: int
    length: int


def _frames_on(device: torch.device, images: Sequence[Union[np.ndarray, torch.Tensor]]) -> torch.Tensor:
    """Images of one size as one ``(B, 3, H, W)`` float batch on ``device`` (host images uploaded as they are,
    without a copy on the host first)."""
    frames = [(image if image.device == device else image.to(device, non_blocking=True)) if torch.is_tensor(image)
              else torch.from_numpy(np.ascontiguousarray(image)).to(device, non_blocking=True) for image in images]
    frames = torch.stack(frames) if len(frames) > 1 else frames[0][None]
    return frames.permute(0, 3, 1, 2).float()


def _to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device``, without waiting for the queue ahead of it."""
    return values.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else values


def _to_host(values: torch.Tensor) -> tuple[torch.Tensor, Optional["torch.cuda.Event"]]:
    """A device tensor on its way to pinned host memory, and the event recorded after its copy (on the CPU: the
    tensor itself, and None)."""
    if values.device.type != "cuda":
        return values, None
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


def _crop_plan(boxes: Sequence[np.ndarray], firsts: Sequence[int], zooms: Sequence[float], size: int,
               top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For images' boxes at ``zooms``: per crop its image (in the batch), its output row, ``(cx, cy, side)``
    and its pyramid level (where its step is 1 to 2 pixels, at most ``top``)."""
    zooms = np.asarray(zooms, np.float64)
    counts = np.array([len(b) for b in boxes])
    these = np.concatenate(boxes)
    sides = np.maximum(zooms[None, :] * np.maximum(these[:, 2] - these[:, 0], these[:, 3] - these[:, 1])[:, None], 2.0)
    image = np.repeat(np.arange(len(boxes)), counts * len(zooms))
    # Each box's crops go to rows from its image's first row on, zoom by zoom.
    box_rows = np.repeat(np.asarray(firsts) - np.cumsum(np.r_[0, counts[:-1]]), counts) + np.arange(len(these))
    rows = (box_rows[:, None] * len(zooms) + np.arange(len(zooms))).reshape(-1)
    geometry = np.stack([np.repeat((these[:, 0] + these[:, 2]) / 2, len(zooms)),
                         np.repeat((these[:, 1] + these[:, 3]) / 2, len(zooms)), sides.reshape(-1)], axis=1)
    levels = np.clip(np.floor(np.log2(np.maximum(geometry[:, 2] / size, 1.0))), 0, top).astype(int)
    return image, rows, geometry, levels


def _sample_coordinates(n_images: int, height: int, width: int, image: np.ndarray, geometry: np.ndarray,
                        scale: float, size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Where crops ``(cx, cy, side)`` (image pixels; ``scale`` of them a pixel of a pyramid level of ``height`` x
    ``width``) of the batch's images ``image`` sample it, in grid_sample's terms (-1 and 1 are the outer edges of
    the first and last pixels), each image's crops side by side in ``slots`` slots: ``(2, n_images, slots,
    size)`` float32 (each output column's x, each output row's y), each crop's slot, and ``slots``. An empty slot
    samples far outside (black, then dropped)."""
    # Each crop's place among its image's (the crops come image by image).
    starts = np.flatnonzero(np.r_[True, image[1:] != image[:-1]])
    slot = np.arange(len(image)) - np.repeat(starts, np.diff(np.r_[starts, len(image)]))
    slots = int(slot.max()) + 1
    # Per slot the affine map from the crop's own coordinates to the level's.
    maps = np.zeros((n_images, slots, 4), np.float32)
    maps[:, :, 1] = maps[:, :, 3] = -4.0
    maps[image, slot, 0] = geometry[:, 2] / (scale * width)
    maps[image, slot, 1] = 2 * geometry[:, 0] / (scale * width) - 1
    maps[image, slot, 2] = geometry[:, 2] / (scale * height)
    maps[image, slot, 3] = 2 * geometry[:, 1] / (scale * height) - 1
    steps = np.arange(size, dtype=np.float32) * np.float32(2.0 / size) + np.float32(1.0 / size - 1.0)
    xy = np.empty((2, n_images, slots, size), np.float32)
    xy[0] = maps[:, :, 0:1] * steps + maps[:, :, 1:2]
    xy[1] = maps[:, :, 2:3] * steps + maps[:, :, 3:4]
    return xy, slot, slots


def _sample(level: torch.Tensor, sent: torch.Tensor, start: int, slots: int, size: int) -> torch.Tensor:
    """One sampling call: ``(images * slots, 3, size, size)`` crops of the level's ``images`` images at the
    coordinates of :func:`_sample_coordinates`, sent to the device from ``start`` on (the x of each output column,
    then the y of each output row), image by image, slot by slot."""
    n_images = level.shape[0]
    # Both as (B, size rows, slots, size columns), read in place: x the same down a column, y along a row.
    x = sent.as_strided((n_images, size, slots, size), (slots * size, 0, size, 1), start)
    y = sent.as_strided((n_images, size, slots, size), (slots * size, 1, size, 0), start + n_images * slots * size)
    grid = torch.stack((x, y), dim=-1).reshape(n_images, size, slots * size, 2)
    crops = torch.nn.functional.grid_sample(level, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return crops.reshape(n_images, 3, size, slots, size).permute(0, 3, 1, 2, 4).reshape(n_images * slots, 3, size, size)


def _powers_of_two(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most``."""
    return [1 << k for k in range(most.bit_length())]


def _padded_count(n: int) -> int:
    """The power of two a batch of ``n`` runs as (few distinct shapes: few autotuning runs, few graphs)."""
    return 1 << (n - 1).bit_length()


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with its last row repeated up to ``rows`` rows."""
    return torch.cat([x, x[-1:].expand(rows - len(x), *x.shape[1:])]) if rows > len(x) else x


@dataclass
class _Looking:
    """A verified detection advanced (see :meth:`BlazeFaceDetector.advance`): each image's candidates, and their
    close-look scores on their way back."""

    candidates: list[np.ndarray]
    host: Optional[torch.Tensor]              # the scores, all candidates' in order (None: no candidate)
    done: Optional["torch.cuda.Event"] = None  # on a GPU, recorded after their copy

    def scores(self) -> np.ndarray:
        """The scores, waiting for them if need be."""
        if self.host is None:
            return np.zeros(0)
        if self.done is not None:
            self.done.synchronize()
        return self.host.numpy()


def _blazeface_class() -> type:
    """face-alignment's BlazeFace network class, loaded from its own module file.

    Importing it the usual way runs ``face_alignment/__init__``, which imports scikit-image, SciPy and
    Numba (about 0.4 s) for things this detector never uses; the module itself needs only torch.
    """
    name = "face_alignment.detection.blazeface.net_blazeface"
    if name in sys.modules:
        return sys.modules[name].BlazeFace
    package = importlib.util.find_spec("face_alignment")  # finds the package without running it
    if package is None or package.origin is None:
        raise DetectorError("the blazeface detector needs face-alignment: pip install face-alignment")
    path = Path(package.origin).parent / "detection" / "blazeface" / "net_blazeface.py"
    spec = importlib.util.spec_from_file_location("emonet.detection._net_blazeface", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BlazeFace


class BlazeFaceDetector(FaceDetector):
    """MediaPipe BlazeFace on any device; ``model='back'`` (256 input, faces at any distance) or ``'front'`` (128, selfies)."""

    name = "blazeface"

    def __init__(self, device: Union[str, torch.device] = "cpu", model: str = "back",
                 weights: Union[str, Path, None] = None, min_score: Optional[float] = None,
                 cuda_graphs: bool = True, tiles: bool = True, verify: Optional[bool] = None,
                 background: bool = False) -> None:
        """``tiles``: a large image is also seen in the fine view and, over TILES_FROM, in tiles (small faces);
        ``verify``: each candidate is looked at close up (default: with the back model); ``background``: on a
        GPU, its CUDA graphs are captured in a thread of their own while the first images run the network
        eagerly (the same kernels: the same detections), not on first use."""
        BlazeFace = _blazeface_class()
        if model not in ("back", "front"):
            raise DetectorError(f"BlazeFace model must be 'back' or 'front', not {model!r}")
        path = Path(weights) if weights else WEIGHTS
        if not path.is_file():
            raise DetectorError(f"BlazeFace weights not found at {path}; reinstall emonet (the file "
                                f"ships with the package) or run tools/convert_blazeface.py")
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.device = torch.device(device)
        self.queues = self.device.type == "cuda"
        self._fine_unpadded = FINE_UNPADDED if self.queues else 0  # (on the CPU: padded, as ever)
        self.net = BlazeFace(back_model=(model == "back"))
        self.net.load_state_dict(state[model])
        self.net.to(self.device).eval()
        self.anchors = _anchors()  # decoding runs on the CPU (see _collect)
        self._fine_seen: dict[tuple[int, int], int] = {}  # fine-view input sizes -> times seen
        self.background = background
        # The close look (see VERIFY_ZOOMS): the back model's candidates, re-scored by the front model.
        self.verify = model == "back" if verify is None else verify
        self.min_score = float(min_score) if min_score is not None else (
            DEFAULT_MIN_SCORE if self.verify else UNVERIFIED_MIN_SCORE)
        self.size = 256 if model == "back" else 128
        self.max_batch = 16
        # A large image is also seen in the fine view and, very large, in tiles (see FINE_SCALE, TILES_FROM),
        # where a small face is seen at a usable scale.
        self.tiles = tiles
        # (its network runs inside the close look's own graphs: see _look_net)
        self.verifier = (BlazeFaceDetector(self.device, model="front", weights=path, cuda_graphs=False,
                                           tiles=False, verify=False) if self.verify else None)
        self.second_opinion = load_onet(self.device) if self.verify else None
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        # (padded batch, input dtype, height, width) -> (CUDA graph, static input, static outputs)
        self._graphs = Graphs(self.device, self._capture) if self.cuda_graphs else None
        # padded candidate count -> (CUDA graph, static inputs (front, ONet crops), static scores)
        self._look_graphs = Graphs(self.device, self._capture_look) if self.cuda_graphs and self.verify else None
        if background and self._graphs is not None:
            self.prepare()

    def letterbox(self, images: Sequence[Union[np.ndarray, torch.Tensor]]) -> tuple[torch.Tensor, list[tuple[float, float, float]]]:
        """Each whole image scaled to fit the network's square input and padded with zeros (centred).

        Runs on the detector's device (antialiased bilinear), so a large frame costs one upload instead
        of a CPU resize. Returns the ``(B, 3, S, S)`` input in [-1, 1] and, per image, ``(scale, pad_x, pad_y)``.
        """
        s = self.size
        batch = torch.full((len(images), 3, s, s), -1.0, device=self.device)  # -1 is black after scaling
        # Images of one size (a video's frames) are resized together: a few launches per call, not per image.
        groups: dict = {}
        for i, image in enumerate(images):
            groups.setdefault(tuple(image.shape[:2]), []).append(i)
        params = [None] * len(images)
        for (h, w), members in groups.items():
            scale = s / max(h, w)
            nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
            px, py = (s - nw) // 2, (s - nh) // 2
            x = self._resized([images[i] for i in members], nh, nw)
            if members == list(range(members[0], members[-1] + 1)):
                batch[members[0]:members[-1] + 1, :, py:py + nh, px:px + nw] = x
            else:  # interleaved sizes (rare): row by row, no index upload that would stall the host
                for k, i in enumerate(members):
                    batch[i, :, py:py + nh, px:px + nw] = x[k]
            for i in members:
                params[i] = (scale, px, py)
        return batch, params

    def detect(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.collect(self.launch(images))

    def small_face_limit(self, shape: tuple) -> float:
        """Faces under this size (longer side, px) in an image of ``shape`` are found only by the fine view and
        tiles (see WHOLE_VIEW_LEAST); 0 for an image those do not search."""
        long = max(shape[:2])
        return WHOLE_VIEW_LEAST * long / self.size if self.tiles and long > FINE_FROM * self.size else 0.0

    def launch(self, images: Sequence[np.ndarray], small: Optional[Sequence[bool]] = None) -> tuple:
        """Queue every view of the images (``small``: per image, whether the fine view and tiles too; default
        all); :meth:`collect` decodes them."""
        views, owners = [], []  # every image whole, then its tiles: (image index, x, y, tile side or 0)
        fine: dict[tuple, list[int]] = {}  # the images seen in the fine view, by size
        for i, image in enumerate(images):
            views.append(image)
            owners.append((i, 0, 0, 0))
            if not self.tiles or (small is not None and not small[i]):
                continue
            long = max(image.shape[:2])
            if long > FINE_FROM * self.size:
                fine.setdefault(tuple(image.shape[:2]), []).append(i)
            if long > TILES_FROM:
                for x, y, side in tile_grid(image.shape[0], image.shape[1], 2 * self.size):
                    views.append(image[y:y + side, x:x + side])
                    owners.append((i, x, y, side))
        parts = [self._launch(views[start:start + self.max_batch]) for start in range(0, len(views), self.max_batch)]
        for members in fine.values():  # one input size per group: one network call per max_batch images
            for start in range(0, len(members), self.max_batch):
                group = members[start:start + self.max_batch]
                parts.append(self._launch_fine([images[i] for i in group]))
                owners += [(i, 0, 0, -1) for i in group]  # side -1: the fine view, in the image's own pixels
        return parts, owners, [image.shape[:2] for image in images], (images if self.verify else None)

    def advance(self, handle):
        """Verified: the candidates decoded (waiting for the views' networks) and their close look queued; the
        handle :meth:`collect` finishes without waiting for more than the close look's networks."""
        if not self.verify or isinstance(handle, _Looking):
            return handle
        candidates = self._candidates(handle, CANDIDATE_SCORE)
        return _Looking(candidates, *self._launch_close_look(handle[3], candidates))

    def collect(self, handle, min_score: Optional[float] = None) -> list[np.ndarray]:
        least = self.min_score if min_score is None else min_score
        if not self.verify:
            return self._candidates(handle, least)
        looking = self.advance(handle)
        scores = looking.scores()
        out, start = [], 0
        for faces in looking.candidates:
            faces = faces.copy()
            faces[:, 4] = scores[start:start + len(faces)]
            start += len(faces)
            faces = faces[faces[:, 4] >= least]
            out.append(faces[np.argsort(-faces[:, 4], kind="stable")])
        return out

    def _candidates(self, handle: tuple, least: float) -> list[np.ndarray]:
        """Each image's detections over its views (whole, fine view, tiles), a face once: from CANDIDATE_SCORE
        when verified, else from ``least``."""
        parts, owners, shapes, images = handle
        per_view = [faces for part in parts for faces in self._collect(*part, floor=least)]
        found: list[list[np.ndarray]] = [[] for _ in shapes]
        for faces, (i, x, y, side) in zip(per_view, owners):
            if side and len(faces):
                if not self.verify:
                    # Every tile is another chance for a face-like thing to pass (a clock's face scored 0.75
                    # in a tile of scikit-image's sample photos; the faces seen only in tiles, 0.88 and
                    # more): unverified, a face that only a tile sees needs TILE_MARGIN more.
                    faces = faces[faces[:, 4] >= min(least + TILE_MARGIN, 0.95)]
                if side > 0:
                    faces = _inside_tile(faces, x, y, side, shapes[i])
                    faces[:, :4] += [x, y, x, y]
            found[i].append(faces)
        return [merge_detections(parts_) for parts_ in found]

    def _launch_close_look(self, images: Sequence[Union[np.ndarray, torch.Tensor]],
                           candidates: list[np.ndarray]) -> tuple[Optional[torch.Tensor], Optional["torch.cuda.Event"]]:
        """Queue the candidates' scores by the close look (VERIFY_ZOOMS with the front model, ONET_ZOOMS with
        ONet), image by image: all images' crops at once, up to CLOSE_LOOK_BATCH candidates a network call, on
        their way back in one copy (the host tensor and, on a GPU, the event that says it has come)."""
        if not any(len(faces) for faces in candidates):
            return None, None
        # ONet's crops as MTCNN makes them, by area: sampled at four times its size, then 4x4 means.
        front, second = close_crops(images, [faces[:, :4] for faces in candidates],  # scaled by _look_net
                                    [(VERIFY_ZOOMS, self.verifier.size), (ONET_ZOOMS, 4 * ONET_SIZE)], self.device,
                                    scaled=False)
        n, a, b = sum(len(faces) for faces in candidates), len(VERIFY_ZOOMS), len(ONET_ZOOMS)
        scores = []
        for start in range(0, n, CLOSE_LOOK_BATCH):
            k = min(CLOSE_LOOK_BATCH, n - start)
            scores.append(self._look_scores(front[start * a:(start + k) * a], second[start * b:(start + k) * b], k))
        return _to_host(torch.cat(scores) if len(scores) > 1 else scores[0])

    def _look_scores(self, front: torch.Tensor, second: torch.Tensor, n: int) -> torch.Tensor:
        """The close look's scores of ``n`` candidates' crops: on a GPU padded to a power of two, as a CUDA graph
        when there is one for that count (else the same networks eagerly: the same kernels, the same numbers)."""
        if self.device.type != "cuda":
            return self._look_net(front, second)
        padded = _padded_count(n)
        entry = self._look_graphs.get(padded, later=self.background) if self._look_graphs is not None else None
        if entry is None:
            front, second = _pad(front, len(VERIFY_ZOOMS) * padded), _pad(second, len(ONET_ZOOMS) * padded)
            return self._look_net(front, second)[:n]
        graph, (static_front, static_second), scores = entry
        static_front[:len(front)].copy_(front)  # rows past them keep earlier (scaled) crops: their scores are not read
        static_second[:len(second)].copy_(second)
        graph.replay()
        return scores[:n].clone()  # the next replay overwrites the static scores

    def _look_net(self, front: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """Candidates' scores ``(n,)`` (float64) from their close look's crops (pixels in [0, 255]; scaled here, in
        place): the mean of the front model's looks (:meth:`_centre`, VERIFY_ZOOMS) and ONet's (ONET_ZOOMS),
        weighed as one and two."""
        with torch.inference_mode():
            front, second = scale_crops(front), scale_crops(second)
            raw_boxes, raw_scores = self.verifier.net(front)
            front = self.verifier._centre(raw_boxes, raw_scores).double().reshape(-1, len(VERIFY_ZOOMS)).mean(dim=1)
            second = self.second_opinion(onet_input(torch.nn.functional.avg_pool2d(second, 4)))
            return (front + second.double().reshape(-1, len(ONET_ZOOMS)).sum(dim=1)) / (1 + len(ONET_ZOOMS))

    def _capture_look(self, padded: int, stream: "torch.cuda.Stream", error_mode: str) -> tuple:
        front = torch.zeros(padded * len(VERIFY_ZOOMS), 3, self.verifier.size, self.verifier.size, device=self.device)
        second = torch.zeros(padded * len(ONET_ZOOMS), 3, 4 * ONET_SIZE, 4 * ONET_SIZE, device=self.device)
        graph, scores = capture_graph(lambda: self._look_net(front, second), stream, error_mode)
        return graph, (front, second), scores

    def _close_look(self, images: Sequence[Union[np.ndarray, torch.Tensor]], candidates: list[np.ndarray]) -> np.ndarray:
        """The candidates' scores by the close look (see :meth:`_launch_close_look`), waited for."""
        return _Looking(candidates, *self._launch_close_look(images, candidates)).scores()

    def _centre(self, raw_boxes: torch.Tensor, raw_scores: torch.Tensor) -> torch.Tensor:
        """The network's raw outputs for crops -> per crop the best score of a detection whose box covers the
        crop's centre: how surely a face fills it, ``(B,)`` on the device (decoded there, nothing copied back)."""
        net = self.net
        if not hasattr(self, "_anchors_dev"):
            self._anchors_dev = torch.tensor(self.anchors, device=self.device)
        raw_boxes, raw_scores = raw_boxes.float(), raw_scores.float()
        a = self._anchors_dev
        xc = raw_boxes[..., 0] / net.x_scale * a[:, 2] + a[:, 0]
        yc = raw_boxes[..., 1] / net.y_scale * a[:, 3] + a[:, 1]
        half_w = raw_boxes[..., 2] / net.w_scale * a[:, 2] / 2
        half_h = raw_boxes[..., 3] / net.h_scale * a[:, 3] / 2
        covers = ((xc - half_w) < 0.5) & ((xc + half_w) > 0.5) & ((yc - half_h) < 0.5) & ((yc + half_h) > 0.5)
        p = torch.sigmoid(raw_scores[..., 0].clamp(-net.score_clipping_thresh, net.score_clipping_thresh))
        return torch.where(covers, p, torch.zeros_like(p)).amax(dim=1)

    def warmup(self, shape: tuple = (720, 1280, 3)) -> None:
        """Pay at load what the first images would: every padded batch size once (and the fine view's unpadded
        counts), the close look's too, so kernel selection and graph capture are done before real images. In the
        background mode (its graphs captured in a thread of their own) one eager pass instead, the close look
        included: the kernels the first frames would wait for are loaded."""
        blank = np.zeros(shape, np.uint8)
        sizes = [1] if self.background else sorted({*_powers_of_two(self.max_batch),
                                                    *range(1, self._fine_unpadded + 1)})
        for b in sizes:
            self.detect([blank] * b)
        if self.verifier is None:
            return
        # A blank image has no candidate: the close look (its crops, both networks) on a made-up one.
        h, w = shape[:2]
        self._close_look([blank], [np.array([[w / 4, h / 4, w / 2, h / 2, 1.0]])])
        if self._look_graphs is not None and not self.background:
            for padded in _powers_of_two(CLOSE_LOOK_BATCH):
                self._look_graphs.get(padded)

    def fine_view(self, images: Sequence[Union[np.ndarray, torch.Tensor]]) -> tuple[torch.Tensor, list[tuple[float, float, float]]]:
        """Images of one size, each scaled by FINE_SCALE (at most FINE_MAX_SIDE long) and padded with black on
        the right and below to whole cells of the network's coarser grid: ``(B, 3, H, W)`` in [-1, 1] on the
        device and, per image, ``(scale, 0, 0)`` (see :meth:`letterbox`)."""
        h, w = images[0].shape[:2]
        scale = min(FINE_SCALE, FINE_MAX_SIDE / max(h, w))
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        cell = self.size // 8
        batch = torch.full((len(images), 3, -(-nh // cell) * cell, -(-nw // cell) * cell), -1.0, device=self.device)
        batch[:, :, :nh, :nw] = self._resized(images, nh, nw)
        return batch, [(scale, 0, 0)] * len(images)

    def _resized(self, images: Sequence[Union[np.ndarray, torch.Tensor]], height: int, width: int) -> torch.Tensor:
        """Images of one size, uploaded and resized on the device (antialiased bilinear):
        ``(B, 3, height, width)`` in [-1, 1]."""
        x = torch.nn.functional.interpolate(_frames_on(self.device, images), size=(height, width), mode="bilinear",
                                            antialias=True, align_corners=False)
        return x / 127.5 - 1.0

    def _launch_fine(self, images: Sequence[np.ndarray]) -> tuple:
        x, params = self.fine_view(images)
        return self._launch_input(x, len(images), params)

    def _launch(self, images: Sequence[np.ndarray]) -> tuple:
        x, params = self.letterbox(images)
        return self._launch_input(x, len(images), params)

    def _launch_input(self, x: torch.Tensor, n: int, params: list) -> tuple:
        cells = (x.shape[2] * 16 // self.size, x.shape[3] * 16 // self.size)
        # A padded batch size (few distinct shapes: few autotuning runs, few graphs), except for a few images in the
        # fine view on a GPU (see FINE_UNPADDED).
        fine = tuple(x.shape[2:]) != (self.size, self.size)
        padded = n if fine and n <= self._fine_unpadded else _padded_count(n)
        with torch.inference_mode():
            raw_boxes, raw_scores = self._forward(x, padded=padded, fresh=False)  # the outputs are read at once
            # Decoded on the CPU after one copy (57 KB an image, 0.7 MB in the fine view of a 1080p frame): as
            # GPU launches, its dozens of tiny operations and a sync per image cost more than the network itself.
            return (*_to_host(torch.cat([raw_boxes[:n], raw_scores[:n]], dim=2).float()), params, cells)

    def _collect(self, raw: torch.Tensor, done: Optional["torch.cuda.Event"], params: list,
                 cells: tuple[int, int] = (16, 16), floor: Optional[float] = None) -> list[np.ndarray]:
        if done is not None:
            done.synchronize()
        raw = raw.numpy()
        # Verified: candidates from CANDIDATE_SCORE, looked at again; else the detections themselves.
        floor = CANDIDATE_SCORE if self.verify else (self.min_score if floor is None else floor)
        per_image = decode_blazeface(self.net, raw[..., :-1], raw[..., -1:], _anchors(*cells), floor)
        faces = [weighted_nms(dets, self.net.min_suppression_threshold) for dets in per_image]
        counts = [len(f) for f in faces]
        if not sum(counts):
            return [np.zeros((0, 5)) for _ in faces]
        # All images' faces at once: into image pixels (ymin, xmin, ymax, xmax -> x1, y1, x2, y2), then apart.
        d = np.concatenate(faces).astype(np.float64)
        view = np.repeat(np.asarray(params, np.float64), counts, axis=0)  # scale, pad_x, pad_y
        boxes = np.stack([d[:, 1], d[:, 0], d[:, 3], d[:, 2]], axis=1) * self.size
        boxes = (boxes - view[:, [1, 2, 1, 2]]) / view[:, :1]
        out = np.concatenate([boxes, d[:, -1:]], axis=1)
        return [part[np.argsort(-part[:, 4])] if len(part) else np.zeros((0, 5))
                for part in np.split(out, np.cumsum(counts)[:-1])]

    def prepare(self) -> None:
        """Capture the graph of every padded batch size, the close look's too, in the background."""
        dtype = next(self.net.parameters()).dtype
        self._graphs.prepare([(b, dtype, self.size, self.size) for b in _powers_of_two(self.max_batch)][::-1])
        if self._look_graphs is not None:
            self._look_graphs.prepare(_powers_of_two(CLOSE_LOOK_BATCH))

    def wait_for_graphs(self) -> None:
        """Until the graphs being captured in the background, the close look's too, are ready."""
        for graphs in (self._graphs, self._look_graphs):
            if graphs is not None:
                graphs.wait()

    def _capture(self, key: tuple, stream: "torch.cuda.Stream", error_mode: str) -> tuple:
        batch, dtype, height, width = key
        static_in = torch.zeros(batch, 3, height, width, device=self.device, dtype=dtype)
        graph, outputs = capture_graph(lambda: self.net(static_in), stream, error_mode)
        return graph, static_in, outputs

    def _graph_worth_it(self, size: tuple[int, int]) -> bool:
        """Whether an input of this size runs as a CUDA graph: the network's own always; a fine-view size from
        its second time (a video's frames, not a folder of photos of every size), up to FINE_SIZES_KEPT sizes
        (each graph keeps its memory)."""
        if size == (self.size, self.size):
            return True
        seen = self._fine_seen.get(size, 0)
        if seen == 0 and len(self._fine_seen) >= FINE_SIZES_KEPT:
            return False
        self._fine_seen[size] = seen + 1
        return seen >= 1

    def _forward(self, x: torch.Tensor, padded: Optional[int] = None,
                 fresh: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The network on ``x`` run as a batch of ``padded`` (default its own size; the outputs' rows past ``x``'s
        are not to be read); on a GPU as a CUDA graph per padded batch size and input size (eager, it is ~150 tiny
        launches). In the background mode a size first seen (the fine view's) is captured in the background.
        ``fresh=False``: a graph's outputs as they are, overwritten by its next replay (for a caller that only
        queues work reading them)."""
        padded = padded or len(x)
        key = (padded, x.dtype, *x.shape[2:])
        entry = None
        if self._graphs is not None and self._graph_worth_it(tuple(x.shape[2:])):
            entry = self._graphs.get(key, later=self.background)
        if entry is None:  # no graphs, or this one's is being captured in the background: the same network
            return self.net(_pad(x, padded))
        graph, static_in, (boxes, scores) = entry
        static_in[:len(x)].copy_(x)  # rows past them keep earlier inputs: their outputs are not read
        graph.replay()
        return (boxes.clone(), scores.clone()) if fresh else (boxes, scores)
