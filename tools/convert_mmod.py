#!/usr/bin/env python
"""Convert dlib's CNN face detector, ``mmod_human_face_detector.dat`` (Davis King, public domain: CC0), to
PyTorch weights for emonet.detection.mmod.

The .dat is read with a small reader of dlib's serialization (dlib/serialize.h: portable ints, floats as
mantissa and exponent, strings; dlib/cuda/tensor.h: tensors as 4-byte little-endian floats; the layers'
``serialize`` in dlib/dnn/core.h, layers.h, loss.h, input.h). The network is dlib's example's
``loss_mmod<con<1,9,9,1,1, rcon5<rcon5<rcon5<downsampler<input_rgb_image_pyramid<pyramid_down<6>>>>>>>>``; the
file holds its batch norms (``bn_con2``), which dlib turns into affines when it loads them
(``gamma / sqrt(running_variance + eps)``, ``beta - running_mean * that``): so does this converter. Written:
``emonet/detection/mmod.pth`` (dlib's tensors, a plain state dict) and ``NOTICE.mmod``.

The .dat comes from the sdist of ``face_recognition_models==0.3.0`` (PyPI), fetched with ``pip download`` (or
``--dat``: a .dat or .dat.bz2 already on disk, e.g. from davisking/dlib-models).

``--check`` proves the conversion against dlib itself (PyPI ``dlib-bin``): on real photos, the detections
dlib's ``cnn_face_detection_model_v1`` reports must each be found in the PyTorch network's detection map over the
same tiled pyramid (emonet.detection.mmod.TiledPyramid), at the point whose box is dlib's box, with the same
confidence to 1e-3, the best of them the map's best; and the crop scorer on a 200-px crop of a shipped portrait
must give dlib's confidence for that crop (the value tests/test_mmod.py expects).

    python tools/convert_mmod.py            # convert, then check
    python tools/convert_mmod.py --check    # check the committed weights only
"""
from __future__ import annotations

import argparse
import bz2
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SDIST = "face_recognition_models==0.3.0"
MEMBER = "face_recognition_models/models/mmod_human_face_detector.dat"
OUT = ROOT / "emonet" / "detection" / "mmod.pth"
NOTICE = ROOT / "emonet" / "detection" / "NOTICE.mmod"
TOLERANCE = 1e-3
# The check's photos: whole photos of faces (dlib's own test of the tiling, every pyramid level) and the portrait
# whose crop tests/test_mmod.py scores.
PORTRAITS = ROOT / "tests" / "data" / "portraits"
CHECK_PHOTOS = [ROOT / "emonet" / "engine" / "astronaut.jpg"]
CROP_SIZE = 200


# --- dlib's serialization ---------------------------------------------------------------------------------

class Reader:
    """dlib's ``deserialize`` for the types the .dat holds."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return value

    def int(self) -> int:
        """A portable int: a control byte (0x80: negative; low 4 bits: the byte count), then little-endian bytes."""
        control = self.byte()
        count = control & 0x0F
        if not 1 <= count <= 8:
            raise ValueError(f"bad integer at byte {self.at - 1}")
        value = int.from_bytes(self.data[self.at:self.at + count], "little")
        self.at += count
        return -value if control & 0x80 else value

    def float(self) -> float:
        """A float as a mantissa and an exponent, both portable ints (the old ASCII format refused)."""
        if self.data[self.at] & 0x70:
            raise ValueError(f"old ASCII float at byte {self.at}")
        mantissa, exponent = self.int(), self.int()
        if exponent >= 32000:
            raise ValueError(f"inf or NaN at byte {self.at}")
        return float(np.ldexp(float(mantissa), exponent))

    def string(self) -> str:
        size = self.int()
        value = self.data[self.at:self.at + size].decode("ascii")
        self.at += size
        return value

    def bool(self) -> bool:
        value = chr(self.byte())
        if value not in "01":
            raise ValueError(f"bad bool at byte {self.at - 1}")
        return value == "1"

    def tensor(self) -> np.ndarray:
        """A resizable_tensor: version 2, four sizes, then 4-byte little-endian floats."""
        self.expect(self.int(), 2, "tensor version")
        shape = [self.int() for _ in range(4)]
        count = int(np.prod(shape))
        value = np.frombuffer(self.data, "<f4", count, self.at).reshape(shape).astype(np.float32)
        self.at += 4 * count
        return value

    def alias(self) -> tuple[int, ...]:
        self.expect(self.int(), 1, "alias_tensor version")
        return tuple(self.int() for _ in range(4))

    @staticmethod
    def expect(found, wanted, what: str) -> None:
        if found != wanted:
            raise ValueError(f"{what}: {found!r}, expected {wanted!r}")


def read_con(r: Reader) -> dict:
    r.expect(r.string(), "con_4", "layer")
    params = r.tensor().reshape(-1)
    filters = r.int()
    nr, nc, stride_y, stride_x, pad_y, pad_x = (r.int() for _ in range(6))
    weight, bias = r.alias(), r.alias()
    multipliers = [r.float() for _ in range(4)]
    size = int(np.prod(weight))
    return dict(weight=params[:size].reshape(weight), bias=params[size:size + int(np.prod(bias))].reshape(-1),
                filters=filters, kernel=(nr, nc), stride=(stride_y, stride_x), padding=(pad_y, pad_x),
                multipliers=multipliers)


def read_bn(r: Reader) -> dict:
    """A ``bn_con2`` as dlib loads it into an ``affine_``: gamma / sqrt(var + eps), beta - mean * that."""
    r.expect(r.string(), "bn_con2", "layer")
    params = r.tensor().reshape(-1)
    gamma, beta = r.alias(), r.alias()
    _means, _invstds, running_means, running_variances = (r.tensor().reshape(-1) for _ in range(4))
    _updates, _window = r.int(), r.int()
    _multipliers = [r.float() for _ in range(4)]
    eps = r.float()
    n = int(np.prod(gamma))
    g = params[:n].astype(np.float64) / np.sqrt(running_variances.astype(np.float64) + eps)
    b = params[n:n + int(np.prod(beta))].astype(np.float64) - g * running_means
    return dict(gamma=g.astype(np.float32), beta=b.astype(np.float32), eps=eps)


def read_relu(r: Reader) -> dict:
    version = r.string()
    if version == "relu_2":
        r.bool()
    else:
        r.expect(version, "relu_", "layer")
    return {}


LAYERS = {"con": read_con, "bn": read_bn, "relu": read_relu}
# From the input up: downsampler (con5d, bn, relu) x3, rcon5 (con, bn, relu) x3, then the 9x9 con.
ORDER = ["con", "bn", "relu"] * 6 + ["con"]


def read_dat(data: bytes) -> tuple[dict, list[tuple[str, dict]]]:
    """The loss's options and input layer, and the layers from the input up, read to the file's last byte."""
    r = Reader(data)
    r.expect(r.int(), 1, "add_loss_layer version")
    r.expect(r.string(), "loss_mmod_", "loss")
    r.expect(r.int(), 1, "mmod_options version")  # version 1: one detector window, no label
    options = dict(window=(r.int(), r.int()), loss_per_false_alarm=r.float(), loss_per_missed_target=r.float(),
                   truth_match_iou=r.float(), nms=(r.float(), r.float()), ignore=(r.float(), r.float()))
    # add_layer's serialize writes its version, then its subnetwork's whole serialization, then its own layer:
    # the versions of the outer 18 layers come first, the input layer's add_layer (version 3) last.
    for _ in ORDER[1:]:
        r.expect(r.int(), 2, "add_layer version")
    r.expect(r.int(), 3, "input add_layer version")
    r.expect(r.string(), "input_rgb_image_pyramid", "input layer")
    options["mean"] = (r.float(), r.float(), r.float())
    layers = []
    for n, kind in enumerate(ORDER):
        layer = LAYERS[kind](r)
        _setup, _stale, _disabled = r.bool(), r.bool(), r.bool()
        for _ in range(3):  # x_grad, cached_output, params_grad (grad_final for the input's add_layer)
            r.tensor()
        if n == 0:
            options["sample_expansion_factor"] = r.int()
        layers.append((kind, layer))
    if r.at != len(data):
        raise ValueError(f"{len(data) - r.at} bytes left after the network")
    return options, layers


def to_state_dict(options: dict, layers: list[tuple[str, dict]]) -> dict[str, torch.Tensor]:
    from emonet.detection.mmod import CHANNELS, HEAD, STRIDES, from_dlib

    cons = [layer for kind, layer in layers if kind == "con"]
    bns = [layer for kind, layer in layers if kind == "bn"]
    state = {}
    for i, (con, bn) in enumerate(zip(cons, bns)):
        padding = 0 if STRIDES[i] != 1 else 2
        Reader.expect((con["filters"], con["kernel"], con["stride"], con["padding"]),
                      (CHANNELS[i], (5, 5), (STRIDES[i],) * 2, (padding,) * 2), f"con {i}")
        state[f"conv{i}.weight"], state[f"conv{i}.bias"] = con["weight"], con["bias"]
        state[f"affine{i}.gamma"], state[f"affine{i}.beta"] = bn["gamma"], bn["beta"]
    head = cons[-1]
    Reader.expect((head["filters"], head["kernel"], head["stride"], head["padding"]),
                  (1, (HEAD, HEAD), (1, 1), (HEAD // 2,) * 2), "head con")
    state["head.weight"], state["head.bias"] = head["weight"], head["bias"]
    state["mean"] = np.array(options["mean"], np.float32)
    state["window"] = np.array(options["window"], np.int64)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    from_dlib(state)  # every shape checked
    return state


def fetch_dat(workdir: Path, dat: str | None) -> Path:
    """The .dat (decompressed), from ``dat`` or the face_recognition_models sdist."""
    if dat is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", str(workdir), SDIST], check=True)
        sdist = next(workdir.glob("face_recognition_models-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(MEMBER))
            data = tar.extractfile(member).read()
    else:
        data = Path(dat).read_bytes()
        if data[:3] == b"BZh":
            data = bz2.decompress(data)
    path = workdir / "mmod_human_face_detector.dat"
    path.write_bytes(data)
    return path


# --- the check against dlib -------------------------------------------------------------------------------

def portrait_crop() -> tuple[np.ndarray, Path]:
    """The shipped portrait tests/test_mmod.py scores, as the crop scorer sees it: the first portrait's crop of
    CROP_SIZE pixels (see tests/test_mmod.py: ``portrait_crop``)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_mmod import portrait_crop as crop

    return crop()


def check(dat: Path, weights: Path) -> tuple[float, int]:
    """Largest |torch - dlib| over dlib's detections on the check photos, and how many detections were compared.
    A detection not found in the PyTorch map (no point whose box is dlib's box) fails the check."""
    import cv2
    import dlib
    from emonet.detection.mmod import CropScorer, TiledPyramid, detection_map_points, load_mmod

    net = load_mmod("cpu", weights)
    detector = dlib.cnn_face_detection_model_v1(str(dat))
    photos = []
    for path in CHECK_PHOTOS + sorted(PORTRAITS.glob("*.jpg")):
        image = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
        photos.append((path.name, image))
        photos.append((path.name + " (half size)", cv2.resize(image, None, fx=0.5, fy=0.5,
                                                                interpolation=cv2.INTER_AREA)))
    worst, compared = 0.0, 0
    for name, image in photos:
        image = np.ascontiguousarray(image)
        found = detector(image, 0)
        pyramid = TiledPyramid(*image.shape[:2])
        x = torch.from_numpy(image).permute(2, 0, 1)[None].float()
        with torch.inference_mode():
            out = net(pyramid(net.normalise(x)))[0, 0].numpy()
        _, points = detection_map_points(pyramid.shape)
        boxes = pyramid.boxes(points, net.window)
        scores = out.reshape(-1)
        for d in found:
            r = d.rect
            same = np.flatnonzero((boxes == [r.left(), r.top(), r.right(), r.bottom()]).all(axis=1))
            if not len(same):
                print(f"FAIL {name}: dlib's detection {r} (confidence {d.confidence:.4f}) is no box of the map")
                return float("inf"), compared
            diff = float(np.abs(scores[same] - d.confidence).min())
            worst, compared = max(worst, diff), compared + 1
        best = max((d.confidence for d in found), default=None)
        top = float(scores.max())
        if best is not None:
            worst = max(worst, abs(top - best))
        print(f"{name:28s} {image.shape[1]}x{image.shape[0]}: {len(found)} detection(s), dlib best "
              f"{'-' if best is None else f'{best:.4f}'}, torch map best {top:.4f}")
    crop, path = portrait_crop()
    scorer = CropScorer(net, CROP_SIZE)
    ours = float(scorer(torch.from_numpy(crop).permute(2, 0, 1)[None].float())[0])
    centre = [d.confidence for d in detector(np.ascontiguousarray(crop), 0)
              if all(CROP_SIZE / 3 <= v <= 2 * CROP_SIZE / 3
                     for v in ((d.rect.left() + d.rect.right()) / 2, (d.rect.top() + d.rect.bottom()) / 2))]
    theirs = max(centre, default=float("nan"))
    worst = max(worst, abs(ours - theirs)) if centre else float("inf")
    print(f"crop of {path.name} ({CROP_SIZE} px): dlib {theirs:.4f}, CropScorer {ours:.4f} "
          f"(tests/test_mmod.py expects the latter)")
    return worst, compared


NOTICE_TEXT = """emonet/detection/mmod.pth
=========================

PyTorch weights of dlib's CNN face detector (the third look of the detectors' close look,
emonet/detection/mmod.py), converted by tools/convert_mmod.py from mmod_human_face_detector.dat as shipped in
the PyPI sdist face_recognition_models 0.3.0 (Adam Geitgey; the same file as davisking/dlib-models'
mmod_human_face_detector.dat.bz2). The model is Davis E. King's ("Max-Margin Object Detection", 2015; dlib,
http://dlib.net), trained on a data set he labelled from images of ImageNet, AFLW, Pascal VOC, the VGG data set,
WIDER and face scrub. davisking/dlib-models (README.md) says of its model files: "As far as I am concerned,
anyone can do whatever they want with these model files as I've released them into the public domain", and its
LICENSE is the Creative Commons CC0 1.0 Universal public domain dedication
(https://creativecommons.org/publicdomain/zero/1.0/). These converted weights are likewise in the public domain.

What was converted, and how: the file's seven convolutions (weights and biases, unchanged) and six batch norms,
turned into per-channel affines y = gamma * x + beta exactly as dlib does when it loads them into its
affine_ layers (gamma / sqrt(running_variance + eps), beta - running_mean * gamma / sqrt(running_variance + eps),
in float64, stored as float32), the input layer's mean colour ({mean}) and the loss's detector
window ({window}). tools/convert_mmod.py --check compares the network with dlib (dlib-bin) on real photos.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the committed weights")
    parser.add_argument("--dat", help="mmod_human_face_detector.dat (or .dat.bz2) already on disk")
    parser.add_argument("--weights", default=str(OUT), help="with --check: the weights to check (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dat = fetch_dat(Path(tmp), args.dat)
        if not args.check:
            options, layers = read_dat(dat.read_bytes())
            print("read:", {k: v for k, v in options.items()}, f"{len(layers)} layers")
            state = to_state_dict(options, layers)
            torch.save(state, OUT)
            NOTICE.write_text(NOTICE_TEXT.format(mean=", ".join(f"{v:.3f}" for v in options["mean"]),
                                                 window="x".join(str(v) for v in options["window"])))
            print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB) and {NOTICE.name}")
        worst, compared = check(dat, OUT if not args.check else Path(args.weights))
    ok = worst <= TOLERANCE and compared > 0
    print(f"{'PASS' if ok else 'FAIL'}: {compared} dlib detections, largest |torch - dlib| confidence "
          f"{worst:.2e} (tolerance {TOLERANCE:.0e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
