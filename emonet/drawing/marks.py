"""What the annotated video lays over each chunk of frames, planned on the host with NumPy and OpenCV.

:class:`Planner` turns a chunk's faces into :class:`ChunkMarks`: a few arrays (sprites' pixels and
places, boxes' rectangles, trails' segments, dots, the panel crops' maps) that
:class:`emonet.drawing.VideoCanvas` turns into pixels on the frames' device in a fixed number of tensor
operations, whatever the chunk holds. Torch-free: what is drawn is decided here, how it is drawn there.

Sprites used again and again (the circumplex discs, fixed captions) go once into an *atlas* the canvas
keeps on the device; a plan names them by their place there and carries only what is new to it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Hashable, Optional, Sequence

import numpy as np

from ..results import CROP_SIZE, FaceResult
from .opencv import (banner_height, circumplex_xy, disc_points, disc_sprite, no_face, place_faces, text_origin,
                     text_sprite)

LANDMARK_COLOR = (0, 255, 255)
PANEL_GREY = 24
TRAIL = 30  # valence/arousal points a face's trail keeps
ATLAS_PIXELS = 4 << 20  # kept sprites' pixels on the device at most; beyond, the atlas starts again

Color = tuple[int, int, int]
# Per frame, its faces, each with its valence/arousal trail (oldest first).
Faces = Sequence[Sequence[tuple[FaceResult, Sequence]]]

__all__ = ["ChunkMarks", "Planner", "panel_width", "coded_size", "panel_layout",
           "LANDMARK_COLOR", "PANEL_GREY", "TRAIL"]


def panel_width(height: int) -> int:
    """Width of the side panel beside a frame of this height."""
    return max(200, height // 2)


def panel_layout(height: int) -> tuple[int, int, int, tuple[int, int]]:
    """Panel width, crop side, circumplex radius and centre (in panel coordinates)."""
    width = panel_width(height)
    side = min(width, int(height * 0.5))
    radius = max(20, min(width, height - side - 40) // 2 - 12)
    center = (width // 2, min(height - radius - 8, side + 40 + radius))
    return width, side, radius, center


def coded_size(height: int, width: int) -> tuple[int, int]:
    """``(width, height)`` of the annotated video for frames of ``height`` x ``width``: the frame and its
    panel, each side rounded up to even (yuv420p halves the chroma planes)."""
    total = width + panel_width(height)
    return total + total % 2, height + height % 2


@dataclass
class ChunkMarks:
    """A chunk's marks as arrays, in drawing order: sprites, then rectangles (boxes' sides), lines (trails)
    and dots (landmarks, valence/arousal points), each over the ones before."""

    shape: tuple[int, int]                  # (H, W) of the video's frames
    crop_frames: np.ndarray                 # (F,) int64: the frames with a face, whose main face the panel shows
    crop_maps: np.ndarray                   # (F, 2, 3) float32: panel crop pixel (u, v, 1) -> grid_sample's [-1, 1]
    sprite_pixels: np.ndarray               # (P, 4) uint8 premultiplied RGBA: the sprites new in this chunk, cut
    # (S, 8) int64: frame, x, y, width, first pixel, pixels, and where its rows start in the source (this
    # chunk's new pixels, then the atlas) and how far apart they are
    sprites: np.ndarray
    layer_pixels: np.ndarray                # (L,) int64: sprite pixels per layer (no two in a layer overlap)
    atlas_at: int                           # the atlas's size before ``atlas_add``; 0 with a new atlas
    atlas_add: Optional[np.ndarray]         # (A, 4) uint8: kept sprites to append to the atlas
    # Rectangles, lines and dots as one table in two parts, (M, 5) float64 and (M, 11) int32 (see
    # :func:`point_table`), and the largest dot's radius (:func:`dot_offsets` of it holds every dot's pixels).
    points: Optional[tuple[np.ndarray, np.ndarray]]
    largest_dot: int = 0


@dataclass
class _Sprite:
    frame: int
    x: int                                   # where its cut part goes
    y: int
    rgba: np.ndarray
    cut: tuple[int, int, int, int]           # r0, r1, c0, c1 of the part inside its clip
    key: Optional[Hashable]                  # kept in the atlas under this key; None: new every chunk


class Planner:
    """``plan(shapes, faces, colors)``: one chunk's :class:`ChunkMarks`; chunks of one video, in order.

    The first frame's size is the video's (unless given); a frame of another size has its faces scaled to it
    (the canvas resizes its pixels). Plans of one video made by two planners (one after the other) are drawn
    alike: each one's first kept sprite starts the canvas's atlas again.
    """

    def __init__(self, class_names: Sequence[str], banner: bool = False,
                 shape: Optional[tuple[int, int]] = None) -> None:
        """``shape``: the (H, W) of the video's frames, if known (else the first chunk's first frame's)."""
        self.class_names = list(class_names)
        self.banner = banner  # a banner across the top: marks go below it
        self.shape: Optional[tuple[int, int]] = tuple(shape) if shape else None
        self._atlas: dict[Hashable, tuple[int, int]] = {}  # key -> (first pixel, width) in the atlas
        self._atlas_size = 0

    def plan(self, shapes: Sequence[tuple[int, int]], faces: Faces, colors: Sequence[Sequence[Color]]) -> ChunkMarks:
        """Every mark of a chunk: ``shapes`` (H, W) per frame; ``faces`` per frame, each face with its trail;
        ``colors`` per frame, a colour per face (its mark on the panel)."""
        if self.shape is None:
            self.shape = tuple(shapes[0][:2])
        h, w = self.shape
        faces = [list(f) for f in faces]
        for b, shape in enumerate(shapes):
            if tuple(shape[:2]) != (h, w):  # the canvas resizes this frame: its faces follow
                sx, sy = w / shape[1], h / shape[0]
                faces[b] = [(_scaled(f, sx, sy), trail) for f, trail in faces[b]]
        sprites: list[_Sprite] = []
        width, side, radius, center = panel_layout(h)
        frame_clip, panel_clip = (0, 0, w, h), (w, 0, w + width, h)
        crop_x = w + (width - side) // 2
        crop_clip = (crop_x, 0, crop_x + side, side)
        disc = (w + center[0], center[1])

        def sprite(b: int, rgba: np.ndarray, x: int, y: int, clip: tuple, key: Optional[Hashable] = None) -> None:
            sh, sw = rgba.shape[:2]
            x0, y0, x1, y1 = max(x, clip[0]), max(y, clip[1]), min(x + sw, clip[2]), min(y + sh, clip[3])
            if x1 > x0 and y1 > y0:
                sprites.append(_Sprite(b, x0, y0, rgba, (y0 - y, y1 - y, x0 - x, x1 - x), key))

        # Face by face (frame by frame) only what cannot be done for all at once: the sprites, and where each
        # face's marks go. Every mark gets a number in drawing order: where dots overlap, the later is on top.
        found, places, trails, main, main_at, panel_points = [], [], [], [], [], []
        n = 0  # the next mark's number
        top = banner_height(w) if self.banner else 0
        for b, (pairs, palette) in enumerate(zip(faces, colors)):
            placed = place_faces([face for face, _ in pairs], self.class_names, (h, w), top,
                                 [f"#{face.face_id}" for face, _ in pairs])
            for (face, trail), m in zip(pairs, placed):
                sprite(b, m.label, *m.label_at, frame_clip)
                cx, cy = m.disc_center
                sprite(b, disc_sprite(m.disc_radius), cx - m.disc_radius - 1, cy - m.disc_radius - 1, frame_clip,
                       key=("disc", m.disc_radius))
                found.append(face)
                places.append((b, *m.box, m.thickness, *m.color, m.landmark_radius, *m.disc_center, m.disc_radius,
                               m.dot_radius, n))  # n: its landmarks; n + 1: its point on the disc beside it
                trails.append(trail)
                n += 2
            if not pairs:
                sprite(b, *no_face(h), frame_clip, key=("no face", h))
            # The panel: the main face's crop (cut on the device), its landmarks and caption; every face's
            # trail and point on the circumplex.
            caption = "no face"
            if pairs:
                face = max((f for f, _ in pairs), key=lambda f: f.box[2] - f.box[0])
                caption = (f"#{face.face_id} {self.class_names[face.expression]} "
                           f"{face.probabilities[face.expression]:.2f}")
                main.append(face)
                main_at.append((b, n))
                n += 1
            sprite(b, text_sprite(caption, 0.5, (255, 255, 255)), w + 8, side + 22 - text_origin(caption, 0.5),
                   panel_clip, key=None if pairs else ("caption", caption))
            for color in palette:
                panel_points.append((n, *color))
                n += 1
        pixels, table, layer_pixels, atlas_at, atlas_add = self._sprite_tables(sprites)
        if not found:
            return ChunkMarks((h, w), np.zeros(0, np.int64), np.zeros((0, 2, 3), np.float32), pixels, table,
                              layer_pixels, atlas_at, atlas_add, None)
        places = np.array(places, np.int64)
        fb, boxes, thickness, color = places[:, 0], places[:, 1:5], places[:, 5], places[:, 6:9]
        landmark_radius, disc_center, disc_radius, dot_radius, number = (places[:, 9], places[:, 10:12], places[:, 12],
                                                                         places[:, 13], places[:, 14])
        panel = np.array(panel_points, np.int64)  # per face: its panel point's number, and its panel colour
        va = np.array([(f.valence, f.arousal) for f in found], np.float64)
        dots = [  # centres, frames, radius, packed colour, clip, number: one row per mark
            (np.stack([f.landmarks for f in found]), fb, landmark_radius, _pack(LANDMARK_COLOR), frame_clip, number),
            (circumplex_xy(disc_center, disc_radius, va), fb, dot_radius, _pack(color), frame_clip, number + 1)]
        # The main faces' crops: landmarks in the crop, and the map from crop pixels to the frame.
        frames_main, seq_main = np.array(main_at, np.int64).T
        matrices = np.stack([np.asarray(f.matrix, np.float64) for f in main]) * (side / CROP_SIZE)
        crop_lm = np.matmul(np.stack([f.landmarks for f in main]), matrices[:, :, :2].transpose(0, 2, 1))
        crop_lm += matrices[:, None, :, 2] + [crop_x, 0]
        dots.append((crop_lm, frames_main, 2, _pack(LANDMARK_COLOR), crop_clip, seq_main))
        dots.append((circumplex_xy(disc, radius, va), fb, max(2, radius // 12), _pack(panel[:, 1:]), panel_clip,
                     panel[:, 0]))
        square = np.concatenate([matrices, np.broadcast_to([[[0.0, 0.0, 1.0]]], (len(main), 1, 3))], 1)
        # Crop pixel centres (u, v, 1) -> image pixels -> grid_sample's [-1, 1] (align_corners=False).
        to_grid = np.array([[2 / w, 0, 1 / w - 1], [0, 2 / h, 1 / h - 1], [0, 0, 1]])
        crop_maps = np.matmul(to_grid, np.linalg.inv(square))[:, :2].astype(np.float32)
        return ChunkMarks((h, w), frames_main, crop_maps, pixels, table, layer_pixels, atlas_at, atlas_add,
                          *point_table(_rect_table(fb, boxes, thickness, color, frame_clip),
                                       _segment_table(trails, fb, panel[:, 1:], disc, radius, panel_clip),
                                       _dot_tables(dots)))

    def _sprite_tables(self, sprites: list[_Sprite]) -> tuple:
        """The sprites in drawing order (by layer, stably) as a table, the new pixels they need, and the
        kept sprites new to the atlas."""
        fresh_pixels = np.zeros((0, 4), np.uint8)
        if not sprites:
            return fresh_pixels, np.zeros((0, 8), np.int64), np.zeros(0, np.int64), self._atlas_size, None
        new = [s for s in sprites if s.key is not None and s.key not in self._atlas]
        added = sum(s.rgba.shape[0] * s.rgba.shape[1] for s in {s.key: s for s in new}.values())
        if new and self._atlas_size + added > ATLAS_PIXELS:  # sprites of many sizes came: start again
            self._atlas, self._atlas_size = {}, 0
            new = [s for s in sprites if s.key is not None]
        atlas_at = self._atlas_size
        additions = []
        for s in new:
            if s.key not in self._atlas:
                self._atlas[s.key] = (self._atlas_size, s.rgba.shape[1])
                self._atlas_size += s.rgba.shape[0] * s.rgba.shape[1]
                additions.append(s.rgba.reshape(-1, 4))
        layers = _layers(sprites)
        order = sorted(range(len(sprites)), key=lambda i: layers[i])  # stable: drawing order within a layer
        parts = [sprites[i] for i in order]
        fresh = [s.rgba[s.cut[0]:s.cut[1], s.cut[2]:s.cut[3]].reshape(-1, 4) for s in parts if s.key is None]
        if fresh:
            fresh_pixels = np.concatenate(fresh)
        rows, start, at = [], 0, 0
        for s in parts:
            r0, r1, c0, c1 = s.cut
            n = (r1 - r0) * (c1 - c0)
            if s.key is None:  # its cut part, row after row, in this chunk's pixels
                source, stride = at, c1 - c0
                at += n
            else:  # cut from its place in the atlas, which follows this chunk's pixels in the source
                first, stride = self._atlas[s.key]
                source = len(fresh_pixels) + first + r0 * stride + c0
            rows.append((s.frame, s.x, s.y, c1 - c0, start, n, source, stride))
            start += n
        table = np.array(rows, np.int64)
        layer_pixels = np.bincount(np.asarray(layers)[order], weights=table[:, 5]).astype(np.int64)
        return fresh_pixels, table, layer_pixels, atlas_at, (np.concatenate(additions) if additions else None)


# -- the tables the device turns into pixels, for all the chunk's faces at once -------------------------

def _pack(color: np.ndarray) -> np.ndarray:
    """RGB (.., 3) as one int64 each."""
    return np.asarray(color, np.int64) @ np.array([65536, 256, 1], np.int64)


def _rect_table(frames: np.ndarray, boxes: np.ndarray, thickness: np.ndarray, color: np.ndarray,
                clip: tuple[int, int, int, int]) -> Optional[np.ndarray]:
    """``(4F, 8)`` int64: frame, x0, y0, width, pixels, R, G, B of each box's four sides (top, bottom, left,
    right: filled rectangles ``thickness`` wide centred on its edges), cut to ``clip``; None if nothing shows."""
    x1, y1, x2, y2 = boxes.T
    lo, hi = (thickness - 1) // 2, thickness // 2 + 1
    sides = np.stack([np.stack(s, 1) for s in ((x1 - lo, y1 - lo, x2 + hi, y1 + hi), (x1 - lo, y2 - lo, x2 + hi, y2 + hi),
                                              (x1 - lo, y1 - lo, x1 + hi, y2 + hi), (x2 - lo, y1 - lo, x2 + hi, y2 + hi))],
                     1).reshape(-1, 4)
    x0, y0 = np.maximum(sides[:, 0], clip[0]), np.maximum(sides[:, 1], clip[1])
    w = np.maximum(np.minimum(sides[:, 2], clip[2]) - x0, 0)
    h = np.maximum(np.minimum(sides[:, 3], clip[3]) - y0, 0)
    table = np.column_stack([np.repeat(frames, 4), x0, y0, w, w * h, np.repeat(color, 4, axis=0)])
    return table if table[:, 4].sum() > 0 else None


def _segment_table(trails: list, frames: np.ndarray, colors: np.ndarray, center: tuple[int, int], radius: int,
                   clip: tuple[int, int, int, int]) -> Optional[np.ndarray]:
    """``(S, 12)`` float64: start x, y, step x, y, pixels, frame, clip x0, y0, x1, y1, and the packed colour
    of each segment of the faces' trails on the panel's circumplex (a pixel per step along its longer axis);
    older segments darker."""
    lengths = np.array([len(t) for t in trails])
    drawn = np.flatnonzero(lengths > 1)
    if not len(drawn):
        return None
    counts = lengths[drawn] - 1
    points = circumplex_xy(center, radius, np.concatenate([np.asarray(trails[i], np.float64).reshape(-1, 2)
                                                         for i in drawn])).astype(np.float64)
    first = np.ones(len(points), bool)  # a segment from each point but its trail's last
    first[np.cumsum(counts + 1) - 1] = False
    start = points[:-1][first[:-1]]
    step = np.diff(points, axis=0)[first[:-1]]
    # Per segment k (1 ..) of a trail of L points: shade 0.3 + 0.7 k / L of its colour.
    k = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + 1
    shade = 0.3 + 0.7 * k / np.repeat(counts + 1, counts)
    shaded = (np.repeat(colors[drawn], counts, axis=0) * shade[:, None]).astype(np.uint8)
    return np.column_stack([start, step, np.abs(step).max(1) + 1, np.repeat(frames[drawn], counts).astype(np.float64),
                            np.broadcast_to(np.asarray(clip, np.float64), (len(start), 4)), _pack(shaded)])


def _dot_tables(dots: list) -> dict[int, np.ndarray]:
    """Per radius, ``(K, 8)`` int64: centre x, y, frame, clip x0, y0, x1, y1 and the packed colour, in the
    order of the marks' numbers. ``dots``: per kind of mark, ``(centres (M, [P,] 2), frames (M,), radius,
    packed colour, clip, number (M,))``; radius and colour one per mark or one for all."""
    rows, radii, order = [], [], []
    for centres, frames, radius, packed, clip, number in dots:
        m = len(frames)
        per = centres.shape[1] if centres.ndim == 3 else 1  # centres per mark
        xy = np.rint(centres.reshape(-1, 2)).astype(np.int64)
        meta = np.column_stack([frames, np.broadcast_to(np.asarray(clip, np.int64), (m, 4)),
                                np.broadcast_to(packed, (m,))])
        rows.append(np.hstack([xy, np.repeat(meta, per, axis=0)]))
        radii.append(np.repeat(np.broadcast_to(radius, (m,)), per))
        order.append(np.repeat(number, per))
    rows, radii = np.concatenate(rows), np.concatenate(radii)
    by_number = np.argsort(np.concatenate(order), kind="stable")  # a mark's dots stay in their order
    rows, radii = rows[by_number], radii[by_number]
    return {int(r): rows[radii == r] for r in np.unique(radii)}


# The columns of :func:`point_table`'s two parts.
P_X, P_Y, P_AX, P_AY, P_SPAN = range(5)
P_FRAME, P_WIDTH, P_PIXELS, P_FIRST, P_OFFSET, P_STEP, P_CLIP, _, _, _, P_COLOR = range(11)
_NO_CLIP = 1 << 30


def point_table(rects: Optional[np.ndarray], segments: Optional[np.ndarray],
                dots: dict[int, np.ndarray]) -> tuple[Optional[tuple[np.ndarray, np.ndarray]], int]:
    """Rectangles, segments and dots (the tables of :func:`_rect_table`, :func:`_segment_table` and
    :func:`_dot_tables`) as one table in drawing order (rectangles, segments, then the dots radius by radius),
    and the largest dot's radius.

    The table is two arrays of M rows: ``(M, 5)`` float64 x, y, a (2) and span; ``(M, 11)`` int32 frame, width,
    pixels, first (where its pixels start among all), o, step, clip x0, y0, x1, y1 and the packed colour. A
    row's pixel ``k`` (of its ``pixels``), with ``i, j = k % width, k // width``, is at ``round((x, y) + a * (i
    / span)) + (0, j) + offset[o + step * i]``, kept where inside its clip ``[x0, x1) x [y0, y1)``. A rectangle
    steps right then down; a segment along ``a``, ``pixels`` of it over ``span``; a dot takes its pixels from
    :func:`dot_offsets` (``offset[0]`` is (0, 0) for the others), where each radius has a place of its own."""
    floats, ints = [], []

    def add(x, y, ax, ay, span, frame, width, pixels, offset, step, clip, color) -> None:
        floats.append(np.column_stack([x, y, ax, ay, span]))
        ints.append(np.column_stack([frame, width, pixels, np.zeros(len(frame)), offset, step, clip, color]))

    if rects is not None:
        m = len(rects)
        add(rects[:, 1], rects[:, 2], np.ones(m), np.zeros(m), np.ones(m), rects[:, 0], rects[:, 3], rects[:, 4],
            np.zeros(m), np.zeros(m), np.broadcast_to([-_NO_CLIP, -_NO_CLIP, _NO_CLIP, _NO_CLIP], (m, 4)),
            _pack(rects[:, 5:8]))
    if segments is not None:
        g = segments
        zero = np.zeros(len(g))
        add(g[:, 0], g[:, 1], g[:, 2], g[:, 3], np.maximum(g[:, 4] - 1, 1), g[:, 5], g[:, 4], g[:, 4], zero, zero,
            g[:, 6:10], g[:, 10])
    for radius in sorted(dots):
        d = dots[radius]
        m, size = len(d), _disc_size(radius)
        add(d[:, 0], d[:, 1], np.zeros(m), np.zeros(m), np.ones(m), d[:, 2], np.full(m, size), np.full(m, size),
            np.full(m, 1 + sum(_disc_size(r) for r in range(radius))), np.ones(m), d[:, 3:7], d[:, 7])
    largest = max(dots, default=0)
    if not floats:
        return None, largest
    floats, ints = np.concatenate(floats).astype(np.float64), np.concatenate(ints).astype(np.int32)
    ints[:, P_FIRST] = np.cumsum(ints[:, P_PIXELS]) - ints[:, P_PIXELS]
    return (floats, ints), largest


def dot_offsets(largest: int) -> np.ndarray:
    """``(1 + K, 2)`` float64: (0, 0), then the offsets from its centre of each pixel of a dot of radius 0, 1, ..
    ``largest``, in turn (a radius's place is the same whatever the largest)."""
    return np.concatenate([np.zeros((1, 2))] + [np.stack(disc_points(np.zeros((1, 2)), r), 1)
                                                for r in range(largest + 1)])


@lru_cache(maxsize=None)
def _disc_size(radius: int) -> int:
    """The pixels of a dot of ``radius`` (:func:`~.opencv.disc_points`)."""
    return len(disc_points(np.zeros((1, 2)), radius)[0])


def _scaled(face: FaceResult, sx: float, sy: float) -> FaceResult:
    """A copy of a FaceResult in a frame resized by ``(sx, sy)``."""
    scale = np.array([sx, sy])
    matrix = np.asarray(face.matrix, np.float64) @ np.diag([1 / sx, 1 / sy, 1.0])
    return replace(face, box=np.asarray(face.box) * np.tile(scale, 2), landmarks=face.landmarks * scale,
                   matrix=matrix)


def _layers(sprites: list[_Sprite]) -> list[int]:
    """For each sprite, its layer: after every earlier sprite it overlaps on the same frame."""
    layers: list[int] = []
    placed: dict[int, list[tuple[int, int, int, int, int]]] = {}  # frame -> (x0, y0, x1, y1, layer)
    for s in sprites:
        r0, r1, c0, c1 = s.cut
        x, y, x1, y1 = s.x, s.y, s.x + c1 - c0, s.y + r1 - r0
        layer = max((lj + 1 for xa, ya, xb, yb, lj in placed.get(s.frame, ()) if x < xb and xa < x1 and y < yb and ya < y1),
                    default=0)
        placed.setdefault(s.frame, []).append((x, y, x1, y1, layer))
        layers.append(layer)
    return layers
