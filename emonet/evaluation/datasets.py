"""Labelled face datasets for evaluation: AffectNet by the authors' protocol (spec §8), and any CSV.

A dataset item is one face crop, warped in the DataLoader worker: ``(crop uint8 (3, 256, 256), label,
valence, arousal, index)``; a missing label is -1 and a missing valence/arousal is nan.
"""
from __future__ import annotations

import csv
import io
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..geometry import DETECTOR_SHIFT, LANDMARK_REFERENCE_SCALE, S3FD_REFERENCE_SCALE, box_to_matrix, \
    landmarks_box, warp_crops
from ..errors import InputError
from ..io.images import read_image

# 5-class protocol: keep these 8-class labels, and map them to these indices (Anger 6 -> 4; spec §4).
AFFECTNET_5_MAP = {0: 0, 1: 1, 2: 2, 3: 3, 6: 4}


class DatasetError(InputError):
    """A dataset file is missing, malformed or unsafe; the message says which."""


# -- safe unpickling ---------------------------------------------------------------------------

_ALLOWED_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "bytearray"),
    ("builtins", "slice"), ("collections", "OrderedDict"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
}
_NUMPY_DTYPE_MODULES = {"numpy", "numpy.dtypes"}


class _AllowListUnpickler(pickle.Unpickler):
    """Only plain containers, numbers, strings and NumPy arrays: anything else is refused unrun."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS or (module in _NUMPY_DTYPE_MODULES and name.endswith("DType")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def safe_load_pickle(path: Path):
    """Unpickle ``path`` with the allow-list: a tampered file cannot run code."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        return _AllowListUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if "refused global" in str(exc):
            raise DatasetError(f"{path}: refused to load it: it holds objects other than plain data "
                               f"({str(exc).removeprefix('refused global ')}); a tampered or foreign "
                               f"file") from None
        raise DatasetError(f"{path}: corrupt pickle ({exc})") from None
    except Exception as exc:
        raise DatasetError(f"{path}: corrupt or truncated pickle ({type(exc).__name__})") from None


# -- the AffectNet protocol --------------------------------------------------------------------

def keep_affectnet(expression: int, valence: float, arousal: float, correct: bool, n_classes: int) -> bool:
    """The authors' cleaning rules: class set, ``expression_correct``, and the intensity rule of the class."""
    allowed = range(8) if n_classes == 8 else AFFECTNET_5_MAP
    if expression not in allowed or not correct:
        return False
    v, a = float(valence), float(arousal)
    i = math.sqrt(v * v + a * a)
    rules = {
        0: i < 0.2,                       # neutral
        1: v > 0 and i > 0.2,             # happy
        2: v < 0 and i > 0.2,             # sad
        3: a > 0 and i > 0.2,             # surprise
        4: a >= 0 and v <= 0 and i > 0.2,  # fear
        5: v < 0 and i > 0.3,             # disgust
        6: a > 0 and i > 0.2,             # anger
        7: v < 0 and i > 0.2,             # contempt
    }
    return bool(rules[expression])


@dataclass
class Sample:
    """One labelled face: image path, how to crop it, and its labels (-1 / nan when absent)."""

    path: Path
    matrix: Optional[np.ndarray]   # image -> crop; None until a detector has found the face
    label: int = -1
    valence: float = float("nan")
    arousal: float = float("nan")
    box: Optional[np.ndarray] = None  # for the CSV dataset's detector convention
    faces_found: Optional[int] = None  # faces the detector found (the one evaluated: --face)
    landmarks: Optional[np.ndarray] = None  # (68, 2), where a CSV gave them: a predictions file repeats them


class FaceDataset(Dataset):
    """Samples -> warped crops, read and warped in the worker processes."""

    def __init__(self, samples: Sequence[Sample], class_names: Sequence[str], name: str) -> None:
        self.samples = list(samples)
        self.class_names = tuple(class_names)
        self.name = name

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        s = self.samples[index]
        image = read_image(s.path)
        crop = warp_crops(image, [s.matrix])[0]
        return (torch.from_numpy(crop).permute(2, 0, 1).contiguous(), s.label,
                float(s.valence), float(s.arousal), index)

    @property
    def labelled(self) -> bool:
        """Whether any sample has a label to score against (an expression, a valence or an arousal)."""
        return any(s.label >= 0 or np.isfinite(s.valence) or np.isfinite(s.arousal) for s in self.samples)

    def missing(self) -> list[Path]:
        """Samples whose image file is absent or empty (checked before a run)."""
        return [s.path for s in self.samples if not s.path.is_file() or s.path.stat().st_size == 0]

    def drop(self, paths: Sequence[Path]) -> None:
        """Remove the samples of these images."""
        gone = set(map(str, paths))
        self.samples = [s for s in self.samples if str(s.path) not in gone]


def affectnet(root: Path, subset: str, n_classes: int, class_names: Sequence[str]) -> tuple[FaceDataset, dict]:
    """The cleaned AffectNet ``subset`` by the authors' protocol, and counts of what was dropped and why."""
    root = Path(root)
    index_path = root / f"{subset}_fullpath.pkl"
    if not index_path.is_file():
        raise DatasetError(f"{index_path}: AffectNet index not found (expected <root>/{subset}_fullpath.pkl)")
    index = safe_load_pickle(index_path)
    if not isinstance(index, dict):
        raise DatasetError(f"{index_path}: not an AffectNet index (a dict of image path -> labels expected)")
    samples, counts = [], {"in_index": 0, "not_in_class_set": 0, "expression_incorrect": 0,
                           "intensity_rule": 0, "kept": 0}
    for key, entry in index.items():
        if key == "folder" or not isinstance(entry, dict):
            continue
        counts["in_index"] += 1
        try:
            expr = int(entry["expression"])
            v, a = float(entry["valence"]), float(entry["arousal"])
            correct = bool(entry.get("expression_correct", True))
            landmarks = np.asarray(entry["landmarks_fan"], dtype=np.float64).reshape(-1, 2)
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{index_path}: entry {key!r} is malformed ({type(exc).__name__}: {exc})") from None
        allowed = range(8) if n_classes == 8 else AFFECTNET_5_MAP
        if expr not in allowed:
            counts["not_in_class_set"] += 1
        elif not correct:
            counts["expression_incorrect"] += 1
        elif not keep_affectnet(expr, v, a, correct, n_classes):
            counts["intensity_rule"] += 1
        else:
            label = expr if n_classes == 8 else AFFECTNET_5_MAP[expr]
            matrix = box_to_matrix(landmarks_box(landmarks), LANDMARK_REFERENCE_SCALE)
            samples.append(Sample(root / subset / key, matrix, label, v, a))
    counts["kept"] = len(samples)
    return FaceDataset(samples, class_names, f"AffectNet {subset} ({n_classes} classes)"), counts


# -- any CSV -----------------------------------------------------------------------------------

_PATH_COLUMNS = ("image", "path", "file", "filename", "image_path")
_BOX_COLUMNS = ("x1", "y1", "x2", "y2")


def _label(value: str, class_names: Sequence[str], where: str) -> int:
    value = value.strip()
    if value == "":
        return -1
    lowered = [c.lower() for c in class_names]
    if value.lower() in lowered:
        return lowered.index(value.lower())
    last = len(class_names) - 1
    use = f"use an index 0-{last} or one of {', '.join(class_names)}, or leave the cell empty for no label"
    try:
        number = float(value)
    except ValueError:
        raise DatasetError(f"{where}: unknown expression {value!r} ({use})") from None
    if not number.is_integer():
        raise DatasetError(f"{where}: expression {value!r} is no class index ({use})")
    idx = int(number)
    if not 0 <= idx <= last:
        raise DatasetError(f"{where}: expression index {idx} outside 0-{last}, the model's {len(class_names)} "
                           f"classes ({use})")
    return idx


def _number(value: Optional[str], where: str) -> float:
    if value is None or value.strip() == "":
        return float("nan")
    try:
        return float(value)
    except ValueError:
        raise DatasetError(f"{where}: {value!r} is not a number") from None


def _circumplex(value: Optional[str], name: str, where: str) -> float:
    """A valence or arousal label: nan where the cell is empty, else a number in [-1, 1]."""
    number = _number(value, where)
    # A "no label" code (AffectNet's -2, say) would be scored as a real value: refused, an empty cell is the way.
    if not (np.isnan(number) or -1.0 <= number <= 1.0):
        raise DatasetError(f"{where}: {name} {number:g} is outside [-1, 1] (the circumplex's range); give a value "
                           f"from -1 to 1, or leave the cell empty for no label")
    return number


def csv_dataset(csv_path: Path, root: Optional[Path], class_names: Sequence[str]) -> FaceDataset:
    """Rows of image path and any of expression (name or index), valence, arousal; optional box or landmarks.

    Box columns ``x1, y1, x2, y2`` are detector boxes (S3FD convention); a ``landmarks`` column holds 136
    numbers (x1 y1 x2 y2 ...; separated by spaces, commas or semicolons) and gives the training crop.
    Rows with neither are left for a detector (their ``matrix`` is None).
    """
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise DatasetError(f"{csv_path}: CSV file not found")
    base = Path(root) if root else csv_path.parent
    try:
        samples = _csv_samples(csv_path, base, class_names)
    except UnicodeDecodeError:
        raise DatasetError(f"{csv_path}: not a text CSV (it is not UTF-8 text); give a CSV of image paths and "
                           f"labels") from None
    except csv.Error as exc:
        raise DatasetError(f"{csv_path}: not a CSV the reader can parse ({exc})") from None
    if not samples:
        raise DatasetError(f"{csv_path}: no rows")
    return FaceDataset(samples, class_names, f"CSV {csv_path.name}")


def _csv_samples(csv_path: Path, base: Path, class_names: Sequence[str]) -> list:
    with open(csv_path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        columns = [c.strip().lower() for c in (reader.fieldnames or [])]
        path_col = next((c for c in _PATH_COLUMNS if c in columns), None)
        if path_col is None:
            raise DatasetError(f"{csv_path}: needs an image path column (one of {', '.join(_PATH_COLUMNS)}); "
                               f"found {', '.join(columns) or 'no header'}")
        samples = []
        for line, raw in enumerate(reader, start=2):
            row = {k.strip().lower(): (v or "") for k, v in raw.items() if k}
            where = f"{csv_path}:{line}"
            matrix, box, landmarks = None, None, None
            if row.get("landmarks", "").strip():
                pts = np.array([_number(t, where) for t in row["landmarks"].replace(";", " ").replace(",", " ").split()])
                if pts.size != 136:
                    raise DatasetError(f"{where}: landmarks need 136 numbers, found {pts.size}")
                landmarks = pts.reshape(68, 2)
                matrix = box_to_matrix(landmarks_box(landmarks), LANDMARK_REFERENCE_SCALE)
            elif any(row.get(c, "").strip() for c in _BOX_COLUMNS):
                given = [c for c in _BOX_COLUMNS if row.get(c, "").strip()]
                if len(given) < len(_BOX_COLUMNS):
                    raise DatasetError(f"{where}: a box needs all of {', '.join(_BOX_COLUMNS)}; this row gives only "
                                       f"{', '.join(given)}")
                box = np.array([_number(row[c], where) for c in _BOX_COLUMNS])
                matrix = box_to_matrix(box, S3FD_REFERENCE_SCALE, DETECTOR_SHIFT)
            samples.append(Sample(base / row[path_col].strip(), matrix,
                                  _label(row.get("expression", ""), class_names, where),
                                  _circumplex(row.get("valence"), "valence", where),
                                  _circumplex(row.get("arousal"), "arousal", where), box, landmarks=landmarks))
    return samples
