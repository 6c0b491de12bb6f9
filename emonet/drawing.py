"""Drawing results on images with OpenCV: boxes, labels, landmarks and the valence-arousal circumplex."""
from __future__ import annotations

from typing import Optional, Sequence

import cv2
import numpy as np

from .results import CROP_SIZE, FaceResult  # not geometry: drawing workers run without torch

# One colour per expression class (RGB), stable across images and videos.
PALETTE = [(200, 200, 200), (80, 220, 80), (70, 120, 255), (255, 210, 0), (190, 90, 255),
           (130, 170, 40), (255, 60, 60), (255, 140, 0)]
FONT = cv2.FONT_HERSHEY_SIMPLEX


def _color(index: int) -> tuple[int, int, int]:
    return PALETTE[index % len(PALETTE)]


def _text(img: np.ndarray, text: str, org: tuple[int, int], scale: float, color, thickness: int = 1) -> None:
    """Text with a dark shadow, readable on any background.

    A shadow at the same thickness, not a thicker outline: OpenCV 5's font widens glyphs with thickness.
    """
    x, y = int(org[0]), int(org[1])
    cv2.putText(img, text, (x + 1, y + 1), FONT, scale, (0, 0, 0), thickness, cv2.LINE_AA)
    cv2.putText(img, text, (x, y), FONT, scale, color, thickness, cv2.LINE_AA)


def _darken(img: np.ndarray, x1: int, y1: int, x2: int, y2: int, alpha: float) -> None:
    """Blend the rectangle towards black by ``alpha``, in place (only that region is touched)."""
    roi = img[max(y1, 0):max(y2, 0), max(x1, 0):max(x2, 0)]
    if roi.size:
        cv2.convertScaleAbs(roi, dst=roi, alpha=1.0 - alpha)


def _label_block(img: np.ndarray, lines, anchor: tuple[int, int], scale: float, thickness: int) -> None:
    """Lines of text on a dark box just above ``anchor`` (below it when there is no room above)."""
    sizes = [cv2.getTextSize(t, FONT, scale, thickness)[0] for t, _ in lines]
    pad, gap = 4, int(8 * scale) + 2
    width = max(w for w, _ in sizes) + 2 * pad
    height = sum(h for _, h in sizes) + gap * (len(lines) - 1) + 2 * pad + int(6 * scale)
    x = int(np.clip(anchor[0], 0, max(0, img.shape[1] - width)))
    y = anchor[1] - height if anchor[1] - height >= 0 else anchor[1]
    _darken(img, x, y, x + width, y + height, 0.55)
    cy = y + pad
    for (text, color), (_, h) in zip(lines, sizes):
        cy += h
        cv2.putText(img, text, (x + pad, cy), FONT, scale, color, thickness, cv2.LINE_AA)
        cy += gap


def _circumplex_disc(img: np.ndarray, center: tuple[int, int], radius: int) -> None:
    cx, cy = int(center[0]), int(center[1])
    # Blended on the disc's own square only: a whole-image copy per disc cost more than all the rest.
    x0, y0 = max(cx - radius - 1, 0), max(cy - radius - 1, 0)
    roi = img[y0:cy + radius + 2, x0:cx + radius + 2]
    if roi.size:
        overlay = roi.copy()
        cv2.circle(overlay, (cx - x0, cy - y0), radius, (30, 30, 30), -1, cv2.LINE_AA)
        cv2.addWeighted(overlay, 0.6, roi, 0.4, 0, dst=roi)
    cv2.circle(img, (cx, cy), radius, (220, 220, 220), 1, cv2.LINE_AA)
    cv2.line(img, (cx - radius, cy), (cx + radius, cy), (150, 150, 150), 1, cv2.LINE_AA)
    cv2.line(img, (cx, cy - radius), (cx, cy + radius), (150, 150, 150), 1, cv2.LINE_AA)
    fs = max(0.3, radius / 120)
    _text(img, "V", (cx + radius - int(14 * fs / 0.4), cy - 4), fs, (220, 220, 220))
    _text(img, "A", (cx + 4, cy - radius + int(14 * fs / 0.4)), fs, (220, 220, 220))


def _circumplex_point(img: np.ndarray, center: tuple[int, int], radius: int, valence: float, arousal: float,
                      color, trail: Optional[Sequence[tuple[float, float]]] = None) -> None:
    def points(va: np.ndarray) -> list:
        va = np.clip(np.asarray(va, np.float64).reshape(-1, 2), -1, 1)
        xy = np.rint(np.stack([center[0] + va[:, 0] * radius, center[1] - va[:, 1] * radius], 1))
        return [tuple(p) for p in xy.astype(np.int64).tolist()]

    if trail:
        pts = points(trail)
        for i in range(1, len(pts)):
            shade = tuple(int(c * (0.3 + 0.7 * i / len(pts))) for c in color)  # older: darker
            cv2.line(img, pts[i - 1], pts[i], shade, 1, cv2.LINE_AA)
    cv2.circle(img, points([valence, arousal])[0], max(2, radius // 12), color, -1, cv2.LINE_AA)


def _draw_points(img: np.ndarray, points: np.ndarray, radius: int, color=(0, 255, 255)) -> None:
    """Filled dots, set in one vectorised write (68 anti-aliased circles a frame cost more than the rest)."""
    r = int(radius)
    dy, dx = np.mgrid[-r:r + 1, -r:r + 1]
    disc = dx ** 2 + dy ** 2 <= r * r + r
    p = np.rint(np.asarray(points, np.float64)).astype(np.int64)
    xs = (p[:, 0, None] + dx[disc]).ravel()
    ys = (p[:, 1, None] + dy[disc]).ravel()
    inside = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    img[ys[inside], xs[inside]] = color


def draw_circumplex(img: np.ndarray, center: tuple[int, int], radius: int, valence: float, arousal: float,
                    color=(255, 255, 255), trail: Optional[Sequence[tuple[float, float]]] = None) -> None:
    """A valence (x) / arousal (y, up) disc with the current point and an optional fading trail."""
    _circumplex_disc(img, center, radius)
    _circumplex_point(img, center, radius, valence, arousal, color, trail)


def draw_face(img: np.ndarray, face: FaceResult, class_names: Sequence[str], label: Optional[str] = None,
              landmarks: bool = True) -> None:
    """Box, '<expression> <p>' label, valence/arousal line, landmarks and a circumplex beside the box."""
    color = _color(face.expression)
    x1, y1, x2, y2 = (int(round(v)) for v in face.box)
    size = max(x2 - x1, y2 - y1, 1)
    thick = max(1, size // 120)
    cv2.rectangle(img, (x1, y1), (x2, y2), color, thick, cv2.LINE_AA)
    fs = float(np.clip(size / 250, 0.5, 1.2))
    name, p = class_names[face.expression], face.probabilities[face.expression]
    lines = [(f"{label + ' ' if label else ''}{name} {p:.2f}", color),
             (f"V {face.valence:+.2f}  A {face.arousal:+.2f}", (255, 255, 255))]
    _label_block(img, lines, (x1, y1), fs, max(1, thick))
    if landmarks:
        _draw_points(img, face.landmarks, max(1, size // 100))
    radius = int(np.clip(size * 0.25, 18, 90))
    h, w = img.shape[:2]
    cx = x2 + radius + 6 if x2 + 2 * radius + 6 < w else max(radius, x1 - radius - 6)
    cy = int(np.clip(y1 + radius, radius, h - radius - 1))
    draw_circumplex(img, (cx, cy), radius, face.valence, face.arousal, color)


def draw_banner(img: np.ndarray, text: str) -> None:
    """A warning strip across the top of the image (e.g. untrained weights); ASCII only (Hershey fonts)."""
    text = text.replace("\u2014", "-").encode("ascii", "replace").decode()
    fs = float(np.clip(img.shape[1] / 1400, 0.4, 1.0))
    h = int(30 * fs) + 8
    cv2.rectangle(img, (0, 0), (img.shape[1], h), (160, 0, 0), -1)
    _text(img, text, (6, h - 8), fs, (255, 255, 255))


def annotate(image: np.ndarray, faces: Sequence[FaceResult], class_names: Sequence[str],
             banner: Optional[str] = None, labels: Optional[Sequence[str]] = None) -> np.ndarray:
    """A copy of ``image`` (RGB) with every face drawn; ``labels`` name the faces (default #0, #1, ...)."""
    out = image.copy()
    _annotate_in_place(out, faces, class_names, banner, labels)
    return out


def _annotate_in_place(out: np.ndarray, faces: Sequence[FaceResult], class_names: Sequence[str],
                       banner: Optional[str], labels: Optional[Sequence[str]]) -> None:
    for i, face in enumerate(faces):
        label = labels[i] if labels is not None else (f"#{i}" if len(faces) > 1 else None)
        draw_face(out, face, class_names, label=label)
    if not faces:
        _text(out, "no face found", (10, out.shape[0] - 12), 0.7, (255, 80, 80), 2)
    if banner:
        draw_banner(out, banner)


def panel_width(height: int) -> int:
    """Width of the video side panel beside a frame of this height."""
    return max(200, height // 2)


def _panel_layout(height: int) -> tuple[int, int, int, tuple[int, int]]:
    width = panel_width(height)
    side = min(width, int(height * 0.5))
    radius = max(20, min(width, height - side - 40) // 2 - 12)
    center = (width // 2, min(height - radius - 8, side + 40 + radius))
    return width, side, radius, center


def panel_background(height: int) -> np.ndarray:
    """The side panel's unchanging part (background and circumplex disc), drawn once per video."""
    width, _, radius, center = _panel_layout(height)
    panel = np.full((height, width, 3), 24, np.uint8)
    _circumplex_disc(panel, center, radius)
    return panel


def _fill_panel(panel: np.ndarray, side: int, radius: int, center: tuple[int, int], crop, crop_landmarks,
                tracks, caption: str) -> np.ndarray:
    width = panel.shape[1]
    if crop is not None:
        face = crop if crop.shape[0] == side else cv2.resize(crop, (side, side), interpolation=cv2.INTER_AREA)
        x0 = (width - side) // 2
        panel[:side, x0:x0 + side] = face
        if crop_landmarks is not None:
            _draw_points(panel[:side, x0:x0 + side], crop_landmarks * (side / crop.shape[1]), 2)
    if caption:
        _text(panel, caption, (8, side + 22), 0.5, (255, 255, 255))
    for _, color, v, a, trail in tracks:
        _circumplex_point(panel, center, radius, v, a, color, trail)
    return panel


def _cut(image: np.ndarray, matrix: np.ndarray, side: int) -> np.ndarray:
    """The ``side`` x ``side`` crop an affine ``matrix`` maps ``image`` onto, zero outside the image.

    Crop matrices only scale and shift: then the crop is a resized window of the image, several times
    cheaper than a general warp (for display; the network's crops are warped exactly).
    """
    if matrix[0, 1] != 0 or matrix[1, 0] != 0:
        return cv2.warpAffine(image, matrix, (side, side), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    sx, sy, tx, ty = matrix[0, 0], matrix[1, 1], matrix[0, 2], matrix[1, 2]
    h, w = image.shape[:2]
    # The window in image pixels, clipped to the image, and where it lands in the crop.
    x0, x1 = max(0.0, -tx / sx), min(float(w), (side - tx) / sx)
    y0, y1 = max(0.0, -ty / sy), min(float(h), (side - ty) / sy)
    out = np.zeros((side, side, 3), np.uint8)
    dx0, dx1 = int(round(x0 * sx + tx)), int(round(x1 * sx + tx))
    dy0, dy1 = int(round(y0 * sy + ty)), int(round(y1 * sy + ty))
    window = image[int(y0):int(np.ceil(y1)), int(x0):int(np.ceil(x1))]
    if dx1 > dx0 and dy1 > dy0 and window.size:
        out[dy0:dy1, dx0:dx1] = cv2.resize(window, (dx1 - dx0, dy1 - dy0), interpolation=cv2.INTER_LINEAR)
    return out


class FramePainter:
    """Annotated video frames: the frame with every face drawn, and the side panel beside it.

    Holds what is the same for every frame of a video (the panel's background) and the frame it draws
    into, so a frame costs only what changes: the frame returned is overwritten by the next call.
    """

    def __init__(self, class_names: Sequence[str], banner: Optional[str] = None) -> None:
        self.class_names = list(class_names)
        self.banner = banner
        self._backgrounds: dict[int, np.ndarray] = {}
        self._out: Optional[np.ndarray] = None

    def __call__(self, image: np.ndarray, faces: Sequence[tuple[FaceResult, Sequence[tuple[float, float]]]],
                 colors: Sequence[tuple[int, int, int]]) -> np.ndarray:
        """``image`` (RGB) and its faces, each with its valence/arousal trail, as one ``(H, W + panel, 3)`` frame."""
        h, w = image.shape[:2]
        background = self._backgrounds.get(h)
        if background is None:
            background = self._backgrounds.setdefault(h, panel_background(h))
        width, side, radius, center = _panel_layout(h)
        if self._out is None or self._out.shape != (h, w + width, 3):
            self._out = np.empty((h, w + width, 3), np.uint8)
        out = self._out
        out[:, :w] = image
        out[:, w:] = background
        results = [f for f, _ in faces]
        crop = crop_lm = None
        caption = "no face"
        if results:
            # The main face, cut straight to the panel's size (one warp, no resize), before drawing on the frame.
            face = max(results, key=lambda f: f.box[2] - f.box[0])
            matrix = np.asarray(face.matrix, np.float64) * (side / CROP_SIZE)
            crop = _cut(image, matrix, side)
            crop_lm = face.landmarks @ matrix[:, :2].T + matrix[:, 2]
            caption = (f"#{face.face_id} {self.class_names[face.expression]} "
                       f"{face.probabilities[face.expression]:.2f}")
        _annotate_in_place(out[:, :w], results, self.class_names, self.banner,
                           [f"#{f.face_id}" for f in results])
        _fill_panel(out[:, w:], side, radius, center, crop, crop_lm,
                    [(f"#{f.face_id}", c, f.valence, f.arousal, trail) for (f, trail), c in zip(faces, colors)],
                    caption)
        return out
