"""YuNet (:mod:`.yunet_net`) as a detector: one dense pass over the whole image finds faces from about 10 px of the
network's input (20 px of a 1080p frame).

The weights ship with this package (``yunet.pth``, converted once from libfacedetection.train's ``yunet_n.pth`` by
``tools/convert_yunet.py``, which checks the network against OpenCV's ``FaceDetectorYN``; Apache-2.0, see
``NOTICE.yunet``). Works offline.

An image is scaled to at most MAX_SIDE on its long side (never up), SIDE_PAD columns of it mirrored past its left
and right edges, then padded with black to multiples of 32.
On a GPU the resizing runs there, the network runs as a CUDA graph per input size and batch, and only each image's
TOP_K best points come back to the host, where the boxes over the threshold are kept after non-maximum suppression.
Verified (the default), each candidate is then looked at close up (:mod:`.close_look`). A candidate the frame's left or
right edge cuts is looked at in the frame mirrored there; one cut only at its top or bottom keeps YuNet's own score
if the close look's is not far under it, unless its box has a whole face's proportions (see :func:`edge_rule`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
from torch.nn import functional as F

from ..engine.graphs import Graphs, capture_graph
from .base import DetectorError, FaceDetector
from .close_look import MMOD_MIN_SIDE, CloseLook, Looking, LookMemory, Verdict, best_first
from .crops import longer_sides
from .decoding import suppress_sorted
from .graph_policy import graph_worth_it, pad_rows, padded_count, powers_of_two
from .transfer import frames_on, frames_to, to_host
from .yunet_net import CELL, YuNet, folded

WEIGHTS = Path(__file__).resolve().parent / "yunet.pth"
# A 1080p frame at half size: a 40-px face is 20 px there, over the network's ~10 px floor. At 1,280 a 30-px face is
# found too, at the price of a 720p frame's whole detection (measured: see docs/PERFORMANCE.md, YuNet).
MAX_SIDE = 960
# A candidate box within this fraction of the image's long side of its edge is cut by it (see the module).
AT_EDGE = 0.01
# A face's score is the lower of YuNet's and the close look's (:mod:`.close_look`: BlazeFace's front model and ONet
# on crops around the box), so an animal's face, which YuNet often scores as a face, must also fool the close look;
# at 0.8 that passes a third as many held-out animal photos as BlazeFace's detector at its 0.83, and as many faces
# (measured: see docs/PERFORMANCE.md, Face detection).
# Unverified (YuNet's own score) the same threshold: real faces score 0.85-0.95, but so do many animals' faces.
DEFAULT_MIN_SCORE = 0.8
# YuNet's candidates are looked at close up from here, or from 0.1 under a lower threshold (the hold of a face a
# video already follows is 0.1 under the threshold): a lower hold score than that finds nothing more.
CANDIDATE_SCORE = 0.5
HOLD_MARGIN = 0.1
# Where the frame's edge cuts a candidate (the sixth column of YuNet's candidates): its left or right side, or only
# its top or bottom (the box at them or near them: NEAR_END); END_WHOLE: such a box with a whole face's proportions
# (WHOLE_AT_END).
SIDE_CUT, END_CUT, END_WHOLE = 2.0, 1.0, 3.0
# A face only the frame's top or bottom cuts scores no more than its close look's score plus this: the close look's
# crops are black past the frame, so a person's face cut there scores lower at it (0.85 and up for 95 % of 151
# portraits cut a third into the face; cut through the eyes, 0.61 in the median), but an animal's face lower still
# (0.07-0.30, where YuNet gave 0.72-0.87): the bound halved the animal photos passed on a second set of them
# (from 0.8, 6 to 3 of 490; from 0.7, 11 to 5) and kept the faces cut up to 42 % of their height (measured: see
# docs/PERFORMANCE.md, Face detection).
END_SLACK = 0.4
# A box at the frame's top or bottom this much taller than wide or more holds a whole face, or nearly (the frame
# cuts some hair or a chin): YuNet's boxes of whole faces are taller than wide (1.21-1.49 in photos), of faces a
# third to a half outside the frame wider than tall (0.57-1.02), of whole faces touching the frame's top or bottom
# in photos 1.11-1.19, of dogs' faces the frame barely cuts 1.33-1.48. Between the last two, the fewest animals of
# a tune split kept with every face (measured: see docs/PERFORMANCE.md, Face detection).
WHOLE_AT_END = 1.25
# A box within this fraction of its height of the frame's top or bottom is at it too: a face whose forehead or chin
# the frame cuts, where YuNet's box stops a few pixels short of the edge (looked at as uncut, MMOD's look, black past
# the edge, turns such faces down; the close look passes them).
NEAR_END = 0.03
# A face the frame's left or right edge cuts is proposed from the frame mirrored past that edge, as the close look
# then sees it: the network's input holds this many columns of the scaled frame reflected on each side, one cell of
# its coarsest level, so the points of the frame's inside fall on the grid they did. Half outside, cut faces were
# found far more often (docs/PERFORMANCE.md, Face detection); a face's mirror image, centred out past the edge, is
# dropped before suppression.
SIDE_PAD = CELL
NMS_IOU = 0.3            # as OpenCV's FaceDetectorYN samples use it
# A YuNet box becomes a crop as BlazeFace's does (base.FaceDetector), with its own constants: the medians that put
# its crops where BlazeFace's are, over 425 faces of 20-600 px in ordinary photos (alike for small and large faces;
# faces the frame cuts left out). Its boxes are narrower and reach higher.
REFERENCE_SCALE = 210.0
SHIFT = 0.016
TOP_K = 256              # points per image sent to the host, best first (a crowd's faces, each seen by a few)
# Images of one size a network call, on a GPU. On the CPU an image runs alone: oneDNN picks a convolution's
# algorithm by the batch's size, which rounds an image's numbers differently beside others (seen on CPUs with AVX2
# only), and an image's faces must not depend on what it came with; batching gains little there.
MAX_BATCH = 16
# On a GPU the network runs with its 18 BatchNorms folded into its convolutions (18 kernels a call fewer, the same
# kernels otherwise): fp32 and NCHW, as on the CPU. In fp16 or channels-last its depthwise convolutions
# run in cuDNN's kernels: each new input size and batch then costs seconds of plan building before its first
# frame, for a fraction of a millisecond a batch after it (measured: docs/PERFORMANCE.md, "On the GPU: BatchNorms
# folded").


def input_geometry(shape: tuple, max_side: int = MAX_SIDE,
                   mirror: bool = True) -> tuple[tuple[int, int], tuple[int, int], tuple[float, float]]:
    """For an image of ``shape``: its scaled size ``(h, w)``, the network's input size ``(H, W)`` (with ``mirror``,
    SIDE_PAD columns on each side included) and the scales ``(x, y)`` from the image to the scaled image (each side
    rounded on its own)."""
    h, w = shape[:2]
    scale = min(1.0, max_side / max(h, w))
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    pad = side_pad(nw) if mirror else 0
    return (nh, nw), (-(-nh // CELL) * CELL, -(-(nw + 2 * pad) // CELL) * CELL), (nw / w, nh / h)


def side_pad(width: int) -> int:
    """The columns of the frame mirrored on each side of a scaled image ``width`` wide (SIDE_PAD; none for an
    image too narrow to mirror so)."""
    return SIDE_PAD if width > SIDE_PAD else 0


def edge_rule(cut: np.ndarray, yunet: np.ndarray, close: np.ndarray, mmod: Optional[np.ndarray] = None) -> np.ndarray:
    """Candidates' scores from YuNet's and the close look's: the lower of the two; for a face the frame's left or
    right edge cuts, their mean (its close look sees the frame mirrored there: a face is nearly symmetric, so the
    half inside stands for the half outside, while YuNet sees half a face and scores it lower); for one only its
    top or bottom cuts, YuNet's own, but no more than the close look's plus END_SLACK (the close look's crops are
    black beyond the frame, where its networks never saw a face), unless its box has a whole face's proportions
    (END_WHOLE): then the lower of the two again (a dog's face the frame barely cuts is turned down there).
    ``mmod``: the close look's MMOD look, mapped (:func:`.close_look.mmod_mapped`; 1 for a box under
    MMOD_MIN_SIDE): a face the frame does not cut scores no higher than it; a cut one keeps its score (MMOD, even
    mirrored, turns down most faces cut at 42-58 %, and faces whose chin the frame cuts: measured, see
    docs/PERFORMANCE.md, Face detection)."""
    at_end = np.minimum(yunet, close + END_SLACK)
    score = np.where(cut == SIDE_CUT, (yunet + close) / 2, np.where(cut == END_CUT, at_end, np.minimum(yunet, close)))
    return score if mmod is None else np.where(cut == 0, np.minimum(score, mmod), score)


class Part(NamedTuple):
    """Images of one size run together: their indices, size, best points on their way to the host (and the event
    recorded after their copy; None on the CPU), and the scales from image to network input, ``(x, y)``."""

    members: list[int]
    shape: tuple
    rows: torch.Tensor
    done: Optional["torch.cuda.Event"]
    scale: tuple[float, float]


@dataclass
class Proposed:
    """A launched detection: its queued parts, the image count and, verified, the images (their candidates' close
    look needs them) and each image's video's memory (None: a photo, or a look again)."""

    parts: list[Part]
    count: int
    images: Optional[Sequence] = None
    memory: Optional[Sequence[Optional[LookMemory]]] = None


@dataclass
class Verifying:
    """A verified detection advanced: each image's candidates, the close look queued for those not carrying a
    verdict (:class:`.close_look.LookMemory`), and every candidate's verdict (read at :meth:`YuNetDetector.collect`)."""

    candidates: list[np.ndarray]
    looking: Looking
    looked: list[np.ndarray]        # per image, the indices of the candidates looked at
    verdicts: list[list[Verdict]]   # per image, per candidate


class YuNetDetector(FaceDetector):
    """YuNet on any device; the whole image in one pass, small faces included; ``verify``: each candidate is also
    looked at close up (default)."""

    name = "yunet"
    reference_scale = REFERENCE_SCALE
    shift = SHIFT

    def __init__(self, device: Union[str, torch.device] = "cpu", weights: Union[str, Path, None] = None,
                 min_score: Optional[float] = None, max_side: int = MAX_SIDE, cuda_graphs: bool = True,
                 background: bool = False, verify: bool = True, mmod: bool = True, mirror: bool = True) -> None:
        """``max_side``: an image's long side is scaled down to this (small faces shrink with it); ``background``: on
        a GPU, graphs are captured in a thread of their own while the first images run the network eagerly (the same
        kernels: the same detections); ``mmod``: verified, the close look's MMOD look too (see :func:`edge_rule`);
        ``mirror``: the network also sees the frame mirrored past its left and right edges (SIDE_PAD)."""
        path = Path(weights) if weights else WEIGHTS
        if not path.is_file():
            raise DetectorError(f"YuNet weights not found at {path}; reinstall emonet (the file ships with the "
                                f"package) or run tools/convert_yunet.py")
        self.device = torch.device(device)
        self.queues = self.device.type == "cuda"
        self.net = YuNet()
        self.net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        self.net.eval()
        if self.queues:  # see the note at MAX_BATCH
            self.net = folded(self.net)
        self.net.to(self.device)
        self.verify = verify
        self.min_score = DEFAULT_MIN_SCORE if min_score is None else float(min_score)
        self.max_side = int(max_side)
        self.mirror = mirror
        self.background = background
        self.cuda_graphs = cuda_graphs and self.queues
        self._graphs = Graphs(self.device, self._capture) if self.cuda_graphs else None
        self._sizes_seen: dict[tuple[int, int], int] = {}  # input sizes -> times seen (which run as graphs)
        self.close_look = None
        if verify:
            from .blazeface import BlazeFaceDetector
            from .mmod import load_mmod
            from .onet import load_onet

            front = BlazeFaceDetector(self.device, model="front", cuda_graphs=False, tiles=False, verify=False)
            self.close_look = CloseLook(front, load_onet(self.device), self.device, self.cuda_graphs, background,
                                        load_mmod(self.device) if mmod else None)

    def detect(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per image, an ``(k, 5)`` array ``x1, y1, x2, y2, score``, best first."""
        return self.collect(self.launch(images))

    def launch(self, images: Sequence[Union[np.ndarray, torch.Tensor]],
               small: Optional[Sequence[bool]] = None,
               memory: Optional[Sequence[Optional[LookMemory]]] = None) -> Proposed:
        """Queue the network over the images (every face is looked for every time: ``small`` is not needed);
        ``memory``: per image, its video's (a candidate verified at that video's last periodic detection carries
        its verdict; see :class:`.close_look.LookMemory`) or None (every candidate looked at)."""
        if self.queues:  # host images uploaded once, for the network and the close look
            images = frames_to(self.device, images)
        groups: dict[tuple, list[int]] = {}
        for i, image in enumerate(images):
            groups.setdefault(tuple(image.shape[:2]), []).append(i)
        parts = []
        most = MAX_BATCH if self.queues else 1
        for shape, members in groups.items():
            for start in range(0, len(members), most):
                chunk = members[start:start + most]
                parts.append(Part(chunk, shape, *self._launch([images[i] for i in chunk], shape)))
        return Proposed(parts, len(images), images if self.verify else None,
                        list(memory) if self.verify and memory is not None else None)

    def advance(self, handle: Union[Proposed, Verifying]) -> Union[Proposed, Verifying]:
        """Verified: the candidates read (waiting for the network) and the close look queued for those that carry
        no verdict; :meth:`collect` then waits for the close look's networks only. Call it (or :meth:`collect`) for
        a video's launches in their order: each reads and updates that video's memory."""
        if not self.verify or isinstance(handle, Verifying):
            return handle
        floor = min(CANDIDATE_SCORE, self.min_score - HOLD_MARGIN)
        candidates = self._candidates(handle, floor, edge=True)
        fresh: set = set()  # this call's verdicts (not read yet, and carried by its later images of a video)
        looked, verdicts = [], []
        for i, found in enumerate(candidates):
            memory = handle.memory[i] if handle.memory is not None else None
            shape = tuple(handle.images[i].shape[:2])
            if memory is None:
                carried, ages = [None] * len(found), None
            else:
                carried, ages = memory.carry(found[:, :4], found[:, 5], shape, fresh)
            mine = [v if v is not None else Verdict() for v in carried]
            fresh.update(id(v) for v, c in zip(mine, carried) if c is None)
            if memory is not None:
                memory.hold(found[:, :4], found[:, 5], mine, ages, shape)
            looked.append(np.array([k for k, c in enumerate(carried) if c is None], np.int64))
            verdicts.append(mine)
        to_look = [found[k] for found, k in zip(candidates, looked)]
        looking = self.close_look.launch(handle.images, to_look, [c[:, 5] == SIDE_CUT for c in to_look])
        return Verifying(candidates, looking, looked, verdicts)

    def collect(self, handle: Union[Proposed, Verifying], min_score: Optional[float] = None) -> list[np.ndarray]:
        """The faces of a :meth:`launch` (advanced or not) from ``min_score`` (default the threshold); verified, no
        lower than the candidates' floor (see CANDIDATE_SCORE)."""
        least = self.min_score if min_score is None else float(min_score)
        if not self.verify:
            return self._candidates(handle, least)
        verifying = self.advance(handle)
        looking = verifying.looking
        checks = looking.mmod_per_image() or [None] * len(looking.candidates)
        for looked, verdicts, close, mmod in zip(verifying.looked, verifying.verdicts, looking.per_image(), checks):
            for j, k in enumerate(looked):
                verdicts[k].close = float(close[j])
                if mmod is not None:
                    verdicts[k].mmod = float(mmod[j])
        out = []
        hold = self.min_score - HOLD_MARGIN
        for candidates, looked, verdicts in zip(verifying.candidates, verifying.looked, verifying.verdicts):
            faces = candidates[:, :5].copy()  # (the sixth column: where the frame's edge cuts it)
            close = np.array([v.close for v in verdicts], np.float64)
            mmod = None
            if self.close_look.mmod is not None:  # (too small a box: MMOD's look not used, see MMOD_MIN_SIDE)
                mmod = np.where(longer_sides(faces) < MMOD_MIN_SIDE, 1.0, np.array([v.mmod for v in verdicts], np.float64))
            faces[:, 4] = edge_rule(candidates[:, 5], faces[:, 4], close, mmod)
            for k in looked:  # a verdict is carried on only where its own candidate was a face with it
                verdicts[k].face = bool(faces[k, 4] >= hold)
            out.append(best_first(faces, least))
        return out

    def _candidates(self, handle: Proposed, least: float, edge: bool = False) -> list[np.ndarray]:
        """Each image's boxes from ``least``, after non-maximum suppression, best first; ``edge``: with a sixth
        column, where the image's edge cuts the box (SIDE_CUT, END_CUT, END_WHOLE or 0; see AT_EDGE)."""
        out: list[np.ndarray] = [np.zeros((0, 6 if edge else 5))] * handle.count
        for members, shape, rows, done, scale in handle.parts:
            if done is not None:
                done.synchronize()
            rows = rows.numpy()
            # Each image's points from ``least`` first, in their order (best first), ``counts`` of them.
            passed = rows[:, :, 0] >= least
            counts = passed.sum(axis=1)
            most = int(counts.max()) if len(counts) else 0
            if not most:
                continue
            order = np.argsort(~passed, axis=1, kind="stable")[:, :most]
            rows = np.take_along_axis(rows, order[:, :, None], axis=1).astype(np.float64)
            # Non-maximum suppression in the network's pixels (every image of the part at once), then into the
            # image's.
            kept = suppress_sorted(rows[:, :, 1:5], counts, NMS_IOU)
            boxes = rows[:, :, 1:5] / np.tile(scale, 2)
            columns = [boxes, rows[:, :, :1]]
            if edge:
                h, w = shape[:2]
                m = AT_EDGE * max(h, w)
                side = (boxes[..., 0] < m) | (boxes[..., 2] > w - m)
                height = boxes[..., 3] - boxes[..., 1]
                near = np.maximum(m, NEAR_END * height)
                end = (boxes[..., 1] < near) | (boxes[..., 3] > h - near)
                whole = end & (height >= WHOLE_AT_END * (boxes[..., 2] - boxes[..., 0]))
                cut = np.where(side, SIDE_CUT, np.where(whole, END_WHOLE, np.where(end, END_CUT, 0)))
                columns.append(cut[..., None].astype(np.float64))
            found = np.concatenate(columns, axis=2)
            for k, i in enumerate(members):
                if counts[k]:
                    out[i] = found[k][kept[k]]
        return out

    def _launch(self, images: Sequence[Union[np.ndarray, torch.Tensor]], shape: tuple) -> tuple:
        """Queue the network on images of one size: their best points on their way to the host, the event, the
        scales."""
        (nh, nw), (H, W), scale = input_geometry(shape, self.max_side, self.mirror)
        with torch.inference_mode():
            x = frames_on(self.device, images)  # (B, 3, h, w) RGB
            if (nh, nw) != tuple(shape[:2]):
                x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
            pad = side_pad(nw) if self.mirror else 0
            if pad:  # the frame mirrored past its left and right edges (see SIDE_PAD)
                x = F.pad(x, (pad, pad, 0, 0), mode="reflect")
            batch = x.new_zeros((len(images), 3, H, W))
            batch[:, :, :nh, :nw + 2 * pad] = x.flip(1)  # BGR, as the network was trained
            rows = self._forward(batch)[:len(images)]  # (under a graph, its output: read, never written)
            score = rows[..., 0]
            if pad:  # a face's mirror image, centred out past the edge, is not a face
                centre, quarter = (rows[..., 1] + rows[..., 3]) / 2 - pad, (rows[..., 3] - rows[..., 1]) / 4
                score = score.masked_fill((centre < -quarter) | (centre > nw + quarter), -1.0)
            best = score.topk(min(TOP_K, rows.shape[1]), dim=1).indices
            rows = rows.gather(1, best[..., None].expand(-1, -1, rows.shape[2]))
            if pad:  # the kept points' x into the scaled image's pixels
                rows[..., 0] = score.gather(1, best)
                rows[..., 1:15:2] -= pad
            return (*to_host(rows), scale)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """The network, on a GPU as a CUDA graph per padded batch and input size (eager while one is captured in
        the background); rows past ``x``'s are not to be read. Each graph keeps its memory: an input size runs as
        graphs from its second time and only a few sizes do (a video has one; photos of many sizes run eagerly)."""
        padded = padded_count(len(x))
        entry = None
        if self._graphs is not None and graph_worth_it(self._sizes_seen, tuple(x.shape[2:]), 0):
            entry = self._graphs.get((padded, *x.shape[2:]), later=self.background)
        if entry is None:
            return self.net(pad_rows(x, padded))
        graph, static_in, rows = entry
        static_in[:len(x)].copy_(x)
        graph.replay()
        return rows

    def _capture(self, key: tuple, stream: "torch.cuda.Stream", error_mode: str) -> tuple:
        batch, height, width = key
        static_in = torch.zeros(batch, 3, height, width, device=self.device)
        graph, rows = capture_graph(lambda: self.net(static_in), stream, error_mode)
        return graph, static_in, rows

    def warmup(self, shape: tuple = (720, 1280, 3)) -> None:
        """Every padded batch size of this image size once (kernel selection, graph capture) before real images;
        in the background mode one eager pass, the graphs captured meanwhile."""
        blank = np.zeros(shape, np.uint8)
        for b in [1] if self.background else powers_of_two(MAX_BATCH):
            self.detect([blank] * b)
        if self.close_look is not None:  # a blank image has no candidate: the close look on a made-up one
            self.close_look.warmup(shape)
        if self.background and self._graphs is not None:
            _, size, _ = input_geometry(shape, self.max_side, self.mirror)
            self._sizes_seen[size] = max(self._sizes_seen.get(size, 0), 1)  # the frames to come run as graphs
            self._graphs.prepare([(b, *size) for b in powers_of_two(MAX_BATCH)][::-1])
            if self.close_look is not None:
                self.close_look.prepare()

    def wait_for_graphs(self) -> None:
        """Until the graphs being captured in the background, the close look's too, are ready."""
        if self._graphs is not None:
            self._graphs.wait()
        if self.close_look is not None:
            self.close_look.wait()
