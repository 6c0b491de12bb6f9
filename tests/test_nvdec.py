"""Decoding on NVDEC (emonet.io.nvdec), through the video reader: the CPU path's frames, from the GPU's decoder.

Without PyNvVideoCodec or a GPU the reader decodes on the CPU and says why (checked on any machine); the
NVDEC tests themselves run where both are (the GPU machines).
"""
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from emonet.engine.check import SAMPLE_PHOTO
from emonet.io import nvdec
from emonet.io.video import VideoReader

pytestmark = pytest.mark.slow  # end-to-end: the tools in processes of their own

needs_nvdec = pytest.mark.skipif(not (torch.cuda.is_available() and nvdec.available()),
                                 reason="needs an NVIDIA GPU and PyNvVideoCodec")


def h264_clip(path: Path, frames: int, size=(320, 240), fps: int = 25, bt709: bool = False) -> Path:
    """The test photo moving over a gradient, H.264 with B-frames (decoded out of order), through PyAV."""
    import av

    w, h = size
    face = cv2.resize(cv2.imread(str(SAMPLE_PHOTO)), (h // 2, h // 2))[..., ::-1]
    background = np.dstack([np.tile(np.linspace(20, 220, w, dtype=np.uint8), (h, 1))] * 3)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"preset": "veryfast", "bf": "3"}
        if bt709:
            stream.codec_context.colorspace = av.video.reformatter.Colorspace.ITU709
        for i in range(frames):
            rgb = background.copy()
            x = (7 * i) % (w - h // 2)
            rgb[h // 4:h // 4 + h // 2, x:x + h // 2] = face
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
                format="yuv420p", dst_colorspace=av.video.reformatter.Colorspace.ITU709 if bt709 else None)
            if bt709:
                frame.colorspace = av.video.reformatter.Colorspace.ITU709
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


def pixels(reader: VideoReader, device) -> list[np.ndarray]:
    out = [frame.on_device(device).cpu().numpy() for frame in reader]
    reader.close()
    return out


def test_without_nvdec_the_reader_decodes_on_the_cpu_and_says_why(tmp_path):
    clip = h264_clip(tmp_path / "c.mp4", 12)
    reader = VideoReader(str(clip), use_nvdec=True)  # no device: the CPU
    assert not reader.nvdec
    assert reader.nvdec_refused in ("NVIDIA's PyNvVideoCodec is not installed (pip install PyNvVideoCodec)",
                                    "no CUDA GPU")
    frames = [f.image for f in reader]
    reader.close()
    plain = VideoReader(str(clip))
    expected = [f.image for f in plain]
    plain.close()
    assert len(frames) == len(expected) == 12
    assert all(np.array_equal(a, b) for a, b in zip(frames, expected))


@needs_nvdec
@pytest.mark.parametrize("bt709", [False, True])
def test_nvdec_gives_the_cpu_paths_frames(tmp_path, bt709):
    device = torch.device("cuda:0")
    clip = h264_clip(tmp_path / "c.mp4", 2 * nvdec.BATCH + 5, bt709=bt709)  # whole batches and the rest
    reader = VideoReader(str(clip), device=device, keep_host=False, use_nvdec=True)
    assert reader.nvdec and reader.nvdec_refused is None
    assert (reader.fps, reader.frame_count, reader.frame_shape) == (25.0, 21, (240, 320, 3))
    frames = list(reader)
    reader.close()
    assert [f.index for f in frames] == list(range(21)) and frames[3].timestamp == pytest.approx(3 / 25)
    expected = pixels(VideoReader(str(clip), device=device, keep_host=False), device)
    # NVDEC's planes are FFmpeg's, converted by the same arithmetic on the same GPU: identical pixels
    assert all(np.array_equal(f.on_device(device).cpu().numpy(), e) for f, e in zip(frames, expected))
    assert np.array_equal(frames[0].image, expected[0])  # the host copy, made on demand


@needs_nvdec
def test_nvdec_stops_where_the_cpu_path_stops(tmp_path):
    device = torch.device("cuda:0")
    clip = h264_clip(tmp_path / "c.mp4", 30)
    for options in ({"max_frames": 10}, {"end": 0.5}, {"max_frames": 1}):
        ours = VideoReader(str(clip), device=device, use_nvdec=True, **options)
        theirs = VideoReader(str(clip), device=device, **options)
        assert ours.nvdec and ours.expected_frames == theirs.expected_frames
        assert [f.index for f in ours] == [f.index for f in theirs]
        ours.close()
        theirs.close()
    # closed part-way: decoding stops, nothing waits
    reader = VideoReader(str(clip), device=device, use_nvdec=True)
    for frame in reader:
        if frame.index == 3:
            break
    reader.close()


@needs_nvdec
def test_what_nvdec_does_not_decode_goes_to_the_cpu(tmp_path):
    device = torch.device("cuda:0")
    mpeg4 = tmp_path / "m.mp4"
    writer = cv2.VideoWriter(str(mpeg4), cv2.VideoWriter_fourcc(*"mp4v"), 25, (320, 240))
    for i in range(5):
        writer.write(np.full((240, 320, 3), 40 * i, np.uint8))
    writer.release()
    clip = h264_clip(tmp_path / "c.mp4", 12)
    for source, options, why in ((mpeg4, {}, "mpeg4 is not one of NVDEC's codecs"),
                                 (clip, {"start": 0.2}, "--start")):
        reader = VideoReader(str(source), device=device, use_nvdec=True, **options)
        assert not reader.nvdec and why in reader.nvdec_refused
        assert len(list(reader)) > 0
        reader.close()
