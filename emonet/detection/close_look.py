"""The close look (the verifier): each candidate of the back model scored again, close up.

A face is found in two steps. The 256-px back model proposes candidates over every view of an image from
CANDIDATE_SCORE (YuNet's candidates, :mod:`.yunet`, are looked at the same way); each is then looked at in square
crops around it (:mod:`.crops`): by the 128-px front model at VERIFY_ZOOMS times the candidate's size (each look: the
best detection covering the crop's centre) and by MTCNN's ONet (:mod:`.onet`), trained on other data, at ONET_ZOOMS.
The score is the mean of the front model's looks and ONet's, weighed as one and two. With dlib's CNN face detector
(:mod:`.mmod`; YuNet's detector uses it), each candidate is also looked at by it in a crop MMOD_ZOOM times its size,
its confidence mapped onto the score's scale (:func:`mmod_mapped`); the detector takes the lower of that and its own
score. On a GPU the networks after the crops run as one CUDA graph per padded count of candidates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ..engine.graphs import Graphs, capture_graph
from .base import FaceDetector
from .crops import close_crops, longer_sides, scale_crops
from .graph_policy import pad_rows, padded_count, powers_of_two
from .mmod import CropScorer, MMODNet
from .onet import ONET_SIZE, onet_input
from .transfer import to_host

# From 0.5 the back model never proposed some faces the close look passes; lower costs more candidates to look
# at (measured: see docs/PERFORMANCE.md, Face detection).
CANDIDATE_SCORE = 0.3
VERIFY_ZOOMS = (1.8, 2.4, 3.0)
ONET_ZOOMS = (1.0, 1.25)
# Non-faces stay well under it, held-out ones too, and annotated faces of 40-100 px pass (measured: see
# docs/PERFORMANCE.md, Face detection).
DEFAULT_MIN_SCORE = 0.83
# The networks after the crops (the front model, its decoding, ONet, the scores' mean) run on at most this many
# candidates at once; on a GPU as one CUDA graph per padded count (eagerly they are some sixty small launches,
# each paid on the host).
CLOSE_LOOK_BATCH = 32
# The MMOD look: a crop twice the candidate's size, MMOD_SIZE pixels (the face some 100 px: dlib's 80-px window
# finds it at its pyramid's first levels; 1.1 GFLOP a crop, its tiled pyramid 776x222), scored as dlib's detector
# would (:class:`.mmod.CropScorer`; its confidence: a face from 0, real faces some 1.0-1.1, animals' faces the close
# look passes mostly under 0.9). Mapped so that MMOD_THRESHOLD is the detectors' 0.8 (:func:`mmod_mapped`): the
# highest that keeps every face the detector found without it on photos of a tune split (at 1.0, 99 % of them,
# crowded faces half behind hands were lost); MMOD_SLOPE puts the tracker's hold (0.1 under the threshold) 0.025
# lower and leaves faces from 1.03 as they were (measured: see docs/PERFORMANCE.md, Face detection).
MMOD_ZOOM, MMOD_SIZE = 2.0, 200
MMOD_THRESHOLD = 0.98
MMOD_SLOPE = 4.0
MMOD_AT = 0.8  # the detectors' threshold, where MMOD_THRESHOLD is mapped
# A smaller box's crop is enlarged too much for MMOD: 24-px faces score 0.96-0.99; its look is not used there
# (the animals' faces the close look passes are larger: measured, see docs/PERFORMANCE.md, Face detection).
MMOD_MIN_SIDE = 28.0


def mmod_mapped(confidence: torch.Tensor) -> torch.Tensor:
    """MMOD's confidences -> the close look's scale: ``clip(0.8 + MMOD_SLOPE * (c - MMOD_THRESHOLD), 0, 1)``."""
    return (MMOD_AT + MMOD_SLOPE * (confidence.double() - MMOD_THRESHOLD)).clamp(0.0, 1.0)


@dataclass
class Looking:
    """A verified detection advanced (see :meth:`.BlazeFaceDetector.advance`): each image's candidates, and their
    close-look scores on their way back."""

    candidates: list[np.ndarray]
    host: Optional[torch.Tensor]              # the scores, all candidates' in order (None: no candidate); with
    done: Optional["torch.cuda.Event"] = None  # the MMOD look, (n, 2): the score, MMOD's mapped; on a GPU, the
    mmod: bool = False                         # event recorded after their copy; whether MMOD looked

    def _host(self) -> np.ndarray:
        if self.host is None:
            return np.zeros((0, 2) if self.mmod else 0)
        if self.done is not None:
            self.done.synchronize()
        return self.host.numpy()

    def scores(self) -> np.ndarray:
        """The scores, waiting for them if need be."""
        host = self._host()
        return host[:, 0] if self.mmod else host

    def per_image(self) -> list[np.ndarray]:
        """The scores image by image, in the order of :attr:`candidates`, waiting for them if need be."""
        return np.split(self.scores(), np.cumsum([len(faces) for faces in self.candidates])[:-1])

    def mmod_per_image(self) -> Optional[list[np.ndarray]]:
        """MMOD's mapped scores (:func:`mmod_mapped`) image by image, as :meth:`per_image`; None without it."""
        if not self.mmod:
            return None
        return np.split(self._host()[:, 1], np.cumsum([len(faces) for faces in self.candidates])[:-1])


# A video's candidate near one of its candidates at the last periodic detection that was a face (its centre within
# CARRY_SHIFT times the larger box's longer side, the two boxes' sizes within CARRY_SIZE of each other, the same as to
# the frame's edge and to MMOD_MIN_SIDE), and near no other, carries that one's close look. Near, not overlapping: the
# bench's clip's face moves three quarters of its box's width between two detections 5 frames apart (a face crossing
# a 720p frame in three seconds). Two faces, or a face and another candidate, that near each other are looked at
# every time, and so is a candidate turned down (a face turning towards the camera is not held to its profile's
# look). A run of carried looks is looked at again every LOOK_AGAIN-th detection (every 5 s at 30 frames/s, a
# detection every 5 frames): a face never carries the look of a thing that took its place for longer.
CARRY_SHIFT = 1.0
CARRY_SIZE = 1.25
LOOK_AGAIN = 30


@dataclass
class Verdict:
    """A candidate's close look once read (:meth:`CloseLook.launch`): its score, MMOD's mapped (NaN without MMOD),
    and whether the candidate was a face with it (its detector's score from the hold score: only such a verdict is
    carried to a later detection call); None until read."""

    close: Optional[float] = None
    mmod: float = float("nan")
    face: Optional[bool] = None


@dataclass
class LookMemory:
    """A video's (or live stream's) candidates at its last periodic detection, each with the verdict of its close
    look and how many detections in a row that verdict has been carried. One per video, given to the detector with
    that video's periodic detection frames, in order; a look again after a lost face, at a chunk's first frame,
    reads a copy of it as it was after the last periodic detection before that frame and changes nothing. So which
    candidates are looked at depends only on the video's frames and detection cadence, never on how frames were
    chunked or batched with other videos' or when a loss was known. A frame of another size starts it afresh."""

    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    cuts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    verdicts: list = field(default_factory=list)
    ages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    shape: Optional[tuple] = None

    def carry(self, boxes: np.ndarray, cuts: np.ndarray, shape: tuple,
              fresh_ok: set) -> tuple[list[Optional[Verdict]], np.ndarray]:
        """Per candidate of a frame of ``shape`` (``boxes`` ``(k, 4)``, ``cuts`` where the frame's edge cuts each), the
        verdict it carries, or None where it is to be looked at (:meth:`hold` then keeps them), and the ages. A
        candidate carries only from the one memory entry near it, near no other candidate (see CARRY_SHIFT). A
        verdict not yet read is carried only within its own detection call (``fresh_ok``, the ids of that call's
        verdicts; whether it was a face is known only when the call is collected): one of an earlier call unread
        means that call failed."""
        carried: list[Optional[Verdict]] = [None] * len(boxes)
        ages = np.zeros(len(boxes), np.int64)
        if not len(boxes) or not len(self.boxes) or shape != self.shape:
            return carried, ages
        tiny, tiny_before = longer_sides(boxes) < MMOD_MIN_SIDE, longer_sides(self.boxes) < MMOD_MIN_SIDE
        near = (_shifts(boxes, self.boxes) <= CARRY_SHIFT) & (cuts[:, None] == self.cuts[None, :]) & (
            tiny[:, None] == tiny_before[None, :])
        for c, m in zip(*np.nonzero(near)):
            if near[c].sum() > 1 or near[:, m].sum() > 1:
                continue  # which is which is not sure: looked at
            verdict = self.verdicts[m]
            unread_elsewhere = verdict.close is None and id(verdict) not in fresh_ok
            if self.ages[m] + 1 >= LOOK_AGAIN or unread_elsewhere or verdict.face is False:
                continue
            carried[c], ages[c] = verdict, self.ages[m] + 1
        return carried, ages

    def copy(self) -> "LookMemory":
        """As it is now, apart: what a look again at a frame reads (its own carrying then changes nothing here)."""
        return LookMemory(self.boxes, self.cuts, list(self.verdicts), self.ages, self.shape)

    def hold(self, boxes: np.ndarray, cuts: np.ndarray, verdicts: list, ages: np.ndarray, shape: tuple) -> None:
        """These candidates of a frame of ``shape``, their verdicts and ages, as the last periodic detection's."""
        self.boxes, self.cuts, self.verdicts, self.ages = boxes.copy(), cuts.copy(), list(verdicts), ages
        self.shape = shape


def _shifts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(len(a), len(b))``: how far each box of ``a`` is from each of ``b`` (``x1, y1, x2, y2``), their centres'
    distance over the larger box's longer side; inf where their sizes differ by more than CARRY_SIZE."""
    centre = lambda boxes: (boxes[:, :2] + boxes[:, 2:4]) / 2  # noqa: E731
    sa, sb = longer_sides(a)[:, None], longer_sides(b)[None, :]
    larger = np.maximum(np.maximum(sa, sb), 1e-6)
    shift = np.linalg.norm(centre(a)[:, None] - centre(b)[None], axis=2) / larger
    return np.where(larger <= CARRY_SIZE * np.maximum(np.minimum(sa, sb), 1e-6), shift, np.inf)


def best_first(faces: np.ndarray, least: float) -> np.ndarray:
    """The faces scoring ``least`` or more, best first (ties in their order)."""
    faces = faces[faces[:, 4] >= least]
    return faces[np.argsort(-faces[:, 4], kind="stable")]


class CloseLook:
    """The close look's networks on ``device``: ``front``, the front model's detector (its own graphs off: its
    network runs inside the close look's), and ``onet``; ``background``: graphs first seen are captured in a
    thread of their own."""

    def __init__(self, front: FaceDetector, onet: torch.nn.Module, device: torch.device,
                 cuda_graphs: bool, background: bool, mmod: Optional[MMODNet] = None) -> None:
        """``cuda_graphs``: on a GPU, the networks after the crops run as CUDA graphs; ``mmod``: also the MMOD
        look (:class:`Looking` then carries its mapped scores)."""
        self.front, self.onet = front, onet
        self.mmod = CropScorer(mmod, MMOD_SIZE) if mmod is not None else None
        self.device = device
        self.background = background
        self._anchors: Optional[torch.Tensor] = None  # the front model's, on the device (see _centre)
        # padded candidate count -> (CUDA graph, static inputs (front, ONet crops), static scores)
        self._graphs = Graphs(device, self._capture) if cuda_graphs else None

    def launch(self, images: Sequence[Union[np.ndarray, torch.Tensor]], candidates: list[np.ndarray],
               mirrored: Optional[Sequence[np.ndarray]] = None) -> Looking:
        """Queue the candidates' scores, image by image: all images' crops at once, up to CLOSE_LOOK_BATCH
        candidates a network call, on their way back in one copy; ``mirrored``: per image, the candidates whose
        crops see the image mirrored at its sides (see :func:`.crops.close_crops`)."""
        if not any(len(faces) for faces in candidates):
            return Looking(candidates, None, None, self.mmod is not None)
        # ONet's crops as MTCNN makes them, by area: sampled at four times its size, then 4x4 means.
        looks = [(VERIFY_ZOOMS, self.front.size), (ONET_ZOOMS, 4 * ONET_SIZE)]
        if self.mmod is not None:
            looks.append(((MMOD_ZOOM,), MMOD_SIZE))
        crops = close_crops(images, [faces[:, :4] for faces in candidates], looks, self.device,  # scaled by _net
                            scaled=False, mirrored=mirrored)
        n = sum(len(faces) for faces in candidates)
        scores = []
        for start in range(0, n, CLOSE_LOOK_BATCH):
            k = min(CLOSE_LOOK_BATCH, n - start)
            scores.append(self._scores([c[start * len(z):(start + k) * len(z)] for c, (z, _) in zip(crops, looks)], k))
        return Looking(candidates, *to_host(torch.cat(scores) if len(scores) > 1 else scores[0]),
                       self.mmod is not None)

    def scores(self, images: Sequence[Union[np.ndarray, torch.Tensor]], candidates: list[np.ndarray],
               mirrored: Optional[Sequence[np.ndarray]] = None) -> np.ndarray:
        """The candidates' scores (see :meth:`launch`), waited for."""
        return self.launch(images, candidates, mirrored).scores()

    def warmup(self, shape: tuple) -> None:
        """Crops and both networks once on a made-up candidate in a blank image of ``shape`` and, unless in the
        background mode, every padded count's graph captured."""
        h, w = shape[:2]
        self.scores([np.zeros(shape, np.uint8)], [np.array([[w / 4, h / 4, w / 2, h / 2, 1.0]])])
        if self._graphs is not None and not self.background:
            for padded in powers_of_two(CLOSE_LOOK_BATCH):
                self._graphs.get(padded)

    def prepare(self) -> None:
        """Capture every padded count's graph in the background."""
        if self._graphs is not None:
            self._graphs.prepare(powers_of_two(CLOSE_LOOK_BATCH))

    def wait(self) -> None:
        """Until the graphs being captured in the background are ready."""
        if self._graphs is not None:
            self._graphs.wait()

    def _scores(self, crops: list[torch.Tensor], n: int) -> torch.Tensor:
        """The scores of ``n`` candidates' crops (per look, :meth:`launch`'s order): on a GPU padded to a power of
        two, as a CUDA graph when there is one for that count (else the same networks eagerly: the same kernels,
        the same numbers)."""
        if self.device.type != "cuda":
            return self._net(*crops)
        padded = padded_count(n)
        entry = self._graphs.get(padded, later=self.background) if self._graphs is not None else None
        if entry is None:
            return self._net(*[pad_rows(c, len(c) // n * padded) for c in crops])[:n]
        graph, static, scores = entry
        for into, c in zip(static, crops):
            into[:len(c)].copy_(c)  # rows past them keep earlier (scaled) crops: their scores are not read
        graph.replay()
        return scores[:n].clone()  # the next replay overwrites the static scores

    def _net(self, front: torch.Tensor, second: torch.Tensor, third: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Candidates' scores ``(n,)`` (float64) from their crops (pixels in [0, 255]; scaled here, in place): the
        mean of the front model's looks (:meth:`_centre`, VERIFY_ZOOMS) and ONet's (ONET_ZOOMS), weighed as one
        and two; with the MMOD look's crops ``third``, ``(n, 2)``: those and MMOD's mapped scores."""
        with torch.inference_mode():
            front, second = scale_crops(front), scale_crops(second)
            raw_boxes, raw_scores = self.front.net(front)
            front = self._centre(raw_boxes, raw_scores).double().reshape(-1, len(VERIFY_ZOOMS)).mean(dim=1)
            second = self.onet(onet_input(torch.nn.functional.avg_pool2d(second, 4)))
            score = (front + second.double().reshape(-1, len(ONET_ZOOMS)).sum(dim=1)) / (1 + len(ONET_ZOOMS))
            if third is None:
                return score
            return torch.stack([score, mmod_mapped(self.mmod(third))], dim=1)

    def _capture(self, padded: int, stream: "torch.cuda.Stream", error_mode: str) -> tuple:
        static = [torch.zeros(padded * len(VERIFY_ZOOMS), 3, self.front.size, self.front.size, device=self.device),
                  torch.zeros(padded * len(ONET_ZOOMS), 3, 4 * ONET_SIZE, 4 * ONET_SIZE, device=self.device)]
        if self.mmod is not None:
            static.append(torch.zeros(padded, 3, MMOD_SIZE, MMOD_SIZE, device=self.device))
        graph, scores = capture_graph(lambda: self._net(*static), stream, error_mode)
        return graph, tuple(static), scores

    def _centre(self, raw_boxes: torch.Tensor, raw_scores: torch.Tensor) -> torch.Tensor:
        """The front model's raw outputs for crops -> per crop the best score of a detection whose box covers the
        crop's centre: how surely a face fills it, ``(B,)`` on the device (decoded there, nothing copied back)."""
        net = self.front.net
        if self._anchors is None:
            self._anchors = torch.tensor(self.front.anchors, device=self.device)
        raw_boxes, raw_scores = raw_boxes.float(), raw_scores.float()
        a = self._anchors
        xc = raw_boxes[..., 0] / net.x_scale * a[:, 2] + a[:, 0]
        yc = raw_boxes[..., 1] / net.y_scale * a[:, 3] + a[:, 1]
        half_w = raw_boxes[..., 2] / net.w_scale * a[:, 2] / 2
        half_h = raw_boxes[..., 3] / net.h_scale * a[:, 3] / 2
        covers = ((xc - half_w) < 0.5) & ((xc + half_w) > 0.5) & ((yc - half_h) < 0.5) & ((yc + half_h) > 0.5)
        p = torch.sigmoid(raw_scores[..., 0].clamp(-net.score_clipping_thresh, net.score_clipping_thresh))
        return torch.where(covers, p, torch.zeros_like(p)).amax(dim=1)
