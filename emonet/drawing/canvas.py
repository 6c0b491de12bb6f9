"""The annotated video's frames, drawn with torch where the frames already are (the GPU, when there is one).

Each frame becomes the frame with its faces marked and a side panel beside it (the main face's crop, a
caption, and every face's valence/arousal point with its trail on a circumplex), then I420 (yuv420p,
BT.601 limited range), which is what the H.264 encoder takes: only 1.5 bytes a pixel go back to the
host. What is laid over a chunk is planned on the host with NumPy (:mod:`.marks`) as a few arrays; the
chunk is then drawn in a fixed number of tensor operations whatever it holds:

- *sprites* (labels, circumplex discs, captions) are gathered from the chunk's new pixels, uploaded in
  one copy, and the atlas of kept ones on the device, and laid over the frames by one gather, blend and
  scatter per layer (sprites that overlap go to separate layers, so the later one is on top, as when
  drawn one by one);
- *marks* (boxes' sides, trails, landmarks and dots) go up as one table of rectangles, segments and dot
  centres, the device turns them all into pixels in one pass, and one scatter sets them (the later mark on
  top where they overlap);
- the panel's crops are one ``grid_sample`` from the frames.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..results import FaceResult
from .marks import (P_AX, P_AY, P_CLIP, P_COLOR, P_FIRST, P_FRAME, P_OFFSET, P_PIXELS, P_SPAN, P_STEP, P_WIDTH,
                    P_X, P_Y, PANEL_GREY, ChunkMarks, Color, Planner, coded_size, dot_offsets,
                    panel_layout)
from .opencv import banner_sprite, disc_sprite, lay

# RGB -> Y'CbCr, BT.601 limited range (what players assume for yuv420p video without other colour tags).
_RGB_TO_YUV = torch.tensor([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])
_YUV_SCALE = torch.tensor([219.0, 224.0, 224.0]) / 255.0
_YUV_OFFSET = torch.tensor([16.0, 128.0, 128.0])


class VideoCanvas:
    """``draw(images, faces, colors)``: a chunk of annotated frames as I420, on the images' device.

    ``render(images, marks)`` draws a chunk planned elsewhere (a :class:`~.marks.Planner` or
    the drawing process's, of this canvas's video alone, chunks in order): ``draw`` is ``render`` of
    the canvas's own planner's marks. The first chunk's frame size is the video's: a frame of another size
    is resized to it (its faces are scaled by the planner), and ``resized`` is set.
    """

    def __init__(self, class_names: Sequence[str], banner: Optional[str] = None,
                 device: torch.device = torch.device("cpu")) -> None:
        self.class_names = list(class_names)
        self.banner = banner
        self.device = torch.device(device)
        self.shape: Optional[tuple[int, int]] = None  # (H, W) of the video's frames
        self.resized = False
        self._planner: Optional[Planner] = None  # draw()'s
        self._canvas: Optional[torch.Tensor] = None
        self._background: Optional[torch.Tensor] = None
        self._banner: Optional[torch.Tensor] = None
        self._grid: Optional[torch.Tensor] = None
        self._atlas = torch.zeros((0, 4), dtype=torch.uint8, device=self.device)  # kept sprites (see .marks)
        self._last: Optional[torch.Tensor] = None  # scratch: the last mark at each pixel
        self._dots: Optional[torch.Tensor] = None  # dots' pixel offsets (dot_offsets), up to the largest radius yet
        self._dots_reach = -1
        self._storage: Optional[torch.Tensor] = None
        self._yuv = (_RGB_TO_YUV * _YUV_SCALE[:, None]).T.to(self.device)
        self._offset = _YUV_OFFSET.to(self.device)
        # Page-locked staging for a chunk's uploads, two in turn: a fresh page-locked copy per upload
        # (pin_memory) cost more host time than the copy itself.
        self._staging: list[Optional[torch.Tensor]] = [None, None]
        self._staged_done: list[Optional["torch.cuda.Event"]] = [None, None]
        self._turn = 0
        self._staged = 0   # bytes of this chunk's uploads so far
        self._wanted = 0   # bytes a chunk's uploads have needed

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` of the frames drawn (after the first chunk)."""
        return coded_size(*self.shape)

    def _start(self, h: int, w: int) -> None:
        self.shape = (h, w)
        width, _, radius, center = panel_layout(h)
        panel = np.full((h, width, 3), PANEL_GREY, np.uint8)
        lay(panel, disc_sprite(radius), center[0] - radius - 1, center[1] - radius - 1)
        self._background = torch.from_numpy(panel).to(self.device)
        if self.banner:
            self._banner = torch.from_numpy(banner_sprite(self.banner, w)).to(self.device)

    def draw(self, images: Sequence[torch.Tensor], faces: Sequence[Sequence[tuple[FaceResult, Sequence]]],
             colors: Sequence[Sequence[Color]]) -> torch.Tensor:
        """``images``: (H, W, 3) uint8 RGB tensors on the canvas's device; ``faces``: per image, its faces,
        each with its valence/arousal trail (oldest first); ``colors``: per image, a colour per face (the
        face's mark on the panel). Returns ``(len(images), width * height * 3 // 2)`` uint8, I420 planes."""
        if self._planner is None:
            self._planner = Planner(self.class_names, banner=bool(self.banner))
        return self.render(images, self._planner.plan([tuple(i.shape[:2]) for i in images], faces, colors))

    def render(self, images: Sequence[torch.Tensor], marks: ChunkMarks) -> torch.Tensor:
        """The chunk's ``images`` with its ``marks`` laid over, as :meth:`draw` returns them."""
        if self.shape is None:
            self._start(*images[0].shape[:2])
        if tuple(marks.shape) != self.shape:
            raise ValueError(f"marks planned for frames of {marks.shape}, the video's are {self.shape}")
        h, w = self.shape
        images = list(images)
        for b, image in enumerate(images):
            if tuple(image.shape[:2]) != (h, w):  # the source changed size: resized (the planner scaled its faces)
                chw = image.permute(2, 0, 1)[None].float()
                images[b] = F.interpolate(chw, (h, w), mode="bilinear", antialias=True,
                                          align_corners=False)[0].round().clamp(0, 255).byte().permute(1, 2, 0)
                self.resized = True
        self._begin_uploads()
        canvas = self._frames(images)
        self._crops(canvas, images, marks)
        self._lay_sprites(canvas, marks)
        self._set_points(canvas, marks)
        if self._banner is not None:
            self._lay(canvas[:, :self._banner.shape[0], :w], self._banner)
        self._end_uploads()
        return self._i420(canvas)

    # -- the frames and the panel's background ---------------------------------------------------
    def _frames(self, images: list[torch.Tensor]) -> torch.Tensor:
        h, w = self.shape
        width, height = self.size
        if self._canvas is None or self._canvas.shape[0] != len(images):
            # Zeros once: the rounding to even sides stays black. Reused by the next chunk, which the
            # stream orders after this one's conversion. One spare pixel past the frames (see _flat).
            self._storage = torch.zeros(len(images) * height * width * 3 + 3, dtype=torch.uint8, device=self.device)
            self._canvas = self._storage[:-3].view(len(images), height, width, 3)
        canvas = self._canvas
        canvas[:, :h, :w] = torch.stack(images) if len(images) > 1 else images[0]  # two copies, not one per frame
        canvas[:, :h, w:w + self._background.shape[1]] = self._background
        return canvas

    def _crops(self, canvas: torch.Tensor, images: list[torch.Tensor], marks: ChunkMarks) -> None:
        """Each frame's main face cut to the panel's crop square by one ``grid_sample``."""
        if not len(marks.crop_frames):
            return
        h, w = self.shape
        width, side, _, _ = panel_layout(h)
        x0 = w + (width - side) // 2
        which = marks.crop_frames.tolist()
        grid = torch.einsum("nij,uvj->nuvi", self._upload(marks.crop_maps), self._pixels(side))
        source = torch.stack([images[b] for b in which]).permute(0, 3, 1, 2).float()
        crops = F.grid_sample(source, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        crops = crops.round_().clamp_(0, 255).byte().permute(0, 2, 3, 1)
        if len(which) == len(images):
            canvas[:, :side, x0:x0 + side] = crops
        else:
            canvas[self._upload(marks.crop_frames), :side, x0:x0 + side] = crops

    def _pixels(self, side: int) -> torch.Tensor:
        """``(side, side, 3)``: each crop pixel's ``(u, v, 1)``, kept on the device."""
        if self._grid is None or self._grid.shape[0] != side:
            axis = torch.arange(side, dtype=torch.float32)
            self._grid = torch.stack(torch.broadcast_tensors(axis[None, :], axis[:, None], torch.ones(1)), -1).to(self.device)
        return self._grid

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device, without waiting: through page-locked memory (a copy from pageable
        memory would first wait for everything queued on the GPU)."""
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type != "cuda":
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        at, self._staged = self._staged, self._staged + -(-nbytes // 16) * 16  # aligned for any dtype
        buffer = self._staging[self._turn]
        if buffer is None or self._staged > buffer.numel():  # a larger buffer from the next chunk on
            self._wanted = max(self._wanted, self._staged)
            return tensor.pin_memory().to(self.device, non_blocking=True)
        part = buffer[at:at + nbytes].view(tensor.dtype).view(tensor.shape)
        part.copy_(tensor)
        return part.to(self.device, non_blocking=True)

    def _begin_uploads(self) -> None:
        """Take the staging buffer used two chunks ago (its copies have long run) for this chunk's uploads."""
        if self.device.type != "cuda":
            return
        self._turn ^= 1
        if self._staged_done[self._turn] is not None:
            self._staged_done[self._turn].synchronize()
        buffer = self._staging[self._turn]
        if self._wanted > (buffer.numel() if buffer is not None else 0):
            self._staging[self._turn] = torch.empty(self._wanted * 3 // 2, dtype=torch.uint8, pin_memory=True)
        self._staged = 0

    def _end_uploads(self) -> None:
        if self.device.type == "cuda":
            self._staged_done[self._turn] = torch.cuda.Event()
            self._staged_done[self._turn].record()

    # -- what is laid over ------------------------------------------------------------------------
    @staticmethod
    def _lay(region: torch.Tensor, rgba: torch.Tensor) -> None:
        """Lay premultiplied RGBA over ``region`` (same leading shape, or broadcast), in place."""
        alpha = rgba[..., 3:].to(torch.int32)
        region.copy_(((region.to(torch.int32) * (255 - alpha) + 127) // 255 + rgba[..., :3]).clamp_(0, 255))

    def _lay_sprites(self, canvas: torch.Tensor, marks: ChunkMarks) -> None:
        if marks.atlas_add is not None:  # kept sprites new to the atlas (at 0: a new atlas)
            kept = self._atlas[:marks.atlas_at] if marks.atlas_at else self._atlas[:0]
            self._atlas = torch.cat([kept, torch.from_numpy(marks.atlas_add).to(self.device)])
        if marks.atlas_at > len(self._atlas):
            raise ValueError("marks planned for another canvas (its sprite atlas is not this one's)")
        if not len(marks.sprites):
            return
        table = self._upload(marks.sprites)
        total = int(marks.layer_pixels.sum())
        # The sprites' pixels: this chunk's new ones, uploaded in one copy, then the atlas.
        source = self._atlas
        if len(marks.sprite_pixels):
            source = torch.cat([self._upload(marks.sprite_pixels), self._atlas])
        # Each pixel's sprite, its place in the source, and its place on the canvas (flat index over
        # frames, rows and columns).
        owner = torch.repeat_interleave(torch.arange(len(table), device=self.device), table[:, 5], output_size=total)
        b, x, y, wd, start, _, first, stride = table[owner].unbind(1)
        local = torch.arange(total, device=self.device) - start
        ly = torch.div(local, wd, rounding_mode="floor")
        lx = local - ly * wd
        data = source[first + ly * stride + lx]
        _, height, width, _ = canvas.shape
        index = (b * height + y + ly) * width + x + lx
        flat = canvas.view(-1, 3)
        # One gather, blend and scatter per layer: within a layer no two sprites share a pixel.
        edges = np.concatenate([[0], np.cumsum(marks.layer_pixels)])
        for lo, hi in zip(edges[:-1], edges[1:]):
            idx = index[lo:hi]
            under = flat[idx]
            self._lay(under, data[lo:hi])
            flat[idx] = under

    def _set_points(self, canvas: torch.Tensor, marks: ChunkMarks) -> None:
        """Rectangles, lines and dots (one table, :func:`~.marks.point_table`) turned into pixels on the device in
        one pass (the same operations whatever the chunk holds), then set in one scatter."""
        if marks.points is None:
            return
        n, height, width, _ = canvas.shape
        dev = self.device
        floats, ints = marks.points
        total = int(ints[-1, P_FIRST] + ints[-1, P_PIXELS])
        f, k = self._upload(floats), self._upload(ints)
        owner = torch.repeat_interleave(torch.arange(len(k), device=dev), k[:, P_PIXELS], output_size=total)
        f, k = f[owner], k[owner]
        local = torch.arange(total, device=dev, dtype=torch.int32) - k[:, P_FIRST]
        j = torch.div(local, k[:, P_WIDTH], rounding_mode="floor")
        i = local - j * k[:, P_WIDTH]
        xy = torch.round(f[:, P_X:P_Y + 1] + f[:, P_AX:P_AY + 1] * (i / f[:, P_SPAN])[:, None])
        xy[:, 1] += j
        xy += self._dot_offsets(marks.largest_dot)[(k[:, P_OFFSET] + k[:, P_STEP] * i).long()]
        inside = ((xy >= k[:, P_CLIP:P_CLIP + 2]) & (xy < k[:, P_CLIP + 2:P_CLIP + 4])).all(1)
        x, y = xy.long().unbind(1)
        # Outside its clip: the spare pixel past the frames.
        index = torch.where(inside, (k[:, P_FRAME].long() * height + y) * width + x, n * height * width)
        packed = k[:, P_COLOR].long()
        # Where marks overlap, the later one is on top: every write to a pixel carries the colour of the
        # last mark there (found by a max over mark numbers), so the scatter's order cannot matter.
        if self._last is None or self._last.numel() < n * height * width + 1:
            self._last = torch.empty(n * height * width + 1, dtype=torch.int64, device=dev)
        order = torch.arange(len(index), device=dev)
        self._last.index_fill_(0, index, -1)
        self._last.scatter_reduce_(0, index, order, reduce="amax")
        winner = packed[self._last[index]]
        rgb = torch.stack([winner // 65536, winner // 256 % 256, winner % 256], 1).to(torch.uint8)
        self._flat(canvas)[index] = rgb

    def _dot_offsets(self, largest: int) -> torch.Tensor:
        """:func:`~.marks.dot_offsets` up to ``largest`` or beyond, kept on the device (made again only for a
        larger dot than any before)."""
        if largest > self._dots_reach:
            self._dots, self._dots_reach = torch.from_numpy(dot_offsets(largest)).to(self.device), largest
        return self._dots

    def _flat(self, canvas: torch.Tensor) -> torch.Tensor:
        """The canvas as ``(pixels + 1, 3)``: the last, spare pixel takes the marks that fall outside."""
        return self._storage.view(-1, 3)[:canvas.shape[0] * canvas.shape[1] * canvas.shape[2] + 1]

    # -- to the encoder's pixel format ---------------------------------------------------------------
    def _i420(self, canvas: torch.Tensor) -> torch.Tensor:
        n, height, width, _ = canvas.shape
        out = torch.empty((n, height * width * 3 // 2), dtype=torch.uint8, device=self.device)
        # In float, 12 bytes a pixel: a few frames at a time on the CPU, whose memory is scarcer.
        step = n if self.device.type == "cuda" else 4
        for lo in range(0, n, step):
            self._i420_into(canvas[lo:lo + step], out[lo:lo + step])
        return out

    def _i420_into(self, canvas: torch.Tensor, out: torch.Tensor) -> None:
        n, height, width, _ = canvas.shape
        rgb = canvas.float()
        # Weighted sums, not matrix products: those may run in TF32, a level off here and there.
        luma = (rgb * self._yuv[:, 0]).sum(-1) + self._offset[0]
        out[:, :height * width].view(n, height, width).copy_(luma.round_().clamp_(0, 255))
        # Chroma from each 2x2 block's mean colour.
        mean = rgb.view(n, height // 2, 2, width // 2, 2, 3).mean((2, 4))
        chroma = ((mean[..., None] * self._yuv[:, 1:]).sum(-2) + self._offset[1:]).round_().clamp_(0, 255)
        quarter = height * width // 4
        out[:, height * width:height * width + quarter].view(n, height // 2, width // 2).copy_(chroma[..., 0])
        out[:, height * width + quarter:].view(n, height // 2, width // 2).copy_(chroma[..., 1])
