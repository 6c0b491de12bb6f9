"""How a face is marked, and the marks drawn on photos with OpenCV and NumPy.

:func:`face_marks` places everything drawn for a face (box, label, landmarks, circumplex); the label, the
circumplex disc and captions are *sprites*: small premultiplied RGBA images drawn once with OpenCV (and
cached), then laid over the picture. Photos lay them with NumPy here; the video canvas
(:mod:`.canvas`) lays the same sprites and marks with torch, on the frames' device, so both look alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import cv2
import numpy as np

from ..results import FaceResult

# One colour per expression class (RGB), stable across images and videos.
PALETTE = [(200, 200, 200), (80, 220, 80), (70, 120, 255), (255, 210, 0), (190, 90, 255),
           (130, 170, 40), (255, 60, 60), (255, 140, 0)]
FONT = cv2.FONT_HERSHEY_SIMPLEX
LABEL_SHADE = 0.55  # how far a label's box darkens what is under it


def _color(index: int) -> tuple[int, int, int]:
    return PALETTE[index % len(PALETTE)]


# -- sprites: premultiplied RGBA, uint8 --------------------------------------------------------------

def _paint(rgba: np.ndarray, mask: np.ndarray, color, opacity: float = 1.0) -> None:
    """Lay ``color`` over the float RGBA image where the coverage ``mask`` (0-255) says, in place."""
    m = mask[..., None].astype(np.float32) * (opacity / 255)
    rgba[..., :3] = rgba[..., :3] * (1 - m) + np.asarray(color, np.float32) * m
    rgba[..., 3:] = rgba[..., 3:] * (1 - m) + 255 * m


def _text_mask(shape: tuple[int, int], text: str, org: tuple[int, int], scale: float, thickness: int) -> np.ndarray:
    mask = np.zeros(shape, np.uint8)
    cv2.putText(mask, text, (int(org[0]), int(org[1])), FONT, scale, 255, thickness, cv2.LINE_AA)
    return mask


def _finish(rgba: np.ndarray) -> np.ndarray:
    out = np.rint(np.clip(rgba, 0, 255)).astype(np.uint8)
    out.setflags(write=False)  # cached and shared: never drawn on
    return out


@lru_cache(maxsize=64)
def _coverage(color: tuple[int, int, int], under: int = 0) -> np.ndarray:
    """``(256, 4)``: premultiplied RGBA of ``color`` at each coverage 0-255, over a sprite alpha ``under``."""
    m = np.arange(256, dtype=np.float64)[:, None] / 255
    rgba = np.hstack([m * np.asarray(color, np.float64), under + (255 - under) * m])
    return np.rint(rgba).astype(np.uint8)


@lru_cache(maxsize=256)  # a label is tens of kB; most differ from frame to frame
def label_sprite(lines: tuple[tuple[str, tuple[int, int, int]], ...], scale: float, thickness: int) -> np.ndarray:
    """Lines of coloured text on a darkening box (a face's label).

    Made for every frame of a video (the readings change), so cheaply: the lines' coverage is drawn into
    one mask, and each line's band looked up into colour and alpha.
    """
    sizes = [cv2.getTextSize(t, FONT, scale, thickness)[0] for t, _ in lines]
    pad, gap = 4, int(8 * scale) + 2
    width = max(w for w, _ in sizes) + 2 * pad
    height = sum(h for _, h in sizes) + gap * (len(lines) - 1) + 2 * pad + int(6 * scale)
    mask = np.zeros((height, width), np.uint8)
    rgba = np.empty((height, width, 4), np.uint8)
    shade = int(round(255 * LABEL_SHADE))
    cy, top = pad, 0
    for i, ((text, color), (_, h)) in enumerate(zip(lines, sizes)):
        cy += h
        cv2.putText(mask, text, (pad, cy), FONT, scale, 255, thickness, cv2.LINE_AA)
        bottom = height if i == len(lines) - 1 else cy + gap // 2  # this line's band of rows
        np.take(_coverage(tuple(color), shade), mask[top:bottom], axis=0, out=rgba[top:bottom])
        cy += gap
        top = bottom
    rgba.setflags(write=False)  # cached and shared: never drawn on
    return rgba


@lru_cache(maxsize=256)
def text_sprite(text: str, scale: float, color: tuple[int, int, int], thickness: int = 1) -> np.ndarray:
    """Text with a dark shadow, readable on any background (ASCII only: Hershey fonts).

    A shadow at the same thickness, not a thicker outline: OpenCV 5's font widens glyphs with thickness.
    """
    (w, h), base = cv2.getTextSize(text, FONT, scale, thickness)
    shape = (h + base + thickness + 2, w + thickness + 2)
    shadow = _text_mask(shape, text, (1, h + 1), scale, thickness).astype(np.uint16)
    words = _text_mask(shape, text, (0, h), scale, thickness).astype(np.uint16)
    rgba = np.empty((*shape, 4), np.uint8)
    # The text over its shadow (premultiplied: the black shadow adds alpha only).
    rgba[..., :3] = (words[..., None] * np.asarray(color, np.uint16) + 127) // 255
    rgba[..., 3] = shadow + ((255 - shadow) * words + 127) // 255
    rgba.setflags(write=False)
    return rgba


def text_origin(text: str, scale: float, thickness: int = 1) -> int:
    """How far below a text sprite's top its baseline lies (where ``cv2.putText`` puts ``org``)."""
    return cv2.getTextSize(text, FONT, scale, thickness)[0][1]


@lru_cache(maxsize=128)  # every radius face_marks gives (18 to 90) and the panel's: faces change size
def disc_sprite(radius: int) -> np.ndarray:
    """The valence (x) / arousal (y, up) disc: darkened, outlined, with axes and their letters."""
    side = 2 * radius + 3
    c = radius + 1
    rgba = np.zeros((side, side, 4), np.float32)

    def shape(draw) -> np.ndarray:
        mask = np.zeros((side, side), np.uint8)
        draw(mask)
        return mask

    _paint(rgba, shape(lambda m: cv2.circle(m, (c, c), radius, 255, -1, cv2.LINE_AA)), (30, 30, 30), 0.6)
    _paint(rgba, shape(lambda m: cv2.circle(m, (c, c), radius, 255, 1, cv2.LINE_AA)), (220, 220, 220))
    _paint(rgba, shape(lambda m: cv2.line(m, (c - radius, c), (c + radius, c), 255, 1, cv2.LINE_AA)), (150, 150, 150))
    _paint(rgba, shape(lambda m: cv2.line(m, (c, c - radius), (c, c + radius), 255, 1, cv2.LINE_AA)), (150, 150, 150))
    fs = max(0.3, radius / 120)
    for letter, (x, y) in (("V", (c + radius - int(14 * fs / 0.4), c - 4)), ("A", (c + 4, c - radius + int(14 * fs / 0.4)))):
        for offset, color in ((1, (0, 0, 0)), (0, (220, 220, 220))):
            _paint(rgba, _text_mask((side, side), letter, (x + offset, y + offset), fs, 1), color)
    return _finish(rgba)


def lay(img: np.ndarray, sprite: np.ndarray, x: int, y: int) -> None:
    """Lay a sprite over ``img`` (RGB, uint8) with its top-left corner at ``(x, y)``, clipped, in place."""
    h, w = sprite.shape[:2]
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, img.shape[1]), min(y + h, img.shape[0])
    if x1 <= x0 or y1 <= y0:
        return
    part = sprite[y0 - y:y1 - y, x0 - x:x1 - x].astype(np.uint16)
    roi = img[y0:y1, x0:x1]
    roi[...] = (roi * (255 - part[..., 3:]) + 127) // 255 + part[..., :3]


# -- where a face's marks go ----------------------------------------------------------------------

@dataclass
class FaceMarks:
    """Everything drawn for one face, placed in its image."""

    color: tuple[int, int, int]
    box: tuple[int, int, int, int]       # x1, y1, x2, y2
    thickness: int                       # of the box's lines
    label: np.ndarray                    # the label sprite
    label_at: tuple[int, int]            # its top-left corner
    landmark_radius: int
    disc_center: tuple[int, int]         # the circumplex beside the box
    disc_radius: int

    @property
    def dot_radius(self) -> int:
        """Radius of the valence/arousal point on the disc."""
        return max(2, self.disc_radius // 12)


# Faces narrower than this get a one-line label in a small font (a classroom, a video-call gallery).
COMPACT_BELOW = 80


def face_marks(face: FaceResult, class_names: Sequence[str], shape: tuple[int, ...],
               label: Optional[str] = None) -> FaceMarks:
    """Where the box, the '<expression> <p>' and valence/arousal label, the landmarks and the circumplex of
    ``face`` go in an image of ``shape``, alone (:func:`place_faces` places several so they do not collide)."""
    return place_faces([face], class_names, shape, labels=[label])[0]


def _label(face: FaceResult, class_names: Sequence[str], size: int, thick: int, label: Optional[str]) -> np.ndarray:
    color = _color(face.expression)
    name, p = class_names[face.expression], face.probabilities[face.expression]
    prefix = f"{label} " if label else ""
    if size < COMPACT_BELOW:  # one short line: the class's first letters, valence and arousal
        return label_sprite(((f"{prefix}{name[:3]} V{face.valence:+.1f} A{face.arousal:+.1f}", color),), 0.4, 1)
    # Plain min/max, not np.clip: this runs for every face of every drawn frame.
    fs = round(min(max(size / 250, 0.5), 1.2), 2)  # rounded: sprites of nearby sizes are shared
    lines = ((f"{prefix}{name} {p:.2f}", color), (f"V {face.valence:+.2f}  A {face.arousal:+.2f}", (255, 255, 255)))
    return label_sprite(lines, fs, thick)


def _costs(candidates: list, width: int, height: int, area: tuple, avoid: list) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate corner (x, y) of a ``width`` x ``height`` mark moved inside ``area`` (x0, y0, x1, y1),
    ``(C, 2)``, and the area of ``avoid``'s rectangles (x0, y0, x1, y1) it covers, summed, ``(C,)``: all
    candidates against all rectangles at once (this runs for every face of every drawn frame)."""
    at = np.asarray(candidates, np.int64).reshape(-1, 2)
    x = np.minimum(np.maximum(at[:, 0], area[0]), max(area[0], area[2] - width))
    y = np.minimum(np.maximum(at[:, 1], area[1]), max(area[1], area[3] - height))
    at = np.column_stack([x, y])
    if not len(avoid):
        return at, np.zeros(len(at), np.int64)
    r = np.asarray(avoid, np.int64).reshape(-1, 4)
    w = np.minimum(x[:, None] + width, r[:, 2]) - np.maximum(x[:, None], r[:, 0])
    h = np.minimum(y[:, None] + height, r[:, 3]) - np.maximum(y[:, None], r[:, 1])
    return at, (np.maximum(w, 0) * np.maximum(h, 0)).sum(1)


def _best_with_cost(candidates: list, width: int, height: int, area: tuple, avoid: list) -> tuple[tuple[int, int], int]:
    """The first candidate corner (x, y) of a ``width`` x ``height`` mark, moved inside ``area`` (x0, y0, x1,
    y1), that covers nothing in ``avoid``; else the first that covers least; and the area it covers."""
    return _first_least(*_costs(candidates, width, height, area, avoid))


def _first_least(at: np.ndarray, cost: np.ndarray) -> tuple[tuple[int, int], int]:
    """The first corner of ``at`` ``(C, 2)`` whose ``cost`` is least, and that cost."""
    k = int(np.argmin(cost))
    return (int(at[k, 0]), int(at[k, 1])), int(cost[k])


def place_faces(faces: Sequence[FaceResult], class_names: Sequence[str], shape: tuple[int, ...], top: int = 0,
                labels: Optional[Sequence[Optional[str]]] = None) -> list[FaceMarks]:
    """Where every face's marks go in an image of ``shape``, so that no label or circumplex covers another
    face or another face's marks where there is room: each inside the image and below ``top`` (a banner's
    height). Larger faces are placed first; a face narrower than :data:`COMPACT_BELOW` gets a one-line label."""
    h, w = shape[:2]
    area = (0, min(top, max(0, h - 1)), w, h)
    boxes = [tuple(int(round(v)) for v in face.box) for face in faces]
    placed: list[Optional[FaceMarks]] = [None] * len(faces)
    taken: list[tuple] = []  # the labels and discs placed so far
    for i in sorted(range(len(faces)), key=lambda k: -(boxes[k][2] - boxes[k][0])):
        face, (x1, y1, x2, y2) = faces[i], boxes[i]
        others = [b for k, b in enumerate(boxes) if k != i]
        size = max(x2 - x1, y2 - y1, 1)
        thick = max(1, size // 120)
        sprite = _label(face, class_names, size, thick, labels[i] if labels is not None else None)
        lh, lw = sprite.shape[:2]
        # Its own landmarks, where they reach past the box (a chin, a turned head), are not covered either.
        points = np.asarray(face.landmarks, np.float64).reshape(-1, 2).astype(np.int64)
        own = np.concatenate([points, points + 1], 1)  # one-pixel rectangles
        # Above the box, below it, inside its top, then beside it; clear of the box's line (it is drawn
        # ``thick`` wide, centred on the box's edge).
        gap = thick // 2 + 2
        candidates = [(x1, y1 - lh - gap), (x1, y2 + gap), (x2 - lw, y1 - lh - gap), (x2 - lw, y2 + gap),
                      (x1 + gap, y1 + gap), (x2 + gap, y1), (x1 - lw - gap, y1)]
        # Other faces and marks first; then the fewest of its own landmarks.
        at, cost = _costs(candidates, lw, lh, area, others + taken)
        free = at[cost == 0]
        if len(free) and len(own):
            at, cost = _costs(free, lw, lh, area, own)
        (lx, ly), _ = _first_least(at, cost)
        taken.append((lx, ly, lx + lw, ly + lh))
        # Beside the box (right, then left), then below and above it; smaller where there is no room for it
        # clear of the face (a tight portrait), rather than over it.
        choices = []
        for radius in sorted({int(min(max(size * f, 18), 90)) for f in (0.25, 0.18, 0.12)}, reverse=True):
            d = 2 * radius + 3
            (dx, dy), cost = _best_with_cost([(x2 + 6, y1), (x1 - d - 6, y1), (x2 + 6, y2 - d), (x1 - d - 6, y2 - d),
                                              (x1, y2 + 6), (x1, y1 - d - 6)], d, d, area,
                                             others + taken + [(x1, y1, x2, y2)])
            choices.append((cost, -radius, dx, dy))
            if cost == 0:
                break
        _, radius, dx, dy = min(choices)
        radius = -radius
        d = 2 * radius + 3
        taken.append((dx, dy, dx + d, dy + d))
        placed[i] = FaceMarks(_color(face.expression), (x1, y1, x2, y2), thick, sprite, (lx, ly),
                              max(1, size // 100), (dx + radius + 1, dy + radius + 1), radius)
    return placed


def disc_points(points: np.ndarray, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """The pixels ``(xs, ys)`` of filled dots of ``radius`` around ``points`` (N, 2)."""
    r = int(radius)
    dy, dx = np.mgrid[-r:r + 1, -r:r + 1]
    disc = dx ** 2 + dy ** 2 <= r * r + r
    p = np.rint(np.asarray(points, np.float64).reshape(-1, 2)).astype(np.int64)
    return (p[:, 0, None] + dx[disc]).ravel(), (p[:, 1, None] + dy[disc]).ravel()


def circumplex_xy(center, radius, va) -> np.ndarray:
    """Pixel positions of valence/arousal pairs (N, 2) on a disc, or on one disc each (``center`` (N, 2),
    ``radius`` (N,)): valence right, arousal up."""
    radius = np.asarray(radius)[..., None]
    scale = np.concatenate(np.broadcast_arrays(radius, -radius), -1)
    return (np.asarray(va, np.float64).reshape(-1, 2).clip(-1, 1) * scale + center).round().astype(np.int64)


def _draw_points(img: np.ndarray, points: np.ndarray, radius: int, color=(0, 255, 255)) -> None:
    """Filled dots, set in one vectorised write (68 anti-aliased circles a frame cost more than the rest)."""
    xs, ys = disc_points(points, radius)
    inside = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    img[ys[inside], xs[inside]] = color


def draw_circumplex(img: np.ndarray, center: tuple[int, int], radius: int, valence: float, arousal: float,
                    color=(255, 255, 255)) -> None:
    """A valence (x) / arousal (y, up) disc with the current point."""
    lay(img, disc_sprite(radius), center[0] - radius - 1, center[1] - radius - 1)
    point = tuple(int(v) for v in circumplex_xy(center, radius, [valence, arousal])[0])
    cv2.circle(img, point, max(2, radius // 12), color, -1, cv2.LINE_AA)


def draw_face(img: np.ndarray, face: FaceResult, class_names: Sequence[str], label: Optional[str] = None,
              landmarks: bool = True) -> None:
    """Box, '<expression> <p>' label, valence/arousal line, landmarks and a circumplex beside the box."""
    draw_marks(img, face, face_marks(face, class_names, img.shape, label), landmarks)


def draw_marks(img: np.ndarray, face: FaceResult, marks: FaceMarks, landmarks: bool = True) -> None:
    """Draw a face's placed marks (:func:`place_faces`) on ``img``, in place."""
    x1, y1, x2, y2 = marks.box
    cv2.rectangle(img, (x1, y1), (x2, y2), marks.color, marks.thickness, cv2.LINE_AA)
    lay(img, marks.label, *marks.label_at)
    if landmarks:
        _draw_points(img, face.landmarks, marks.landmark_radius)
    draw_circumplex(img, marks.disc_center, marks.disc_radius, face.valence, face.arousal, marks.color)


def banner_height(width: int) -> int:
    """How tall :func:`banner_sprite` is for an image ``width`` wide."""
    return int(30 * _banner_scale(width)) + 8


def _banner_scale(width: int) -> float:
    return round(float(np.clip(width / 1400, 0.4, 1.0)), 2)


def banner_sprite(text: str, width: int) -> np.ndarray:
    """A warning strip ``width`` wide (e.g. untrained weights); ASCII only (Hershey fonts)."""
    text = text.replace("\u2014", "-").encode("ascii", "replace").decode()
    fs = _banner_scale(width)
    h = banner_height(width)
    strip = np.zeros((h, width, 4), np.uint8)
    strip[...] = (160, 0, 0, 255)
    words = text_sprite(text, fs, (255, 255, 255))
    lay(strip[..., :3], words, 6, h - 8 - text_origin(text, fs))
    return strip


def no_face(height: int) -> tuple[np.ndarray, int, int]:
    """The "no face found" sprite of an image ``height`` high, and where its corner goes."""
    text = "no face found"
    return text_sprite(text, 0.7, (255, 80, 80), 2), 10, height - 12 - text_origin(text, 0.7, 2)


def annotate(image: np.ndarray, faces: Sequence[FaceResult], class_names: Sequence[str],
             banner: Optional[str] = None, labels: Optional[Sequence[str]] = None) -> np.ndarray:
    """A copy of ``image`` (RGB) with every face drawn, the marks placed apart (:func:`place_faces`) and below
    the banner; ``labels`` name the faces (default #0, #1, ...)."""
    out = image.copy()
    if labels is None:
        labels = [f"#{i}" if len(faces) > 1 else None for i in range(len(faces))]
    strip = banner_sprite(banner, out.shape[1]) if banner else None
    for face, marks in zip(faces, place_faces(faces, class_names, out.shape, strip.shape[0] if banner else 0, labels)):
        draw_marks(out, face, marks)
    if not faces:
        lay(out, *no_face(out.shape[0]))
    if strip is not None:
        lay(out, strip, 0, 0)
    return out
