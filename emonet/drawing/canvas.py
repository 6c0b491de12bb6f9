"""The annotated video's frames, drawn with torch where the frames already are (the GPU, when there is one).

Each frame becomes the frame with its faces marked and a side panel beside it (the main face's crop, a
caption, and every face's valence/arousal point with its trail on a circumplex), then I420 (yuv420p,
BT.601 limited range), which is what the H.264 encoder takes: only 1.5 bytes a pixel go back to the
host. A chunk of frames is drawn at once, in a fixed number of tensor operations whatever it holds:

- *sprites* (labels, circumplex discs, captions: :mod:`.opencv` draws and caches them) are packed into one
  buffer, uploaded once, and laid over the frames by one gather, blend and scatter per layer (sprites
  that overlap go to separate layers, so the later one is on top, as when drawn one by one);
- *marks* (boxes' sides, trails, landmarks and dots) go up as rectangles, segments and dot centres, the
  device turns them into pixels, and one scatter sets them (the later mark on top where they overlap);
- the panel's crops are one ``grid_sample`` from the frames.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..results import CROP_SIZE, FaceResult
from .opencv import (banner_sprite, circumplex_xy, disc_points, disc_sprite, face_marks, lay, no_face, text_origin,
                     text_sprite)

LANDMARK_COLOR = (0, 255, 255)
PANEL_GREY = 24
TRAIL = 30  # valence/arousal points a face's trail keeps

# RGB -> Y'CbCr, BT.601 limited range (what players assume for yuv420p video without other colour tags).
_RGB_TO_YUV = torch.tensor([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])
_YUV_SCALE = torch.tensor([219.0, 224.0, 224.0]) / 255.0
_YUV_OFFSET = torch.tensor([16.0, 128.0, 128.0])

Color = tuple[int, int, int]


def panel_width(height: int) -> int:
    """Width of the side panel beside a frame of this height."""
    return max(200, height // 2)


def _panel_layout(height: int) -> tuple[int, int, int, tuple[int, int]]:
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
class _Marks:
    """What one chunk lays over its frames, gathered on the host as primitives; the device turns them into
    pixels (this runs for every frame: the host's work per mark stays small).

    Drawing order: sprites, then filled rectangles (boxes' sides), lines (trails) and dots (landmarks,
    valence/arousal points), each over the ones before.
    """

    sprites: list = field(default_factory=list)  # (frame, x, y, rgba, (r0, r1, c0, c1), kept)
    rects: list = field(default_factory=list)    # (frame, x0, y0, x1, y1, colour, clip)
    lines: list = field(default_factory=list)    # (frame, points (N, 2), colour per segment (N - 1, 3), clip)
    dots: list = field(default_factory=list)     # (frame, centres (K, 2), radius, colour, clip)

    def sprite(self, b: int, rgba: np.ndarray, x: int, y: int, clip: tuple[int, int, int, int],
               kept: bool = False) -> None:
        """``rgba`` with its corner at ``(x, y)``, the part inside ``clip`` = (x0, y0, x1, y1); ``kept``: the
        same array comes again and again (a cached sprite), so the device keeps a copy of it."""
        h, w = rgba.shape[:2]
        x0, y0, x1, y1 = max(x, clip[0]), max(y, clip[1]), min(x + w, clip[2]), min(y + h, clip[3])
        if x1 > x0 and y1 > y0:
            self.sprites.append((b, x0, y0, rgba, (y0 - y, y1 - y, x0 - x, x1 - x), kept))


def _rect_table(rects: list) -> Optional[np.ndarray]:
    """``(R, 8)`` int64: frame, x0, y0, width, pixels, R, G, B of each rectangle cut to its clip."""
    if not rects:
        return None
    table = np.array([r[:5] for r in rects], np.int64)
    clip = np.array([r[6] for r in rects], np.int64)
    x0, y0 = np.maximum(table[:, 1], clip[:, 0]), np.maximum(table[:, 2], clip[:, 1])
    w = np.maximum(np.minimum(table[:, 3], clip[:, 2]) - x0, 0)
    h = np.maximum(np.minimum(table[:, 4], clip[:, 3]) - y0, 0)
    return np.column_stack([table[:, 0], x0, y0, w, w * h, np.array([r[5] for r in rects], np.int64)])


def _segment_table(lines: list) -> Optional[np.ndarray]:
    """``(S, 12)`` float64: start x, y, step x, y, pixels, frame, clip x0, y0, x1, y1, and the packed colour
    of each segment (a pixel per step along its longer axis)."""
    lines = [(frame, np.asarray(points, np.float64), colors, clip) for frame, points, colors, clip in lines
             if len(points) >= 2]
    if not lines:
        return None
    # All lines at once (this runs for every drawn frame): a segment from each point but its line's last.
    points = np.concatenate([points for _, points, _, _ in lines])
    counts = np.array([len(points) - 1 for _, points, _, _ in lines])
    first = np.ones(len(points), bool)
    first[np.cumsum(counts + 1) - 1] = False
    start = points[:-1][first[:-1]]
    step = np.diff(points, axis=0)[first[:-1]]
    packed = (np.concatenate([np.asarray(colors, np.int64) for _, _, colors, _ in lines]) * [65536, 256, 1]).sum(1)
    frames = np.repeat(np.array([frame for frame, _, _, _ in lines], np.float64), counts)
    clips = np.repeat(np.array([clip for _, _, _, clip in lines], np.float64), counts, axis=0)
    return np.column_stack([start, step, np.abs(step).max(1) + 1, frames, clips, packed])


def _dot_tables(dots: list) -> dict[int, np.ndarray]:
    """Per radius, ``(K, 8)`` int64: centre x, y, frame, clip x0, y0, x1, y1 and the packed colour."""
    groups: dict[int, tuple[list, list, list]] = {}  # radius -> centres, per-group (frame, clip, colour), counts
    for frame, centres, radius, color, clip in dots:
        centres = np.asarray(centres, np.float64).reshape(-1, 2)
        group = groups.setdefault(int(radius), ([], [], []))
        group[0].append(centres)
        group[2].append(len(centres))
        r, g, b = (int(c) for c in color)
        group[1].append((frame, *clip, r * 65536 + g * 256 + b))
    tables = {}
    for radius, (centres, meta, counts) in groups.items():
        # One conversion per radius, not per mark: this runs for every frame drawn.
        xy = np.rint(np.concatenate(centres)).astype(np.int64)
        tables[radius] = np.hstack([xy, np.repeat(np.array(meta, np.int64), counts, axis=0)])
    return tables


def _box_sides(box: tuple[int, int, int, int], thickness: int) -> list[tuple[int, int, int, int]]:
    """The four filled rectangles (x0, y0, x1, y1; ends excluded) of a box's outline ``thickness`` wide,
    centred on its edges."""
    x1, y1, x2, y2 = box
    lo, hi = (thickness - 1) // 2, thickness // 2 + 1
    return [(x1 - lo, y1 - lo, x2 + hi, y1 + hi), (x1 - lo, y2 - lo, x2 + hi, y2 + hi),
            (x1 - lo, y1 - lo, x1 + hi, y2 + hi), (x2 - lo, y1 - lo, x2 + hi, y2 + hi)]


def _scaled(face: FaceResult, sx: float, sy: float) -> FaceResult:
    """A copy of a FaceResult in a frame resized by ``(sx, sy)``."""
    scale = np.array([sx, sy])
    matrix = np.asarray(face.matrix, np.float64) @ np.diag([1 / sx, 1 / sy, 1.0])
    return replace(face, box=np.asarray(face.box) * np.tile(scale, 2), landmarks=face.landmarks * scale,
                   matrix=matrix)


def _layers(sprites: list) -> list[int]:
    """For each sprite, its layer: after every earlier sprite it overlaps on the same frame."""
    layers: list[int] = []
    placed: dict[int, list[tuple[int, int, int, int, int]]] = {}  # frame -> (x0, y0, x1, y1, layer)
    for b, x, y, _, (r0, r1, c0, c1), _ in sprites:
        x1, y1 = x + c1 - c0, y + r1 - r0
        layer = max((lj + 1 for xa, ya, xb, yb, lj in placed.get(b, ()) if x < xb and xa < x1 and y < yb and ya < y1),
                    default=0)
        placed.setdefault(b, []).append((x, y, x1, y1, layer))
        layers.append(layer)
    return layers


class VideoCanvas:
    """``draw(images, faces, colors)``: a chunk of annotated frames as I420, on the images' device.

    The first chunk's frame size is the video's: a frame of another size is resized to it (and its faces
    with it), and ``resized`` is set.
    """

    def __init__(self, class_names: Sequence[str], banner: Optional[str] = None,
                 device: torch.device = torch.device("cpu")) -> None:
        self.class_names = list(class_names)
        self.banner = banner
        self.device = torch.device(device)
        self.shape: Optional[tuple[int, int]] = None  # (H, W) of the video's frames
        self.resized = False
        self._canvas: Optional[torch.Tensor] = None
        self._background: Optional[torch.Tensor] = None
        self._banner: Optional[torch.Tensor] = None
        self._grid: Optional[torch.Tensor] = None
        self._sprites: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # cached sprites' device copies
        self._last: Optional[torch.Tensor] = None  # scratch: the last mark at each pixel
        self._dots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._storage: Optional[torch.Tensor] = None
        self._yuv = (_RGB_TO_YUV * _YUV_SCALE[:, None]).T.to(self.device)
        self._offset = _YUV_OFFSET.to(self.device)
        # Page-locked staging for a chunk's uploads, two in turn: a fresh page-locked copy per upload
        # (pin_memory) cost more host time than the copy itself.
        self._staging: list[Optional[torch.Tensor]] = [None, None]
        self._staged_done: list[Optional["torch.cuda.Event"]] = [None, None]
        self._turn = 0
        self._staged = 0   # bytes of this chunk's uploads so far
        self._wanted = 0   # bytes a chunk's uploads have needed

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` of the frames drawn (after the first chunk)."""
        return coded_size(*self.shape)

    def _start(self, h: int, w: int) -> None:
        self.shape = (h, w)
        width, _, radius, center = _panel_layout(h)
        panel = np.full((h, width, 3), PANEL_GREY, np.uint8)
        lay(panel, disc_sprite(radius), center[0] - radius - 1, center[1] - radius - 1)
        self._background = torch.from_numpy(panel).to(self.device)
        if self.banner:
            self._banner = torch.from_numpy(banner_sprite(self.banner, w)).to(self.device)

    def draw(self, images: Sequence[torch.Tensor], faces: Sequence[Sequence[tuple[FaceResult, Sequence]]],
             colors: Sequence[Sequence[Color]]) -> torch.Tensor:
        """``images``: (H, W, 3) uint8 RGB tensors on the canvas's device; ``faces``: per image, its faces,
        each with its valence/arousal trail (oldest first); ``colors``: per image, a colour per face (the
        face's mark on the panel). Returns ``(len(images), width * height * 3 // 2)`` uint8, I420 planes."""
        if self.shape is None:
            self._start(*images[0].shape[:2])
        h, w = self.shape
        images, faces = list(images), [list(f) for f in faces]
        for b, image in enumerate(images):
            if tuple(image.shape[:2]) != (h, w):  # the source changed size: results follow the pixels
                sx, sy = w / image.shape[1], h / image.shape[0]
                chw = image.permute(2, 0, 1)[None].float()
                images[b] = F.interpolate(chw, (h, w), mode="bilinear", antialias=True,
                                          align_corners=False)[0].round().clamp(0, 255).byte().permute(1, 2, 0)
                faces[b] = [(_scaled(f, sx, sy), trail) for f, trail in faces[b]]
                self.resized = True
        self._begin_uploads()
        canvas = self._frames(images)
        self._crops(canvas, images, faces)
        marks = self._marks(faces, colors)
        self._lay_sprites(canvas, marks.sprites)
        self._set_points(canvas, marks)
        if self._banner is not None:
            self._lay(canvas[:, :self._banner.shape[0], :w], self._banner)
        self._end_uploads()
        return self._i420(canvas)

    # -- the frames and the panel's background ---------------------------------------------------
    def _frames(self, images: list[torch.Tensor]) -> torch.Tensor:
        h, w = self.shape
        width, height = self.size
        if self._canvas is None or self._canvas.shape[0] != len(images):
            # Zeros once: the rounding to even sides stays black. Reused by the next chunk, which the
            # stream orders after this one's conversion. One spare pixel past the frames (see _flat).
            self._storage = torch.zeros(len(images) * height * width * 3 + 3, dtype=torch.uint8, device=self.device)
            self._canvas = self._storage[:-3].view(len(images), height, width, 3)
        canvas = self._canvas
        canvas[:, :h, :w] = torch.stack(images) if len(images) > 1 else images[0]  # two copies, not one per frame
        canvas[:, :h, w:w + self._background.shape[1]] = self._background
        return canvas

    def _crops(self, canvas: torch.Tensor, images: list[torch.Tensor], faces: list) -> None:
        """Each frame's main face (the widest), cut to the panel's crop square by one ``grid_sample``."""
        h, w = self.shape
        _, side, _, _ = _panel_layout(h)
        x0 = w + (panel_width(h) - side) // 2
        which = [b for b, fs in enumerate(faces) if fs]
        if not which:
            return
        inverse = []
        for b in which:
            face = max((f for f, _ in faces[b]), key=lambda f: f.box[2] - f.box[0])
            m = np.vstack([np.asarray(face.matrix, np.float64) * (side / CROP_SIZE), [0, 0, 1]])
            # Crop pixel centres (u, v, 1) -> image pixels -> grid_sample's [-1, 1] (align_corners=False).
            to_grid = np.array([[2 / w, 0, 1 / w - 1], [0, 2 / h, 1 / h - 1], [0, 0, 1]])
            inverse.append((to_grid @ np.linalg.inv(m))[:2])
        grid = torch.einsum("nij,uvj->nuvi", self._upload(np.stack(inverse).astype(np.float32)), self._pixels(side))
        source = torch.stack([images[b] for b in which]).permute(0, 3, 1, 2).float()
        crops = F.grid_sample(source, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        crops = crops.round_().clamp_(0, 255).byte().permute(0, 2, 3, 1)
        if len(which) == len(images):
            canvas[:, :side, x0:x0 + side] = crops
        else:
            canvas[self._upload(np.array(which)), :side, x0:x0 + side] = crops

    def _pixels(self, side: int) -> torch.Tensor:
        """``(side, side, 3)``: each crop pixel's ``(u, v, 1)``, kept on the device."""
        if self._grid is None or self._grid.shape[0] != side:
            axis = torch.arange(side, dtype=torch.float32)
            self._grid = torch.stack(torch.broadcast_tensors(axis[None, :], axis[:, None], torch.ones(1)), -1).to(self.device)
        return self._grid

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device, without waiting: through page-locked memory (a copy from pageable
        memory would first wait for everything queued on the GPU)."""
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type != "cuda":
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        at, self._staged = self._staged, self._staged + -(-nbytes // 16) * 16  # aligned for any dtype
        buffer = self._staging[self._turn]
        if buffer is None or self._staged > buffer.numel():  # a larger buffer from the next chunk on
            self._wanted = max(self._wanted, self._staged)
            return tensor.pin_memory().to(self.device, non_blocking=True)
        part = buffer[at:at + nbytes].view(tensor.dtype).view(tensor.shape)
        part.copy_(tensor)
        return part.to(self.device, non_blocking=True)

    def _begin_uploads(self) -> None:
        """Take the staging buffer used two chunks ago (its copies have long run) for this chunk's uploads."""
        if self.device.type != "cuda":
            return
        self._turn ^= 1
        if self._staged_done[self._turn] is not None:
            self._staged_done[self._turn].synchronize()
        buffer = self._staging[self._turn]
        if self._wanted > (buffer.numel() if buffer is not None else 0):
            self._staging[self._turn] = torch.empty(self._wanted * 3 // 2, dtype=torch.uint8, pin_memory=True)
        self._staged = 0

    def _end_uploads(self) -> None:
        if self.device.type == "cuda":
            self._staged_done[self._turn] = torch.cuda.Event()
            self._staged_done[self._turn].record()

    # -- what is laid over: sprites and points, gathered on the host ---------------------------------
    def _marks(self, faces: list, colors: Sequence[Sequence[Color]]) -> _Marks:
        h, w = self.shape
        width, side, radius, center = _panel_layout(h)
        frame_clip, panel_clip = (0, 0, w, h), (w, 0, w + width, h)
        crop_x = w + (width - side) // 2
        crop_clip = (crop_x, 0, crop_x + side, side)
        disc = (w + center[0], center[1])
        marks = _Marks()
        for b, (pairs, palette) in enumerate(zip(faces, colors)):
            results = [f for f, _ in pairs]
            for face in results:
                m = face_marks(face, self.class_names, (h, w), label=f"#{face.face_id}")
                marks.rects += [(b, *edge, m.color, frame_clip) for edge in _box_sides(m.box, m.thickness)]
                marks.sprite(b, m.label, *m.label_at, frame_clip)
                marks.dots.append((b, face.landmarks, m.landmark_radius, LANDMARK_COLOR, frame_clip))
                cx, cy = m.disc_center
                marks.sprite(b, disc_sprite(m.disc_radius), cx - m.disc_radius - 1, cy - m.disc_radius - 1, frame_clip,
                             kept=True)
                marks.dots.append((b, circumplex_xy(m.disc_center, m.disc_radius, [face.valence, face.arousal]),
                                   m.dot_radius, m.color, frame_clip))
            if not results:
                marks.sprite(b, *no_face(h), frame_clip, kept=True)
            # The panel: the main face's crop (cut on the device), its landmarks and caption; every face's
            # trail and point on the circumplex.
            caption = "no face"
            if results:
                face = max(results, key=lambda f: f.box[2] - f.box[0])
                matrix = np.asarray(face.matrix, np.float64) * (side / CROP_SIZE)
                crop_lm = face.landmarks @ matrix[:, :2].T + matrix[:, 2] + [crop_x, 0]
                marks.dots.append((b, crop_lm, 2, LANDMARK_COLOR, crop_clip))
                caption = (f"#{face.face_id} {self.class_names[face.expression]} "
                           f"{face.probabilities[face.expression]:.2f}")
            marks.sprite(b, text_sprite(caption, 0.5, (255, 255, 255)), w + 8, side + 22 - text_origin(caption, 0.5),
                         panel_clip, kept=not results)
            for (face, trail), color in zip(pairs, palette):
                if len(trail) > 1:
                    shade = 0.3 + 0.7 * np.arange(1, len(trail)) / len(trail)  # older: darker
                    marks.lines.append((b, circumplex_xy(disc, radius, trail),
                                        (np.asarray(color) * shade[:, None]).astype(np.uint8), panel_clip))
                marks.dots.append((b, circumplex_xy(disc, radius, [face.valence, face.arousal]), max(2, radius // 12),
                                   color, panel_clip))
        return marks

    @staticmethod
    def _lay(region: torch.Tensor, rgba: torch.Tensor) -> None:
        """Lay premultiplied RGBA over ``region`` (same leading shape, or broadcast), in place."""
        alpha = rgba[..., 3:].to(torch.int32)
        region.copy_(((region.to(torch.int32) * (255 - alpha) + 127) // 255 + rgba[..., :3]).clamp_(0, 255))

    def _kept(self, rgba: np.ndarray) -> torch.Tensor:
        """The device's copy of a cached sprite (the array is kept alive with it, so its id stays its own)."""
        entry = self._sprites.get(id(rgba))
        if entry is None:
            entry = self._sprites[id(rgba)] = (rgba, torch.from_numpy(np.array(rgba)).to(self.device))
        return entry[1]

    def _lay_sprites(self, canvas: torch.Tensor, sprites: list) -> None:
        if not sprites:
            return
        layers = _layers(sprites)
        order = sorted(range(len(sprites)), key=lambda i: layers[i])  # stable: drawing order within a layer
        parts = [sprites[i] for i in order]
        counts = np.array([(r1 - r0) * (c1 - c0) for _, _, _, _, (r0, r1, c0, c1), _ in parts])
        starts = np.cumsum(counts) - counts
        # The sprites' pixels in drawing order: those drawn for this chunk uploaded in one copy, the
        # cached ones (discs) cut from the device's copies.
        fresh = [p[3][r0:r1, c0:c1].reshape(-1, 4) for p in parts if not p[5] for r0, r1, c0, c1 in [p[4]]]
        uploaded = self._upload(np.concatenate(fresh)) if fresh else None
        pieces, at = [], 0
        for _, _, _, rgba, (r0, r1, c0, c1), kept in parts:
            if kept:
                pieces.append(self._kept(rgba)[r0:r1, c0:c1].reshape(-1, 4))
            else:
                n = (r1 - r0) * (c1 - c0)
                pieces.append(uploaded[at:at + n])
                at += n
        data = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        meta = np.array([(p[0], p[1], p[2], p[4][3] - p[4][2], start, n) for p, start, n in zip(parts, starts, counts)],
                        np.int64)
        meta_t = self._upload(meta)
        total = int(counts.sum())
        # Each pixel's sprite, then its place on the canvas (flat index over frames, rows and columns).
        owner = torch.repeat_interleave(torch.arange(len(parts), device=self.device), meta_t[:, 5], output_size=total)
        b, x, y, wd, start, _ = meta_t[owner].unbind(1)
        local = torch.arange(total, device=self.device) - start
        ly = torch.div(local, wd, rounding_mode="floor")
        _, height, width, _ = canvas.shape
        index = (b * height + y + ly) * width + x + (local - ly * wd)
        flat = canvas.view(-1, 3)
        # One gather, blend and scatter per layer: within a layer no two sprites share a pixel.
        sizes = np.bincount(np.asarray(layers)[order], weights=counts).astype(np.int64)
        edges = np.concatenate([[0], np.cumsum(sizes)])
        for lo, hi in zip(edges[:-1], edges[1:]):
            idx = index[lo:hi]
            under = flat[idx]
            self._lay(under, data[lo:hi])
            flat[idx] = under

    def _set_points(self, canvas: torch.Tensor, marks: _Marks) -> None:
        """Rectangles, lines and dots turned into pixels on the device, then set in one scatter."""
        n, height, width, _ = canvas.shape
        dev = self.device
        index, packed = [], []

        def place(b, x, y, clip=None):
            flat = (b * height + y) * width + x
            if clip is None:
                return flat
            inside = (x >= clip[:, 0]) & (x < clip[:, 2]) & (y >= clip[:, 1]) & (y < clip[:, 3])
            return torch.where(inside, flat, n * height * width)  # outside: the spare pixel past the frames

        rects = _rect_table(marks.rects)
        if rects is not None and rects[:, 4].sum() > 0:
            t = self._upload(rects)
            t = torch.cat([t, torch.cumsum(t[:, 4:5], 0) - t[:, 4:5]], 1)  # + where each one's pixels start
            owner = torch.repeat_interleave(torch.arange(len(t), device=dev), t[:, 4], output_size=int(rects[:, 4].sum()))
            b, x0, y0, w, _, r, g, bl, start = t[owner].unbind(1)
            local = torch.arange(len(owner), device=dev) - start
            index.append(place(b, x0 + local % w, y0 + torch.div(local, w, rounding_mode="floor")))
            packed.append(r * 65536 + g * 256 + bl)
        segments = _segment_table(marks.lines)
        if segments is not None:
            counts = segments[:, 4].astype(np.int64)
            t = self._upload(segments)
            seg = torch.repeat_interleave(torch.arange(len(t), device=dev), self._upload(counts),
                                          output_size=int(counts.sum()))
            rows = torch.cat([t, torch.cumsum(t[:, 4:5], 0) - t[:, 4:5]], 1)[seg]  # + where each one's pixels start
            along = (torch.arange(len(seg), device=dev, dtype=t.dtype) - rows[:, 11]) / (rows[:, 4] - 1).clamp_(min=1)
            xy = torch.round(rows[:, 0:2] + rows[:, 2:4] * along[:, None]).long()
            index.append(place(rows[:, 5].long(), xy[:, 0], xy[:, 1], rows[:, 6:10]))
            packed.append(rows[:, 10].long())
        for radius, table in sorted(_dot_tables(marks.dots).items()):
            t = self._upload(table)
            dx, dy = self._offsets(radius)
            x, y = (t[:, 0:1] + dx).reshape(-1), (t[:, 1:2] + dy).reshape(-1)
            k = len(dx)
            index.append(place(t[:, 2].repeat_interleave(k), x, y, t[:, 3:7].repeat_interleave(k, 0)))
            packed.append(t[:, 7].repeat_interleave(k))
        if not index:
            return
        index, packed = torch.cat(index), torch.cat(packed)
        # Where marks overlap, the later one is on top: every write to a pixel carries the colour of the
        # last mark there (found by a max over mark numbers), so the scatter's order cannot matter.
        if self._last is None or self._last.numel() < n * height * width + 1:
            self._last = torch.empty(n * height * width + 1, dtype=torch.int64, device=dev)
        order = torch.arange(len(index), device=dev)
        self._last.index_fill_(0, index, -1)
        self._last.scatter_reduce_(0, index, order, reduce="amax")
        winner = packed[self._last[index]]
        rgb = torch.stack([winner // 65536, winner // 256 % 256, winner % 256], 1).to(torch.uint8)
        self._flat(canvas)[index] = rgb

    def _offsets(self, radius: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A dot's pixel offsets from its centre, on the device."""
        if radius not in self._dots:
            xs, ys = disc_points(np.zeros((1, 2)), radius)
            self._dots[radius] = (torch.from_numpy(xs).to(self.device), torch.from_numpy(ys).to(self.device))
        return self._dots[radius]

    def _flat(self, canvas: torch.Tensor) -> torch.Tensor:
        """The canvas as ``(pixels + 1, 3)``: the last, spare pixel takes the marks that fall outside."""
        return self._storage.view(-1, 3)[:canvas.shape[0] * canvas.shape[1] * canvas.shape[2] + 1]

    # -- to the encoder's pixel format ---------------------------------------------------------------
    def _i420(self, canvas: torch.Tensor) -> torch.Tensor:
        n, height, width, _ = canvas.shape
        out = torch.empty((n, height * width * 3 // 2), dtype=torch.uint8, device=self.device)
        # In float, 12 bytes a pixel: a few frames at a time on the CPU, whose memory is scarcer.
        step = n if self.device.type == "cuda" else 4
        for lo in range(0, n, step):
            self._i420_into(canvas[lo:lo + step], out[lo:lo + step])
        return out

    def _i420_into(self, canvas: torch.Tensor, out: torch.Tensor) -> None:
        n, height, width, _ = canvas.shape
        rgb = canvas.float()
        # Weighted sums, not matrix products: those may run in TF32, a level off here and there.
        luma = (rgb * self._yuv[:, 0]).sum(-1) + self._offset[0]
        out[:, :height * width].view(n, height, width).copy_(luma.round_().clamp_(0, 255))
        # Chroma from each 2x2 block's mean colour.
        mean = rgb.view(n, height // 2, 2, width // 2, 2, 3).mean((2, 4))
        chroma = ((mean[..., None] * self._yuv[:, 1:]).sum(-2) + self._offset[1:]).round_().clamp_(0, 255)
        quarter = height * width // 4
        out[:, height * width:height * width + quarter].view(n, height // 2, width // 2).copy_(chroma[..., 0])
        out[:, height * width + quarter:].view(n, height // 2, width // 2).copy_(chroma[..., 1])
