"""A small dataset in AffectNet's format, made from real photo crops: index pickle + images."""
import pickle
from pathlib import Path


import cv2
import numpy as np

from emonet.engine.check import SAMPLE_PHOTO

PHOTO = SAMPLE_PHOTO

# (expression, valence, arousal, expression_correct): 7 kept for 8 classes, 5 for 5 classes.
ENTRIES = [
    (0, 0.05, 0.05, True),   # neutral, kept
    (1, 0.6, 0.2, True),     # happy, kept
    (2, -0.5, -0.1, True),   # sad, kept
    (3, 0.1, 0.7, True),     # surprise, kept
    (4, -0.2, 0.6, True),    # fear, kept (8 only)
    (6, -0.4, 0.5, True),    # anger, kept (-> 4 in 5 classes)
    (7, -0.3, 0.1, True),    # contempt, kept (8 only)
    (1, -0.5, 0.0, True),    # happy with negative valence: intensity rule drops it
    (2, -0.5, 0.0, False),   # expression_correct false
    (9, 0.0, 0.0, True),     # not a face
]


def make_affectnet(root: Path, subset: str = "test") -> Path:
    """Write ``<root>/<subset>_fullpath.pkl`` and the images; return the root."""
    photo = cv2.imread(str(PHOTO))
    rng = np.random.default_rng(0)
    index = {"folder": "ignored"}
    for i, (expr, v, a, correct) in enumerate(ENTRIES):
        dx, dy = rng.integers(-20, 20, 2)
        img = np.roll(photo, (int(dy), int(dx)), axis=(0, 1))
        rel = f"{i % 3}/img_{i}.jpg"
        (root / subset / rel).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / subset / rel), img)
        # 68 points on an ellipse inside the astronaut's face, moved with the image.
        t = np.linspace(0, 2 * np.pi, 68, endpoint=False)
        lm = np.stack([225 + 48 * np.cos(t) + dx, 128 + 55 * np.sin(t) + dy], axis=1)
        index[rel] = {"expression": expr, "valence": v, "arousal": a, "expression_correct": correct,
                      "landmarks_fan": lm.astype(np.float32)}
    (root / f"{subset}_fullpath.pkl").write_bytes(pickle.dumps(index))
    return root
