"""Checkpoints: what the released weights are, where they come from, and how to load any file safely.

Modelled on torchvision's weights API: a :class:`Weights` record carries the URL, the hash, the class
names and the preprocessing together. Loading always goes through ``torch.load(weights_only=True)``,
so a file that tries to run code is refused before any of it runs.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch

from ..classes import EXPRESSIONS_5, EXPRESSIONS_8
from ..io.atomic import AtomicFile
from ..log import progress_bar, say
from .emonet import EmoNet

UNTRAINED_LABEL = "untrained weights — predictions are meaningless"  # shown wherever "random" weights run
LICENCE = (
    "The released EmoNet weights are licensed CC BY-NC-ND 4.0 by their authors "
    "(Toisoul et al., 2021): non-commercial use only, no redistribution of modified weights."
)


@dataclass(frozen=True)
class Weights:
    """A released checkpoint: where it lives, how to verify it, and what its outputs mean."""

    filename: str
    url: str
    git_blob_sha1: str
    n_expression: int
    class_names: Sequence[str]
    licence: str = LICENCE


RELEASE_URL = "https://github.com/face-analysis/emonet/raw/master/pretrained/{}"
WEIGHTS = {
    8: Weights("emonet_8.pth", RELEASE_URL.format("emonet_8.pth"),
               "6833bfdcf8fc761deb7630256a750cf1f7c850c1", 8, EXPRESSIONS_8),
    5: Weights("emonet_5.pth", RELEASE_URL.format("emonet_5.pth"),
               "61358cb3ea0fe410c01ee4ffff5ed1b49713af98", 5, EXPRESSIONS_5),
}

# The layer whose shape tells the class count: Linear 128 -> n + 2.
_HEAD_KEY = "emo_fc_2.3.weight"


class CheckpointError(Exception):
    """A checkpoint could not be found, fetched, read or matched to EmoNet; the message says which."""


def git_blob_sha1(path: Union[str, Path]) -> str:
    """SHA-1 of a file as git names its blob: ``sha1(b"blob <size>\\0" + bytes)``."""
    path = Path(path)
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def local_pretrained_dir() -> Path:
    """``pretrained/`` in the current folder: where a user may put the released files by hand."""
    return Path("pretrained")


def cache_dir() -> Path:
    """Where downloaded weights go: ``$EMONET_HOME`` or ~/.cache/emonet."""
    return Path(os.environ.get("EMONET_HOME", Path.home() / ".cache" / "emonet"))


def _candidate_paths(weights: Weights) -> list[Path]:
    return [local_pretrained_dir() / weights.filename, cache_dir() / weights.filename]


def download_weights(weights: Weights, dest_dir: Union[str, Path], progress: bool = True) -> Path:
    """Download ``weights`` into ``dest_dir`` atomically, verifying its git-blob SHA-1; return the path."""
    dest_dir = Path(dest_dir)
    dest = dest_dir / weights.filename
    say(f"Downloading {weights.filename} from {weights.url}\n{weights.licence}")
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create {dest_dir} for the download ({exc.strerror}); "
                              f"set EMONET_HOME to a writable folder") from None
    try:
        partial = AtomicFile(dest, "wb")
    except OSError as exc:
        raise CheckpointError(f"cannot write in {dest_dir} for the download ({exc.strerror}); "
                              f"set EMONET_HOME to a writable folder") from None
    out = partial.file
    try:
        with urllib.request.urlopen(weights.url, timeout=30) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with progress_bar(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                              desc=weights.filename, disable=not progress) as bar:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
        out.flush()
        actual = git_blob_sha1(partial.tmp)
        if actual != weights.git_blob_sha1:
            raise CheckpointError(
                f"downloaded {weights.filename} does not match its published hash "
                f"(got {actual[:12]}, expected {weights.git_blob_sha1[:12]}); nothing was saved. "
                f"Download it from {weights.url} by hand and put it at {dest}")
        partial.commit()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        local_copy = local_pretrained_dir() / weights.filename
        places = f"{dest} (or {local_copy.resolve()}, in the folder you run from)"
        raise CheckpointError(
            f"could not download {weights.filename} ({reason}). Without network access, download "
            f"{weights.url} elsewhere and put it at {places}"
        ) from None
    finally:
        partial.abort()  # (nothing left to remove once committed)
    return dest


def resolve_pretrained(n_expression: int = 8, download: bool = True) -> Path:
    """Path of the released ``n_expression``-class file: local copy first, else download it."""
    if n_expression not in WEIGHTS:
        raise CheckpointError(f"released EmoNet weights exist for 8 or 5 classes, not {n_expression}")
    weights = WEIGHTS[n_expression]
    for path in _candidate_paths(weights):
        if path.is_file():
            if git_blob_sha1(path) != weights.git_blob_sha1:
                say(f"warning: {path} is not the released {weights.filename} (hash differs); using it anyway")
            return path
    if not download:
        raise CheckpointError(f"{weights.filename} not found in {local_pretrained_dir()} or {cache_dir()}")
    return download_weights(weights, cache_dir())


def read_state_dict(path: Union[str, Path]) -> dict[str, torch.Tensor]:
    """Read a checkpoint file safely (``weights_only=True``) and return its state dict, ``module.`` removed."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path} (give the path of emonet_8.pth or "
                              f"emonet_5.pth, or 'pretrained')")
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder; give the checkpoint file inside it")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes); download it again")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pickle-protocol chatter; the outcome is reported below
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" in str(exc).lower():
            raise CheckpointError(
                f"{path} holds Python objects or code, not only tensors; refused without running it "
                f"(loading is weights-only for safety). Use a plain EmoNet state dict") from None
        raise CheckpointError(f"{path} is corrupt or not a PyTorch checkpoint (the weights-only "
                              f"loader refused its contents)") from None
    except RuntimeError as exc:
        raise CheckpointError(f"{path} is truncated or corrupt and cannot be read "
                              f"({_first_line(exc)}); download it again") from None
    except Exception as exc:  # an untrusted file can make the unpickler fail in many ways
        raise CheckpointError(f"{path} is corrupt or not a PyTorch checkpoint "
                              f"({type(exc).__name__} while reading it)") from None
    if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} is not an EmoNet checkpoint (expected a state dict of tensors, "
                              f"found {type(obj).__name__})")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in obj.items()}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].split(". ")[0][:160] if text else type(exc).__name__


def n_expression_of(state_dict: Mapping[str, torch.Tensor]) -> Optional[int]:
    """The class count a state dict was trained for, read from its last Linear layer; None if absent."""
    head = state_dict.get(_HEAD_KEY)
    if head is None or head.ndim != 2 or head.shape[0] < 3:
        return None
    return int(head.shape[0]) - 2


def _match(model: EmoNet, state_dict: Mapping[str, torch.Tensor], path: Path) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        def some(keys: list[str]) -> str:
            return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys ({some(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys ({some(unexpected)})")
        cause = ("it is not an EmoNet checkpoint" if len(missing) > len(expected) // 2
                 else "it was saved from a different EmoNet variant (attention on/off?)")
        raise CheckpointError(f"{path} does not fit EmoNet: {'; '.join(parts)}; likely {cause}")
    wrong = [k for k, v in expected.items() if state_dict[k].shape != v.shape]
    if wrong:
        k = wrong[0]
        raise CheckpointError(f"{path} does not fit EmoNet: {len(wrong)} tensors have the wrong shape "
                              f"(first: {k} is {tuple(state_dict[k].shape)}, expected {tuple(expected[k].shape)})")
    # The model's own tensors are placeholders (built on the meta device, see load_model): a copy of each of the
    # checkpoint's becomes its tensor, in the dtype the model declares, as copying into the model's tensors did (a
    # half-precision checkpoint is widened; a tensor stored twice, or as a view, becomes a tensor of its own).
    model.load_state_dict({k: state_dict[k].to(dtype=v.dtype, memory_format=torch.contiguous_format, copy=True)
                           for k, v in expected.items()}, strict=True, assign=True)


def load_model(weights: Union[str, Path] = "pretrained", n_expression: Optional[int] = None,
               device: Union[str, torch.device, None] = None) -> EmoNet:
    """Build EmoNet from ``weights`` (a path, ``"pretrained"`` or ``"random"``), in eval mode on ``device``.

    ``n_expression`` is read from the checkpoint when not given; a given value that disagrees is an
    error. ``device`` None means :func:`emonet.runtime.select_device`'s default (cuda:0, else CPU).
    """
    from ..runtime import select_device

    dev = select_device(device)
    if n_expression is not None and n_expression < 1:
        raise CheckpointError(f"the number of classes must be positive, got {n_expression}")
    if str(weights) == "random":
        # Seeded, without touching the global generator: every run of a tool draws the same untrained
        # network, so its outputs can be compared between runs (they still mean nothing).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = EmoNet(n_expression or 8)
        model.weights_source = "random"
        return model.to(dev).eval()

    if str(weights) == "pretrained":
        path = resolve_pretrained(n_expression or 8)
    else:
        path = Path(weights).expanduser()
    state_dict = read_state_dict(path)
    found = n_expression_of(state_dict)
    if found is None:
        raise CheckpointError(f"{path} is not an EmoNet checkpoint (no '{_HEAD_KEY}' layer among its "
                              f"{len(state_dict)} tensors)")
    if n_expression is not None and n_expression != found:
        raise CheckpointError(f"{path} is {'an' if found == 8 else 'a'} {found}-class checkpoint, but {n_expression} "
                              f"classes were asked for; drop the class count, or give a {n_expression}-class "
                              f"checkpoint (the released one is emonet_{n_expression}.pth)")
    with torch.device("meta"):  # no random initialisation to overwrite (a fifth of a second on a CPU)
        model = EmoNet(found)
    _match(model, state_dict, path)
    model.weights_source = str(path)
    return model.to(dev).eval()

