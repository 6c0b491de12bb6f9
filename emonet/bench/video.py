"""A video end to end against the released demo's way of working (``python -m emonet.bench --video``), and the
made-up clip the benchmarks and tests use (:func:`make_clip`)."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional


def make_clip(path: Path, width: int = 1280, height: int = 720, frames: int = 300, fps: float = 30.0,
              noise: bool = False) -> Path:
    """An H.264 clip with one face (the test photo) moving over a textured background.

    The background is smooth texture, as in filmed scenes; ``noise=True`` makes it per-pixel noise
    instead, the hardest content for an encoder (nothing in it can be predicted).
    """
    import cv2
    import numpy as np
    from ..engine.check import SAMPLE_PHOTO
    from ..io.writer import VideoWriter

    face = cv2.imread(str(SAMPLE_PHOTO))
    side = height // 2
    face = cv2.resize(face, (side, side))
    writer = VideoWriter(path, fps, (width, height))
    rng = np.random.default_rng(0)
    background = rng.integers(30, 90, (height, width, 3), dtype=np.uint8)
    if not noise:
        texture = cv2.GaussianBlur(rng.normal(0, 1, (height, width, 3)).astype(np.float32), (0, 0), 12)
        background = cv2.normalize(texture, None, 40, 200, cv2.NORM_MINMAX).astype(np.uint8)
    for i in range(frames):
        canvas = background.copy()
        x = int((width - side) * (0.5 + 0.45 * np.sin(i / 40)))
        y = int((height - side) * (0.5 + 0.3 * np.cos(i / 55)))
        canvas[y:y + side, x:x + side] = face
        writer.write(cv2.cvtColor(canvas, cv2.COLOR_BGR2RGB))
    writer.close()
    return path


def released_way(clip: Path, device: str, output: Optional[Path]) -> float:
    """Frames/s of the released demo's way: decode in the loop; every frame detect, crop, batch-1 fp32 EmoNet."""
    import cv2
    from ..engine.graphs import synchronize
    from ..models.weights import load_model
    from ..detection.blazeface import BlazeFaceDetector
    from ..drawing import annotate
    from ..engine import Engine, EngineConfig
    from ..pipeline import Pipeline
    from ..runtime import RuntimeConfig, configure
    from ..io.writer import VideoWriter

    dev = configure(RuntimeConfig(device=device, cudnn_benchmark=False))
    engine = Engine(load_model("random", device="cpu"), dev, EngineConfig(warmup=False), log=lambda m: None)
    pipeline = Pipeline(engine, BlazeFaceDetector(dev))
    cap = cv2.VideoCapture(str(clip))
    writer, frames = None, 0
    start = time.perf_counter()
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        faces = pipeline([rgb])[0][:1]  # one face per frame, as the released demo
        if output is not None:
            if writer is None:
                # The released way's writer: OpenCV's mp4v.
                writer = VideoWriter(output, 30.0, (rgb.shape[1], rgb.shape[0]), codec="mp4v")
            writer.write(annotate(rgb, faces, engine.class_names))
        frames += 1
    if dev.type == "cuda":
        synchronize(dev)
    elapsed = time.perf_counter() - start
    if writer:
        writer.close()
    return frames / elapsed


def decode_loop(clip: Path) -> float:
    """Frames/s of OpenCV decoding alone: ``VideoCapture.read`` in a loop, frames left as decoded (BGR), on
    the video tool's FFmpeg threads.

    The reference "what decoding allows": no colour conversion, copy or hand-over between threads.
    """
    from ..io.containers import open_capture
    cap = open_capture(str(clip))
    n, start = 0, time.perf_counter()
    while cap.read()[0]:
        n += 1
    elapsed = time.perf_counter() - start
    cap.release()
    return n / elapsed


def decode_only(clip: Path, device: Optional[str] = None) -> float:
    """Frames/s of the video tool's reader alone: RGB host frames, or with ``device`` uploaded (RGB on the GPU)."""
    import torch
    from ..io.video import VideoReader
    reader = VideoReader(str(clip), device=torch.device(device) if device else None, keep_host=not device)
    start = time.perf_counter()
    n = sum(1 for _ in reader)
    elapsed = time.perf_counter() - start
    reader.close()
    return n / elapsed


def video_benchmark(clip: Optional[str], device: str, engines: list[str], repeat: int = 1) -> str:
    """The video table: decoding alone, the released way, and demo_video.py (analysis only with each engine,
    and with the annotated video), analysis and the default annotated video run ``repeat`` times."""
    import re
    import statistics
    with tempfile.TemporaryDirectory(prefix="emonet-video-") as tmp:
        path = Path(clip) if clip else make_clip(Path(tmp) / "clip720p.mp4", frames=900)
        reference = decode_loop(path)
        rows = [("decoding alone: OpenCV read loop, BGR (the reference)", [reference])]
        rows.append(("the tool's reader alone, RGB frames in host memory", [decode_only(path)]))
        if device.startswith("cuda"):
            rows.append(("the tool's reader alone, frames uploaded (RGB on the GPU)", [decode_only(path, device)]))
        rows.append(("released way, analysis only", [released_way(path, device, None)]))
        rows.append(("released way + annotated video", [released_way(path, device, Path(tmp) / "released.mp4")]))
        script = ["-m", "emonet.apps.video"]
        runs = [(f"demo_video.py --no-video --engine {e}", ["--no-video", "--csv", str(Path(tmp) / "f.csv"),
                                                           "--engine", e], repeat) for e in engines]
        # The default annotated video as often as analysis alone (their ratio is the cost of the video); then
        # decoded on the CPU (the default decodes on NVDEC where PyNvVideoCodec is installed), mp4v.
        for codec, decoder in (("h264", "auto"), ("h264", "cpu"), ("mp4v", "auto")):
            runs.append((f"demo_video.py --output (annotated video) --codec {codec} --decoder {decoder} "
                         f"--engine {engines[0]}",
                         ["--output", str(Path(tmp) / f"o-{codec}.mp4"), "--codec", codec, "--decoder", decoder,
                          "--engine", engines[0]],
                         repeat if (codec, decoder) == ("h264", "auto") else 1))
        notes = []
        for label, args, times in runs:
            cmd = [sys.executable, *script, "--video", str(path), "--weights", "random", "--device", device, *args]
            rates = []
            for _ in range(times):
                proc = subprocess.run(cmd, capture_output=True, text=True)
                m = re.search(r"([\d.]+) frames/s end to end", proc.stderr)
                rates.append(float(m.group(1)) if m else float("nan"))
                for pattern in (r"engine warm-up.*", r"time per frame by stage.*", r"CPU-seconds:.*"):
                    line = re.search(pattern, proc.stderr)
                    if line:
                        notes.append(f"{label}, run {len(rates)}: {line.group(0)}")
            rows.append((label, rates))
        import cv2
        cap = cv2.VideoCapture(str(path))
        size = f"{int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))}x{int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))}, " \
               f"{int(cap.get(cv2.CAP_PROP_FRAME_COUNT))} frames"
    released = {"analysis": rows[-len(runs) - 2][1][0], "video": rows[-len(runs) - 1][1][0]}
    lines = [f"Video clip: {size}", "",
             "| way | frames/s (median) | runs | vs released way | of decoding alone |", "|---|---|---|---|---|"]
    for name, rates in rows:
        mid = statistics.median(rates)
        each = ", ".join(f"{r:.1f}" for r in rates) if len(rates) > 1 else ""
        # Analysis against the released way's analysis; the annotated video against its annotated video.
        vs = f"{mid / released['video' if '--output' in name else 'analysis']:.1f}×" if name.startswith("demo_video") else ""
        lines.append(f"| {name} | {mid:.1f} | {each} | {vs} | {100 * mid / reference:.0f} % |")
    return "\n".join(lines + [""] + notes)
