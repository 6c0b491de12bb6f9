"""Square crops around candidate boxes, sampled on the device for the close look (:mod:`.close_look`).

A crop is sampled bilinearly from the level of a pyramid of 2x2 means where its step is 1 to 2 pixels, so a crop
much larger than its output is not aliased; many images' crops are sampled together, with the same values as
alone (:func:`close_crops`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .transfer import frames_on, to_device


def longer_sides(boxes: np.ndarray) -> np.ndarray:
    """Each ``x1, y1, x2, y2`` box's longer side: ``(k, 4)`` -> ``(k,)``."""
    return np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])


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
                scaled: bool = True, mirrored: Optional[Sequence[np.ndarray]] = None) -> list[torch.Tensor]:
    """Per look ``(zooms, size)``, the square crops ``zoom`` times each box's longer side around its centre
    (black beyond the image), resampled to ``size``, of every image's boxes: ``(crops, 3, size, size)`` in
    [-1, 1] (``scaled=False``: in [0, 255], for :func:`scale_crops`) on ``device``, image by image, box by box,
    zoom by zoom.

    Each crop is sampled bilinearly from the level of a pyramid of 2x2 means (the image, halved again and
    again) where its step is 1 to 2 pixels, so a crop much larger than ``size`` is not aliased. Images of one
    size are sampled together (one pyramid for a batch of them; per look and level one sampling call, their
    crops side by side): a crop's values do not depend on what else is sampled with it. Everything the device
    needs to know (each sampling call's coordinates, each crop's place) is worked out first and sent in one copy.

    ``mirrored``: per image, per box, whether its crops see the image mirrored at its left and right edges
    beyond them (instead of black): a face the frame's side cuts through is seen whole, as faces are nearly
    symmetric left to right.
    """
    boxes = [np.asarray(b, np.float64).reshape(-1, 4) for b in boxes]
    flips = [np.zeros(len(b), bool) if mirrored is None else np.asarray(mirrored[i], bool).reshape(len(b))
             for i, b in enumerate(boxes)]
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
            plans = [_crop_plan([boxes[i] for i in batch], [first[i] for i in batch], zooms, size, top,
                                [flips[i] for i in batch])
                     for zooms, size in looks]
            calls: list[list[_Sampling]] = [[] for _ in range(max(int(p[3].max()) for p in plans) + 1)]
            for n, ((zooms, size), (image, rows, geometry, levels, flip)) in enumerate(zip(looks, plans)):
                for k in np.unique(levels):
                    chosen = np.flatnonzero(levels == k)
                    xy, slot, slots = _sample_coordinates(len(batch), height >> k, width >> k, image[chosen],
                                                          geometry[chosen], 2.0 ** k, size, flip[chosen])
                    places[n][rows[chosen]] = taken[n] + image[chosen] * slots + slot
                    taken[n] += len(batch) * slots
                    calls[k].append(_Sampling(n, size, slots, used, xy.size))
                    coordinates.append(xy.reshape(-1))
                    used += xy.size
            batches.append((batch, calls))
    order = [places[n] if not np.array_equal(places[n], np.arange(taken[n])) else None for n in range(len(looks))]
    sent = np.concatenate(coordinates + [o.astype(np.float32) for o in order if o is not None]) if coordinates else None
    sent = to_device(torch.from_numpy(sent), device) if sent is not None else None
    parts: list[list[torch.Tensor]] = [[] for _ in looks]
    for batch, calls in batches:
        level = frames_on(device, [images[i] for i in batch])
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


def _crop_plan(boxes: Sequence[np.ndarray], firsts: Sequence[int], zooms: Sequence[float], size: int,
               top: int, flips: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For images' boxes at ``zooms``: per crop its image (in the batch), its output row, ``(cx, cy, side)``,
    its pyramid level (where its step is 1 to 2 pixels, at most ``top``) and whether it is mirrored (``flips``,
    per box)."""
    zooms = np.asarray(zooms, np.float64)
    counts = np.array([len(b) for b in boxes])
    these = np.concatenate(boxes)
    sides = np.maximum(zooms[None, :] * longer_sides(these)[:, None], 2.0)
    image = np.repeat(np.arange(len(boxes)), counts * len(zooms))
    # Each box's crops go to rows from its image's first row on, zoom by zoom.
    box_rows = np.repeat(np.asarray(firsts) - np.cumsum(np.r_[0, counts[:-1]]), counts) + np.arange(len(these))
    rows = (box_rows[:, None] * len(zooms) + np.arange(len(zooms))).reshape(-1)
    geometry = np.stack([np.repeat((these[:, 0] + these[:, 2]) / 2, len(zooms)),
                         np.repeat((these[:, 1] + these[:, 3]) / 2, len(zooms)), sides.reshape(-1)], axis=1)
    levels = np.clip(np.floor(np.log2(np.maximum(geometry[:, 2] / size, 1.0))), 0, top).astype(int)
    return image, rows, geometry, levels, np.repeat(np.concatenate(flips), len(zooms))


def _sample_coordinates(n_images: int, height: int, width: int, image: np.ndarray, geometry: np.ndarray,
                        scale: float, size: int, flip: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Where crops ``(cx, cy, side)`` (image pixels; ``scale`` of them a pixel of a pyramid level of ``height`` x
    ``width``) of the batch's images ``image`` sample it, in grid_sample's terms (-1 and 1 are the outer edges of
    the first and last pixels), each image's crops side by side in ``slots`` slots: ``(2, n_images, slots,
    size)`` float32 (each output column's x, each output row's y), each crop's slot, and ``slots``. An empty slot
    samples far outside (black, then dropped). A crop of ``flip`` samples the level mirrored at its left and right
    edges beyond them (its x reflected about -1 and 1, as grid_sample's reflection padding does)."""
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
    if flip is not None and flip.any():
        # Reflected, then held within the outer pixels' centres: bilinear sampling there would otherwise reach
        # the black beyond the edge for its last half pixel.
        x = xy[0, image[flip], slot[flip]]
        x = np.where(x < -1, -2 - x, np.where(x > 1, 2 - x, x))
        xy[0, image[flip], slot[flip]] = np.clip(x, 1.0 / width - 1, 1 - 1.0 / width)
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
