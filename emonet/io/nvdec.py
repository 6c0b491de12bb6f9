"""Decoding on the GPU's own video decoder (NVDEC), through NVIDIA's PyNvVideoCodec where it is installed.

For runs whose CPU is wanted elsewhere: while an annotated video is written, x264 takes every core it is
given, and PyAV's decoding threads would take a fifth of them. One NVDEC decoder gives fewer frames/s than
PyAV's frame threads on a server's cores (docs/PERFORMANCE.md), so analysis alone decodes on the CPU unless
asked otherwise.

NVDEC's NV12 planes are FFmpeg's yuv420p planes, the chroma interleaved; they stay on the GPU, where
:func:`emonet.io.video.i420_to_rgb` converts them as it does the CPU path's. Only what NVDEC decodes as
the CPU path would is decoded here: 8-bit 4:2:0 H.264, HEVC, VP9 or AV1 in a file, from its first frame,
without a rotation to apply. The header (frame rate, frame count, colours) is PyAV's, the CPU path's own.
"""
from __future__ import annotations

import importlib.util

import torch

CODECS = ("h264", "hevc", "vp9", "av1")
AHEAD = 16  # frames decoded ahead, as many as the CPU path's slots
BATCH = 8   # frames taken, and converted, at a time


class Unsupported(Exception):
    """Why a video is not decoded by NVDEC (it is then decoded on the CPU)."""


def available() -> bool:
    """True where PyNvVideoCodec is installed (NVDEC itself also needs an NVIDIA GPU)."""
    return importlib.util.find_spec("PyNvVideoCodec") is not None


class NvdecVideo:
    """One file's frames, decoded by NVDEC on ``device`` ahead of :meth:`next_batch`, which gives them as NV12.

    ``fps``, ``frame_count``, ``shape`` (``(H, W, 3)`` of the first frame) and ``layout`` (as the CPU path's
    decoder says it: ``i420:MATRIX:RANGE``) describe it; ``stream`` is the CUDA stream NVDEC's copies are
    queued on, the one to read the frames on. Raises :class:`Unsupported` for a file left to the CPU.
    """

    def __init__(self, path: str, device: torch.device) -> None:
        if not available():
            raise Unsupported("NVIDIA's PyNvVideoCodec is not installed (pip install PyNvVideoCodec)")
        if device.type != "cuda":
            raise Unsupported("no CUDA GPU")
        self._probe(path)
        import PyNvVideoCodec as nvc
        self.stream = torch.cuda.Stream(device)
        try:
            self._decoder = nvc.ThreadedDecoder(path, buffer_size=AHEAD, gpu_id=device.index or 0,
                                                cuda_stream=self.stream.cuda_stream, use_device_memory=True)
        except Exception as exc:  # noqa: BLE001 (PyNvVCException and the like: NVDEC cannot take it)
            raise Unsupported(f"NVDEC cannot open it ({str(exc).strip().splitlines()[0]})") from None

    def _probe(self, path: str) -> None:
        from .containers import open_pyav, presentation_times
        reader = open_pyav(path)
        if reader is None:
            raise Unsupported("not a file PyAV hands over as 4:2:0 planes")
        try:
            context = reader.container.streams.video[0].codec_context
            if context.name not in CODECS:
                raise Unsupported(f"{context.name} is not one of NVDEC's codecs here ({', '.join(CODECS)})")
            if context.pix_fmt not in ("yuv420p", "yuvj420p"):
                raise Unsupported(f"{context.pix_fmt} frames (NVDEC here: 8-bit 4:2:0)")
            first = reader.first()
            if first is None:
                raise Unsupported("no frame decoded, or a rotation to apply")
            self.fps, self.frame_count, self.layout = reader.fps, reader.count, reader.layout
            self.declared = reader.declared
            self.shape = (first.height, first.width, 3)
        finally:
            reader.close()
        self.times = presentation_times(path)

    def next_batch(self) -> list[torch.Tensor]:
        """Up to :data:`BATCH` next frames, each ``(H * 3 // 2, W)`` uint8 NV12 on the GPU, ordered on
        :attr:`stream`; an empty list at the end."""
        return [torch.from_dlpack(frame) for frame in self._decoder.get_batch_frames(BATCH)]

    def close(self) -> None:
        """Stop decoding ahead."""
        self._decoder.end()
