"""Drawing results on images with OpenCV: boxes, labels, landmarks and the valence-arousal circumplex."""
from __future__ import annotations

from typing import Optional, Sequence

import cv2
import numpy as np

from .results import FaceResult

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


def _label_block(img: np.ndarray, lines, anchor: tuple[int, int], scale: float, thickness: int) -> None:
    """Lines of text on a dark box just above ``anchor`` (below it when there is no room above)."""
    sizes = [cv2.getTextSize(t, FONT, scale, thickness)[0] for t, _ in lines]
    pad, gap = 4, int(8 * scale) + 2
    width = max(w for w, _ in sizes) + 2 * pad
    height = sum(h for _, h in sizes) + gap * (len(lines) - 1) + 2 * pad + int(6 * scale)
    x = int(np.clip(anchor[0], 0, max(0, img.shape[1] - width)))
    y = anchor[1] - height if anchor[1] - height >= 0 else anchor[1]
    overlay = img.copy()
    cv2.rectangle(overlay, (x, y), (x + width, y + height), (0, 0, 0), -1)
    cv2.addWeighted(overlay, 0.55, img, 0.45, 0, dst=img)
    cy = y + pad
    for (text, color), (_, h) in zip(lines, sizes):
        cy += h
        cv2.putText(img, text, (x + pad, cy), FONT, scale, color, thickness, cv2.LINE_AA)
        cy += gap


def _circumplex_disc(img: np.ndarray, center: tuple[int, int], radius: int) -> None:
    cx, cy = int(center[0]), int(center[1])
    overlay = img.copy()
    cv2.circle(overlay, (cx, cy), radius, (30, 30, 30), -1, cv2.LINE_AA)
    cv2.addWeighted(overlay, 0.6, img, 0.4, 0, dst=img)
    cv2.circle(img, (cx, cy), radius, (220, 220, 220), 1, cv2.LINE_AA)
    cv2.line(img, (cx - radius, cy), (cx + radius, cy), (150, 150, 150), 1, cv2.LINE_AA)
    cv2.line(img, (cx, cy - radius), (cx, cy + radius), (150, 150, 150), 1, cv2.LINE_AA)
    fs = max(0.3, radius / 120)
    _text(img, "V", (cx + radius - int(14 * fs / 0.4), cy - 4), fs, (220, 220, 220))
    _text(img, "A", (cx + 4, cy - radius + int(14 * fs / 0.4)), fs, (220, 220, 220))


def _circumplex_point(img: np.ndarray, center: tuple[int, int], radius: int, valence: float, arousal: float,
                      color, trail: Optional[Sequence[tuple[float, float]]] = None) -> None:
    def point(v: float, a: float) -> tuple[int, int]:
        return (int(round(center[0] + np.clip(v, -1, 1) * radius)),
                int(round(center[1] - np.clip(a, -1, 1) * radius)))

    if trail:
        pts = [point(v, a) for v, a in trail]
        for i in range(1, len(pts)):
            shade = tuple(int(c * (0.3 + 0.7 * i / len(pts))) for c in color)  # older: darker
            cv2.line(img, pts[i - 1], pts[i], shade, 1, cv2.LINE_AA)
    cv2.circle(img, point(valence, arousal), max(2, radius // 12), color, -1, cv2.LINE_AA)


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
        r = max(1, size // 100)
        for x, y in face.landmarks:
            cv2.circle(img, (int(round(x)), int(round(y))), r, (0, 255, 255), -1, cv2.LINE_AA)
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
    for i, face in enumerate(faces):
        label = labels[i] if labels is not None else (f"#{i}" if len(faces) > 1 else None)
        draw_face(out, face, class_names, label=label)
    if not faces:
        _text(out, "no face found", (10, out.shape[0] - 12), 0.7, (255, 80, 80), 2)
    if banner:
        draw_banner(out, banner)
    return out


def side_panel(height: int, crop: Optional[np.ndarray], crop_landmarks: Optional[np.ndarray],
               tracks: Sequence[tuple[str, tuple[int, int, int], float, float, Sequence[tuple[float, float]]]],
               caption: str = "") -> np.ndarray:
    """The video panel: the main face's crop with its landmarks over the valence-arousal circumplex.

    ``tracks``: (label, colour, valence, arousal, trail) per face.
    """
    width = max(200, height // 2)
    panel = np.full((height, width, 3), 24, np.uint8)
    side = min(width, int(height * 0.5))
    if crop is not None:
        face = cv2.resize(crop, (side, side), interpolation=cv2.INTER_AREA)
        if crop_landmarks is not None:
            for x, y in crop_landmarks * (side / crop.shape[1]):
                cv2.circle(face, (int(round(x)), int(round(y))), 2, (0, 255, 255), -1, cv2.LINE_AA)
        x0 = (width - side) // 2
        panel[:side, x0:x0 + side] = face
    if caption:
        _text(panel, caption, (8, side + 22), 0.5, (255, 255, 255))
    radius = max(20, min(width, height - side - 40) // 2 - 12)
    center = (width // 2, min(height - radius - 8, side + 40 + radius))
    _circumplex_disc(panel, center, radius)
    for _, color, v, a, trail in tracks:
        _circumplex_point(panel, center, radius, v, a, color, trail)
    return panel
