"""The annotated video's frames, drawn with torch where the frames already are (the GPU, when there is one).

Each frame becomes the frame with its faces marked and a side panel beside it (the main face's crop, a
caption, and every face's valence/arousal point with its trail on a circumplex), then I420 (yuv420p,
BT.601 limited range), which is what the H.264 encoder takes: only 1.5 bytes a pixel go back to the
host. A chunk of frames is drawn at once, in a fixed number of tensor operations whatever it holds:

- *sprites* (labels, circumplex discs, captions: :mod:`.opencv` draws and caches them) are packed into one
  buffer, uploaded once, and laid over the frames by one gather, blend and scatter per layer (sprites
  that overlap go to separate layers, so the later one is on top, as when drawn one by one);
- *points* (boxes, landmarks, trails and dots) are one scatter of pixels and colours;
- the panel's crops are one ``grid_sample`` from the frames.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..results import CROP_SIZE, FaceResult
from .opencv import (banner_sprite, circumplex_xy, disc_points, disc_sprite, face_marks, lay, text_origin,
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
    """What one chunk lays over its frames, gathered on the host."""

    sprites: list = field(default_factory=list)  # (frame, x, y, rgba) already clipped to where it may go
    points: list = field(default_factory=list)   # (frame, xs, ys, colour): pixels set to a colour

    def sprite(self, b: int, rgba: np.ndarray, x: int, y: int, clip: tuple[int, int, int, int]) -> None:
        """``rgba`` with its corner at ``(x, y)``, the part inside ``clip`` = (x0, y0, x1, y1)."""
        h, w = rgba.shape[:2]
        x0, y0, x1, y1 = max(x, clip[0]), max(y, clip[1]), min(x + w, clip[2]), min(y + h, clip[3])
        if x1 > x0 and y1 > y0:
            self.sprites.append((b, x0, y0, rgba[y0 - y:y1 - y, x0 - x:x1 - x]))

    def pixels(self, b: int, xs: np.ndarray, ys: np.ndarray, color, clip: tuple[int, int, int, int]) -> None:
        """Pixels ``(xs, ys)`` set to ``color`` (one, or one per pixel), those inside ``clip``."""
        keep = (xs >= clip[0]) & (xs < clip[2]) & (ys >= clip[1]) & (ys < clip[3])
        if keep.any():
            colors = np.broadcast_to(np.asarray(color, np.uint8), (len(xs), 3))
            self.points.append((b, xs[keep], ys[keep], colors[keep]))


def _rectangle(box: tuple[int, int, int, int], thickness: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixels of a rectangle's outline ``thickness`` wide, centred on the box's edges."""
    x1, y1, x2, y2 = box
    lo, hi = (thickness - 1) // 2, thickness // 2
    rows = np.arange(-lo, hi + 1)
    xs_h = np.arange(x1 - lo, x2 + hi + 1)
    ys_v = np.arange(y1 - lo, y2 + hi + 1)
    xs = [np.tile(xs_h, 2 * len(rows)), np.repeat(np.concatenate([x1 + rows, x2 + rows]), len(ys_v))]
    ys = [np.repeat(np.concatenate([y1 + rows, y2 + rows]), len(xs_h)), np.tile(ys_v, 2 * len(rows))]
    return np.concatenate(xs), np.concatenate(ys)


def _polyline(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixels along consecutive ``points`` (N, 2), and for each the index of the segment it is on."""
    xs, ys, seg = [], [], []
    for i in range(1, len(points)):
        (ax, ay), (bx, by) = points[i - 1], points[i]
        n = int(max(abs(bx - ax), abs(by - ay))) + 1
        t = np.linspace(0.0, 1.0, n)
        xs.append(np.rint(ax + (bx - ax) * t).astype(np.int64))
        ys.append(np.rint(ay + (by - ay) * t).astype(np.int64))
        seg.append(np.full(n, i))
    if not xs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(seg)


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
    for b, x, y, rgba in sprites:
        x1, y1 = x + rgba.shape[1], y + rgba.shape[0]
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
        self._yuv = (_RGB_TO_YUV * _YUV_SCALE[:, None]).T.to(self.device)
        self._offset = _YUV_OFFSET.to(self.device)

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
        canvas = self._frames(images)
        self._crops(canvas, images, faces)
        marks = self._marks(faces, colors)
        self._lay_sprites(canvas, marks.sprites)
        self._set_points(canvas, marks.points)
        if self._banner is not None:
            self._lay(canvas[:, :self._banner.shape[0], :w], self._banner)
        return self._i420(canvas)

    # -- the frames and the panel's background ---------------------------------------------------
    def _frames(self, images: list[torch.Tensor]) -> torch.Tensor:
        h, w = self.shape
        width, height = self.size
        if self._canvas is None or self._canvas.shape[0] != len(images):
            # Zeros once: the rounding to even sides stays black. Reused by the next chunk, which the
            # stream orders after this one's conversion.
            self._canvas = torch.zeros((len(images), height, width, 3), dtype=torch.uint8, device=self.device)
        canvas = self._canvas
        for b, image in enumerate(images):
            canvas[b, :h, :w].copy_(image)
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
            inverse.append(np.linalg.inv(m)[:2])
        # Pixel centres (u, v) of the crop -> image pixels -> grid_sample's [-1, 1] (align_corners=False).
        inv = torch.as_tensor(np.stack(inverse), dtype=torch.float32).to(self.device, non_blocking=True)
        axis = torch.arange(side, device=self.device, dtype=torch.float32)
        uv1 = torch.stack(torch.broadcast_tensors(axis[None, :], axis[:, None], torch.ones(1, device=self.device)), -1)
        xy = torch.einsum("nij,uvj->nuvi", inv, uv1)
        grid = (xy + 0.5) / torch.tensor([w, h], device=self.device, dtype=torch.float32) * 2 - 1
        source = torch.stack([images[b] for b in which]).permute(0, 3, 1, 2).float()
        crops = F.grid_sample(source, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        crops = crops.round_().clamp_(0, 255).byte().permute(0, 2, 3, 1)
        for k, b in enumerate(which):
            canvas[b, :side, x0:x0 + side].copy_(crops[k])

    # -- what is laid over: sprites and points, gathered on the host ---------------------------------
    def _marks(self, faces: list, colors: Sequence[Sequence[Color]]) -> _Marks:
        h, w = self.shape
        width, side, radius, center = _panel_layout(h)
        frame_clip, panel_clip = (0, 0, w, h), (w, 0, w + width, h)
        marks = _Marks()
        for b, (pairs, palette) in enumerate(zip(faces, colors)):
            results = [f for f, _ in pairs]
            for face in results:
                m = face_marks(face, self.class_names, (h, w), label=f"#{face.face_id}")
                marks.pixels(b, *_rectangle(m.box, m.thickness), m.color, frame_clip)
                marks.sprite(b, m.label, *m.label_at, frame_clip)
                marks.pixels(b, *disc_points(face.landmarks, m.landmark_radius), LANDMARK_COLOR, frame_clip)
                cx, cy = m.disc_center
                marks.sprite(b, disc_sprite(m.disc_radius), cx - m.disc_radius - 1, cy - m.disc_radius - 1, frame_clip)
                dot = circumplex_xy(m.disc_center, m.disc_radius, [face.valence, face.arousal])
                marks.pixels(b, *disc_points(dot, m.dot_radius), m.color, frame_clip)
            if not results:
                text = "no face found"
                marks.sprite(b, text_sprite(text, 0.7, (255, 80, 80), 2), 10, h - 12 - text_origin(text, 0.7, 2),
                             frame_clip)
            # The panel: the main face's crop (cut on the device), its landmarks and caption; every face's
            # trail and point on the circumplex.
            caption = "no face"
            if results:
                face = max(results, key=lambda f: f.box[2] - f.box[0])
                matrix = np.asarray(face.matrix, np.float64) * (side / CROP_SIZE)
                crop_lm = face.landmarks @ matrix[:, :2].T + matrix[:, 2] + [w + (width - side) // 2, 0]
                crop_clip = (w + (width - side) // 2, 0, w + (width - side) // 2 + side, side)
                marks.pixels(b, *disc_points(crop_lm, 2), LANDMARK_COLOR, crop_clip)
                caption = (f"#{face.face_id} {self.class_names[face.expression]} "
                           f"{face.probabilities[face.expression]:.2f}")
            marks.sprite(b, text_sprite(caption, 0.5, (255, 255, 255)), w + 8, side + 22 - text_origin(caption, 0.5),
                         panel_clip)
            disc = (w + center[0], center[1])
            for (face, trail), color in zip(pairs, palette):
                if trail:
                    xs, ys, seg = _polyline(circumplex_xy(disc, radius, trail))
                    shade = 0.3 + 0.7 * seg / len(trail)  # older: darker
                    marks.pixels(b, xs, ys, (np.asarray(color) * shade[:, None]).astype(np.uint8), panel_clip)
                point = circumplex_xy(disc, radius, [face.valence, face.arousal])
                marks.pixels(b, *disc_points(point, max(2, radius // 12)), color, panel_clip)
        return marks

    @staticmethod
    def _lay(region: torch.Tensor, rgba: torch.Tensor) -> None:
        """Lay premultiplied RGBA over ``region`` (same leading shape, or broadcast), in place."""
        alpha = rgba[..., 3:].to(torch.int32)
        region.copy_(((region.to(torch.int32) * (255 - alpha) + 127) // 255 + rgba[..., :3]).clamp_(0, 255))

    def _lay_sprites(self, canvas: torch.Tensor, sprites: list) -> None:
        if not sprites:
            return
        layers = _layers(sprites)
        order = sorted(range(len(sprites)), key=lambda i: layers[i])  # stable: drawing order within a layer
        parts = [sprites[i] for i in order]
        counts = np.array([p[3].shape[0] * p[3].shape[1] for p in parts])
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rgba = np.concatenate([np.ascontiguousarray(p[3]).reshape(-1, 4) for p in parts])
        meta = np.array([(p[0], p[1], p[2], p[3].shape[1]) for p in parts], np.int64)
        meta = np.concatenate([meta, starts[:, None]], 1)
        host = torch.from_numpy(rgba)
        if self.device.type == "cuda":
            host = host.pin_memory()
            meta_t = torch.from_numpy(meta).pin_memory()
        else:
            meta_t = torch.from_numpy(meta)
        data = host.to(self.device, non_blocking=True)
        meta_t = meta_t.to(self.device, non_blocking=True)
        total = int(counts.sum())
        # Each pixel's sprite, then its place on the canvas (flat index over frames, rows and columns).
        owner = torch.repeat_interleave(torch.arange(len(parts), device=self.device),
                                        torch.from_numpy(counts).to(self.device, non_blocking=True), output_size=total)
        b, x, y, wd, start = meta_t[owner].unbind(1)
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

    def _set_points(self, canvas: torch.Tensor, points: list) -> None:
        if not points:
            return
        _, height, width, _ = canvas.shape
        index = np.concatenate([(b * height + ys) * width + xs for b, xs, ys, _ in points])
        colors = np.concatenate([c for _, _, _, c in points])
        # Where marks overlap, the later one is on top: keep each pixel's last colour (a scatter with
        # repeated indices would keep any of them).
        last = len(index) - 1 - np.unique(index[::-1], return_index=True)[1]
        index, colors = torch.from_numpy(index[last]), torch.from_numpy(np.ascontiguousarray(colors[last]))
        if self.device.type == "cuda":
            index, colors = index.pin_memory(), colors.pin_memory()
        canvas.view(-1, 3)[index.to(self.device, non_blocking=True)] = colors.to(self.device, non_blocking=True)

    # -- to the encoder's pixel format ---------------------------------------------------------------
    def _i420(self, canvas: torch.Tensor) -> torch.Tensor:
        n, height, width, _ = canvas.shape
        rgb = canvas.float()
        out = torch.empty((n, height * width * 3 // 2), dtype=torch.uint8, device=self.device)
        luma = rgb @ self._yuv[:, 0] + self._offset[0]
        out[:, :height * width].view(n, height, width).copy_(luma.round_().clamp_(0, 255))
        # Chroma from each 2x2 block's mean colour.
        mean = rgb.view(n, height // 2, 2, width // 2, 2, 3).mean((2, 4))
        chroma = (mean @ self._yuv[:, 1:] + self._offset[1:]).round_().clamp_(0, 255)
        quarter = height * width // 4
        out[:, height * width:height * width + quarter].view(n, height // 2, width // 2).copy_(chroma[..., 0])
        out[:, height * width + quarter:].view(n, height // 2, width // 2).copy_(chroma[..., 1])
        return out
