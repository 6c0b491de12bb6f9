"""Crop geometry (spec §5): boxes to 256x256 crops, and landmarks from heatmaps back to the image.

A crop is described by a 2x3 affine matrix that maps image coordinates to crop coordinates: the square
of side ``200 * scale`` centred on ``center`` becomes the ``size x size`` crop.
"""
from __future__ import annotations

from typing import Sequence, Union

import cv2
import numpy as np
import torch

from .results import CROP_SIZE

LANDMARK_REFERENCE_SCALE = 220.0   # training/evaluation crops from the 68-landmark box
S3FD_REFERENCE_SCALE = 195.0       # FAN convention for S3FD detector boxes
DETECTOR_SHIFT = 0.12              # detector box centre moved up by this fraction of the box height


def center_scale_from_box(box: Sequence[float], reference_scale: float = LANDMARK_REFERENCE_SCALE,
                          shift: float = 0.0) -> tuple[np.ndarray, float]:
    """Centre and scale of a crop from a box ``[x1, y1, x2, y2]``: ``scale = (w + h) / reference_scale``."""
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    w, h = x2 - x1, y2 - y1
    center = np.array([(x1 + x2) / 2.0, (y1 + y2) / 2.0 - shift * h])
    return center, (w + h) / reference_scale


def crop_matrix(center: Sequence[float], scale: float, size: int = CROP_SIZE) -> np.ndarray:
    """The 2x3 affine mapping the square of side ``200 * scale`` around ``center`` onto the crop."""
    s = size / (200.0 * scale)
    cx, cy = float(center[0]), float(center[1])
    return np.array([[s, 0.0, size / 2.0 - s * cx], [0.0, s, size / 2.0 - s * cy]], dtype=np.float64)


def box_to_matrix(box: Sequence[float], reference_scale: float = LANDMARK_REFERENCE_SCALE,
                  shift: float = 0.0, size: int = CROP_SIZE) -> np.ndarray:
    """Crop matrix for a box, by the landmark convention (defaults) or a detector's."""
    center, scale = center_scale_from_box(box, reference_scale, shift)
    return crop_matrix(center, scale, size)


def landmarks_box(landmarks: np.ndarray) -> np.ndarray:
    """Tight box ``[x1, y1, x2, y2]`` around ``(68, 2)`` landmarks."""
    return landmarks_boxes(np.asarray(landmarks)[None])[0]


def landmarks_boxes(landmarks: np.ndarray) -> np.ndarray:
    """:func:`landmarks_box` of ``(n, 68, 2)`` landmarks at once: ``(n, 4)``."""
    # x and y each made one contiguous row per face first: numpy reduces a contiguous last axis many times faster
    # than the strided middle one, and a minimum is the same whichever way it is taken.
    pts = np.ascontiguousarray(np.asarray(landmarks, dtype=np.float64).transpose(0, 2, 1))
    return np.concatenate([pts.min(axis=2), pts.max(axis=2)], axis=1)


def warp_crops(image: np.ndarray, matrices: Sequence[np.ndarray], size: int = CROP_SIZE) -> np.ndarray:
    """Warp an ``(H, W, 3)`` uint8 image into ``(N, size, size, 3)`` crops; bilinear, zero border."""
    out = np.zeros((len(matrices), size, size, 3), dtype=np.uint8)
    for i, m in enumerate(matrices):
        cv2.warpAffine(image, np.asarray(m, dtype=np.float64), (size, size), dst=out[i],
                       flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return out


def _upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on ``device`` without stalling the host.

    A copy from pageable memory makes the host wait until the stream has drained (the GPU work queued
    before it); staged through pinned memory it is queued like a kernel. Torch's pinned-memory cache
    keeps the buffer until the copy has run.
    """
    if torch.device(device).type != "cuda":
        return torch.from_numpy(array).to(device)
    staged = torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype, pin_memory=True)
    staged.numpy()[...] = array
    return staged.to(device, non_blocking=True)


def warp_crops_torch(image: torch.Tensor, matrices: Sequence[np.ndarray], size: int = CROP_SIZE,
                     frame_index: Sequence[int] | None = None) -> torch.Tensor:
    """All crops of a ``(3, H, W)`` uint8 image in one ``grid_sample`` call on the image's device.

    Same geometry as :func:`warp_crops` (bilinear, zero border, OpenCV's pixel-centre convention);
    returns ``(N, 3, size, size)`` uint8. ``python -m emonet.bench --warp`` compares the two. With
    ``frame_index``, ``image`` is a ``(F, 3, H, W)`` stack and crop ``i`` comes from frame ``frame_index[i]``:
    a whole chunk of video frames is cut in one call.
    """
    h, w = image.shape[-2:]
    def to_norm(width: int, height: int) -> np.ndarray:  # pixel -> [-1, 1] (align_corners=False)
        return np.array([[2.0 / width, 0, 1.0 / width - 1], [0, 2.0 / height, 1.0 / height - 1], [0, 0, 1]])
    # All crops at once (a chunk of video frames has dozens): crop pixel -> image pixel, then normalised.
    m = np.asarray(matrices, dtype=np.float64).reshape(-1, 2, 3)
    inv = np.zeros((len(m), 3, 3))
    inv[:, :2, :2] = np.linalg.inv(m[:, :, :2])
    inv[:, :2, 2] = -np.einsum("nij,nj->ni", inv[:, :2, :2], m[:, :, 2])
    inv[:, 2, 2] = 1.0
    thetas = (to_norm(w, h) @ inv @ np.linalg.inv(to_norm(size, size)))[:, :2]
    n = len(m)
    frame_index = None if frame_index is None else list(frame_index)
    if frame_index is None or frame_index == list(range(image.shape[0])):  # one crop per frame, in order
        theta = _upload(thetas.astype(np.float32), image.device)
        src = image.float() if frame_index is not None else image.unsqueeze(0).float().expand(n, -1, -1, -1)
    else:
        return _warp_stack(image, thetas, frame_index, size)
    return _sample(src, torch.nn.functional.affine_grid(theta, [n, 3, size, size], align_corners=False))


def _sample(src: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """``grid_sample`` of float images (bilinear, zero border, OpenCV's pixel centres), rounded to uint8."""
    out = torch.nn.functional.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _warp_stack(frames: torch.Tensor, thetas: np.ndarray, frame_index: list[int], size: int) -> torch.Tensor:
    """Crops of a ``(F, 3, H, W)`` stack, crop ``i`` from frame ``frame_index[i]``, by the cheaper of two ways that
    give the same bits. Grouped: each frame's crops side by side in one grid, each frame made float once however
    many faces it holds. Gathered: a float copy of the frame for each crop (six faces of a 1080p chunk are
    gigabytes), cheaper only where one frame holds many more crops than the rest. Either way every crop's grid
    and every sampled point's arithmetic are those of the crop alone."""
    n, (count, height, width) = len(thetas), (frames.shape[0], *frames.shape[-2:])
    slot, held = np.zeros(n, np.int64), [0] * count
    for i, f in enumerate(frame_index):  # the crop's place among its frame's crops
        if not 0 <= f < count:
            raise IndexError(f"crop {i} is of frame {f}; the stack holds {count}")
        slot[i], held[f] = held[f], held[f] + 1
    k = max(held)
    grouped = count * (height * width + k * size * size) <= n * (height * width + size * size)  # values to write
    # Where each crop goes travels with the matrices: one upload, laid out as it always was (exact in float32
    # below 2**24).
    target = np.asarray(frame_index) * k + slot if grouped else np.asarray(frame_index)
    packed = _upload(np.concatenate([thetas.reshape(n, 6), target[:, None]], axis=1).astype(np.float32),
                     frames.device)
    grid = torch.nn.functional.affine_grid(packed[:, :6].view(n, 2, 3), [n, 3, size, size], align_corners=False)
    place = packed[:, 6].long()
    if not grouped:
        return _sample(frames.index_select(0, place).float(), grid)
    if not (n == count * k and (target == np.arange(n)).all()):  # unless k crops a frame, frame by frame
        grid = grid.new_zeros(count * k, size, size, 2).index_copy_(0, place, grid)  # zeros: no crop
    out = _sample(frames.float(), grid.view(count, k * size, size, 2)).view(count, 3, k, size, size)
    return out[place // k, :, place % k]


def crop_faces(image: Union[np.ndarray, torch.Tensor], matrices: Sequence[np.ndarray],
               device: torch.device) -> torch.Tensor:
    """One ``(H, W, 3)`` uint8 image's face crops as ``(N, 3, 256, 256)`` uint8 on ``device``.

    On a GPU the frame is uploaded once (or given already there, as a tensor) and warped there (as fast as
    OpenCV for one face, faster for several); on the CPU, OpenCV.
    """
    if torch.device(device).type == "cuda":
        frame = image if torch.is_tensor(image) else torch.from_numpy(np.ascontiguousarray(image))
        return warp_crops_torch(frame.to(device, non_blocking=True).permute(2, 0, 1), matrices)
    if torch.is_tensor(image):
        image = image.cpu().numpy()
    return to_tensor(warp_crops(image, matrices))


def crop_frames(frames: Sequence[Union[np.ndarray, torch.Tensor]], crops: Sequence[tuple[int, np.ndarray]],
                device: torch.device) -> torch.Tensor:
    """Face crops from several ``(H, W, 3)`` frames: ``crops`` lists ``(frame number, matrix)``, in order.

    On a GPU, frames of one size are stacked and cut in one call (a video chunk costs a handful of
    launches, not a handful per frame); otherwise frame by frame with :func:`crop_faces`.
    """
    if not crops:
        return torch.zeros(0, 3, CROP_SIZE, CROP_SIZE, dtype=torch.uint8, device=device)
    used = sorted({i for i, _ in crops})
    if torch.device(device).type == "cuda" and len({tuple(frames[i].shape) for i in used}) == 1:
        stack = torch.stack([frames[i] if torch.is_tensor(frames[i]) else torch.from_numpy(frames[i])
                             for i in used]).to(device, non_blocking=True).permute(0, 3, 1, 2)
        position = {i: k for k, i in enumerate(used)}
        return warp_crops_torch(stack, [m for _, m in crops], frame_index=[position[i] for i, _ in crops])
    return torch.cat([crop_faces(frames[i], [m], device) for i, m in crops])


def to_tensor(crops: np.ndarray) -> torch.Tensor:
    """``(N, H, W, 3)`` uint8 RGB crops to an ``(N, 3, H, W)`` uint8 tensor (the engine scales to [0, 1])."""
    return torch.from_numpy(np.ascontiguousarray(crops)).permute(0, 3, 1, 2).contiguous()


def invert(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a 2x3 affine matrix (:func:`invert_many` of one)."""
    return invert_many([matrix])[0]


def apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a 2x3 affine matrix to ``(..., 2)`` points."""
    pts = np.asarray(points, dtype=np.float64)
    m = np.asarray(matrix, dtype=np.float64)
    return pts @ m[:, :2].T + m[:, 2]


def decode_heatmaps(heatmaps: torch.Tensor, size: int = CROP_SIZE) -> np.ndarray:
    """``(N, 68, h, w)`` heatmaps to ``(N, 68, 2)`` (x, y) in crop pixels (spec §5).

    Per channel: the arg-max, moved a quarter pixel towards the larger neighbour on each axis, then
    scaled from the heatmap grid to the crop (x4 for 64 -> 256).
    """
    return heatmap_coords(heatmaps, size).cpu().numpy().astype(np.float64)


def heatmap_coords(heatmaps: torch.Tensor, size: int = CROP_SIZE) -> torch.Tensor:
    """:func:`decode_heatmaps` left on the heatmaps' device (float32), to be copied back with other results."""
    hm = heatmaps.detach().float()
    n, c, h, w = hm.shape
    flat = hm.reshape(n, c, h * w)
    idx = flat.argmax(dim=2)
    x, y = (idx % w), torch.div(idx, w, rounding_mode="floor")
    xf, yf = x.float(), y.float()
    # Neighbours, clamped at the border where the shift is then zero (both sides read the same pixel).
    def at(yy, xx):
        return flat.gather(2, (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).unsqueeze(2)).squeeze(2)
    inner_x = (x > 0) & (x < w - 1)
    inner_y = (y > 0) & (y < h - 1)
    dx = torch.sign(at(y, x + 1) - at(y, x - 1)) * inner_x
    dy = torch.sign(at(y + 1, x) - at(y - 1, x)) * inner_y
    return torch.stack([xf + 0.25 * dx, yf + 0.25 * dy], dim=2) * (size / w)


def invert_many(matrices: Sequence[np.ndarray]) -> np.ndarray:
    """Inverses of ``(N, 2, 3)`` affine matrices at once: OpenCV's ``invertAffineTransform`` arithmetic in its order
    (the same bits)."""
    m = np.asarray(matrices, dtype=np.float64).reshape(-1, 2, 3)
    det = m[:, 0, 0] * m[:, 1, 1] - m[:, 0, 1] * m[:, 1, 0]
    nonzero = det != 0
    det = np.where(nonzero, 1.0 / np.where(nonzero, det, 1.0), 0.0)
    a11, a22, a12, a21 = m[:, 1, 1] * det, m[:, 0, 0] * det, -m[:, 0, 1] * det, -m[:, 1, 0] * det
    b1 = -a11 * m[:, 0, 2] - a12 * m[:, 1, 2]
    b2 = -a21 * m[:, 0, 2] - a22 * m[:, 1, 2]
    return np.stack([np.stack([a11, a12, b1], axis=1), np.stack([a21, a22, b2], axis=1)], axis=1)


def crop_to_image(matrices: Sequence[np.ndarray], crop_points: np.ndarray) -> np.ndarray:
    """``(N, K, 2)`` points in each face's crop back to image coordinates (each crop's warp undone).

    All faces at once, the same values as :func:`apply` of :func:`invert` face by face, bit for bit (a NaN's sign
    aside): a stacked ``matmul`` is one BLAS product per face, of the same shape and memory layout as ``apply``'s."""
    if not len(crop_points):
        return np.zeros((0, *np.shape(crop_points)[1:]))
    inverse = invert_many(matrices)
    points = np.ascontiguousarray(crop_points, dtype=np.float64)
    if len(inverse) != len(points):
        raise ValueError(f"{len(inverse)} crop matrices for {len(points)} faces' points")
    return points @ inverse[:, :, :2].transpose(0, 2, 1) + inverse[:, None, :, 2]


def landmarks_to_image(heatmaps: torch.Tensor, matrices: Sequence[np.ndarray]) -> np.ndarray:
    """Landmarks in image coordinates: decode the heatmaps, then undo each face's crop warp."""
    if not len(heatmaps):
        return np.zeros((0, heatmaps.shape[1], 2))
    return crop_to_image(matrices, decode_heatmaps(heatmaps))
