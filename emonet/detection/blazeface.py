"""MediaPipe BlazeFace (256x256 "back" model) in PyTorch, with face-alignment's network: :class:`BlazeFaceDetector`,
which loads the network and runs it over each image's views.

The weights ship with this package (``blazeface.pth``, converted once from the MediaPipe TFLite files
by ``tools/convert_blazeface.py``; Apache-2.0, see ``NOTICE.blazeface``). Works offline. The whole image
is letterboxed, never centre-cropped, so faces at the sides of a wide frame are found. On a GPU the
network runs as a CUDA graph and accepts frames already uploaded there.

Beside it: :mod:`.views` (the whole view, the fine view, tiles), :mod:`.decoding` (anchors, decoding, NMS, views
merged), :mod:`.close_look` (the verifier) and :mod:`.crops` (its crops), :mod:`.graph_policy` (what runs as CUDA
graphs), :mod:`.transfer` (copies between host and device). Their names other modules use are importable from
here too.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ..engine.graphs import Graphs, capture_graph
from . import views
from .base import DetectorError, FaceDetector
from .close_look import (CANDIDATE_SCORE, CLOSE_LOOK_BATCH, DEFAULT_MIN_SCORE, ONET_ZOOMS, VERIFY_ZOOMS, CloseLook,
                         Looking, best_first)
from .crops import CROP_BATCH, CROP_PIXELS, close_crops, scale_crops, zoomed_crops
from .decoding import decode_blazeface, merge_detections, weighted_nms
from .decoding import ssd_anchors as _anchors  # (under the name the tests import)
from .graph_policy import FINE_UNPADDED, graph_worth_it, pad_rows, padded_count, powers_of_two
from .onet import load_onet
from .transfer import to_host
from .views import (FINE_FROM, FINE_MAX_SIDE, FINE_SCALE, FINE_SIZES_KEPT, TILES_FROM, WHOLE_VIEW_LEAST,
                    inside_tile, tile_grid)

WEIGHTS = Path(__file__).resolve().parent / "blazeface.pth"
# Without the close look (verify=False), the back model's own score (the mean over the overlapping detections
# that pass): 0.7 keeps out most non-faces, not all (measured: see docs/PERFORMANCE.md, Face detection).
UNVERIFIED_MIN_SCORE = 0.7
TILE_MARGIN = 0.1  # unverified: the score a face seen only in a tile or the fine view needs above min_score

__all__ = [
    "BlazeFaceDetector", "WEIGHTS", "UNVERIFIED_MIN_SCORE", "TILE_MARGIN",
    "CANDIDATE_SCORE", "CLOSE_LOOK_BATCH", "DEFAULT_MIN_SCORE", "ONET_ZOOMS", "VERIFY_ZOOMS",
    "CROP_BATCH", "CROP_PIXELS", "close_crops", "scale_crops", "zoomed_crops",
    "decode_blazeface", "merge_detections", "weighted_nms",
    "FINE_FROM", "FINE_MAX_SIDE", "FINE_SCALE", "FINE_SIZES_KEPT", "FINE_UNPADDED", "TILES_FROM",
    "WHOLE_VIEW_LEAST", "tile_grid",
]


def _blazeface_class() -> type:
    """face-alignment's BlazeFace network class, loaded from its own module file.

    Importing it the usual way runs ``face_alignment/__init__``, which imports scikit-image, SciPy and
    Numba (about 0.4 s) for things this detector never uses; the module itself needs only torch.
    """
    name = "face_alignment.detection.blazeface.net_blazeface"
    if name in sys.modules:
        return sys.modules[name].BlazeFace
    package = importlib.util.find_spec("face_alignment")  # finds the package without running it
    if package is None or package.origin is None:
        raise DetectorError("the blazeface detector needs face-alignment: pip install face-alignment")
    path = Path(package.origin).parent / "detection" / "blazeface" / "net_blazeface.py"
    spec = importlib.util.spec_from_file_location("emonet.detection._net_blazeface", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BlazeFace


class BlazeFaceDetector(FaceDetector):
    """MediaPipe BlazeFace on any device; ``model='back'`` (256 input, faces at any distance) or ``'front'`` (128, selfies)."""

    name = "blazeface"

    def __init__(self, device: Union[str, torch.device] = "cpu", model: str = "back",
                 weights: Union[str, Path, None] = None, min_score: Optional[float] = None,
                 cuda_graphs: bool = True, tiles: bool = True, verify: Optional[bool] = None,
                 background: bool = False) -> None:
        """``tiles``: a large image is also seen in the fine view and, over TILES_FROM, in tiles (small faces);
        ``verify``: each candidate is looked at close up (default: with the back model); ``background``: on a
        GPU, its CUDA graphs are captured in a thread of their own while the first images run the network
        eagerly (the same kernels: the same detections), not on first use."""
        BlazeFace = _blazeface_class()
        if model not in ("back", "front"):
            raise DetectorError(f"BlazeFace model must be 'back' or 'front', not {model!r}")
        path = Path(weights) if weights else WEIGHTS
        if not path.is_file():
            raise DetectorError(f"BlazeFace weights not found at {path}; reinstall emonet (the file "
                                f"ships with the package) or run tools/convert_blazeface.py")
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.device = torch.device(device)
        self.queues = self.device.type == "cuda"
        self._fine_unpadded = FINE_UNPADDED if self.queues else 0  # (on the CPU: padded, as ever)
        self.net = BlazeFace(back_model=(model == "back"))
        self.net.load_state_dict(state[model])
        self.net.to(self.device).eval()
        self.anchors = _anchors()  # decoding runs on the CPU (see _collect)
        self._fine_seen: dict[tuple[int, int], int] = {}  # fine-view input sizes -> times seen
        self.background = background
        # The close look (see .close_look): the back model's candidates, re-scored by the front model and ONet.
        self.verify = model == "back" if verify is None else verify
        self.min_score = float(min_score) if min_score is not None else (
            DEFAULT_MIN_SCORE if self.verify else UNVERIFIED_MIN_SCORE)
        self.size = 256 if model == "back" else 128
        self.max_batch = 16
        # A large image is also seen in the fine view and, very large, in tiles (see FINE_SCALE, TILES_FROM),
        # where a small face is seen at a usable scale.
        self.tiles = tiles
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        # (padded batch, input dtype, height, width) -> (CUDA graph, static input, static outputs)
        self._graphs = Graphs(self.device, self._capture) if self.cuda_graphs else None
        # (the front model's own graphs off: its network runs inside the close look's)
        self.close_look = (CloseLook(BlazeFaceDetector(self.device, model="front", weights=path, cuda_graphs=False,
                                                       tiles=False, verify=False),
                                     load_onet(self.device), self.device, self.cuda_graphs, background)
                           if self.verify else None)
        if background and self._graphs is not None:
            self.prepare()

    def letterbox(self, images: Sequence[Union[np.ndarray, torch.Tensor]]) -> tuple[torch.Tensor, list[tuple[float, float, float]]]:
        """Each whole image scaled to fit the network's square input and padded with black (centred), on the
        detector's device: the ``(B, 3, S, S)`` input in [-1, 1] and, per image, ``(scale, pad_x, pad_y)``."""
        return views.letterbox(images, self.size, self.device)

    def detect(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.collect(self.launch(images))

    def small_face_limit(self, shape: tuple) -> float:
        """Faces under this size (longer side, px) in an image of ``shape`` are found only by the fine view and
        tiles (see WHOLE_VIEW_LEAST); 0 for an image those do not search."""
        long = max(shape[:2])
        return WHOLE_VIEW_LEAST * long / self.size if self.tiles and long > FINE_FROM * self.size else 0.0

    def launch(self, images: Sequence[np.ndarray], small: Optional[Sequence[bool]] = None,
               memory: Optional[Sequence] = None) -> tuple:
        """Queue every view of the images (``small``: per image, whether the fine view and tiles too; default
        all); :meth:`collect` decodes them. ``memory`` is not used: every candidate is looked at."""
        inputs, owners = [], []  # every image whole, then its tiles: (image index, x, y, tile side or 0)
        fine: dict[tuple, list[int]] = {}  # the images seen in the fine view, by size
        for i, image in enumerate(images):
            inputs.append(image)
            owners.append((i, 0, 0, 0))
            if not self.tiles or (small is not None and not small[i]):
                continue
            long = max(image.shape[:2])
            if long > FINE_FROM * self.size:
                fine.setdefault(tuple(image.shape[:2]), []).append(i)
            if long > TILES_FROM:
                for x, y, side in tile_grid(image.shape[0], image.shape[1], 2 * self.size):
                    inputs.append(image[y:y + side, x:x + side])
                    owners.append((i, x, y, side))
        parts = [self._launch(inputs[start:start + self.max_batch]) for start in range(0, len(inputs), self.max_batch)]
        for members in fine.values():  # one input size per group: one network call per max_batch images
            for start in range(0, len(members), self.max_batch):
                group = members[start:start + self.max_batch]
                parts.append(self._launch_fine([images[i] for i in group]))
                owners += [(i, 0, 0, -1) for i in group]  # side -1: the fine view, in the image's own pixels
        return parts, owners, [image.shape[:2] for image in images], (images if self.verify else None)

    def advance(self, handle):
        """Verified: the candidates decoded (waiting for the views' networks) and their close look queued; the
        handle :meth:`collect` finishes without waiting for more than the close look's networks."""
        if not self.verify or isinstance(handle, Looking):
            return handle
        candidates = self._candidates(handle, CANDIDATE_SCORE)
        return self.close_look.launch(handle[3], candidates)

    def collect(self, handle, min_score: Optional[float] = None) -> list[np.ndarray]:
        least = self.min_score if min_score is None else min_score
        if not self.verify:
            return self._candidates(handle, least)
        looking = self.advance(handle)
        out = []
        for faces, scores in zip(looking.candidates, looking.per_image()):
            faces = faces.copy()
            faces[:, 4] = scores
            out.append(best_first(faces, least))
        return out

    def _candidates(self, handle: tuple, least: float) -> list[np.ndarray]:
        """Each image's detections over its views (whole, fine view, tiles), a face once: from CANDIDATE_SCORE
        when verified, else from ``least``."""
        parts, owners, shapes, images = handle
        per_view = [faces for part in parts for faces in self._collect(*part, floor=least)]
        found: list[list[np.ndarray]] = [[] for _ in shapes]
        for faces, (i, x, y, side) in zip(per_view, owners):
            if side and len(faces):
                if not self.verify:
                    # Every tile is another chance for a face-like thing to pass: unverified, a face that only
                    # a tile sees needs TILE_MARGIN more.
                    faces = faces[faces[:, 4] >= min(least + TILE_MARGIN, 0.95)]
                if side > 0:
                    faces = inside_tile(faces, x, y, side, shapes[i])
                    faces[:, :4] += [x, y, x, y]
            found[i].append(faces)
        return [merge_detections(parts_) for parts_ in found]

    def warmup(self, shape: tuple = (720, 1280, 3)) -> None:
        """Pay at load what the first images would: every padded batch size once (and the fine view's unpadded
        counts), the close look's too, so kernel selection and graph capture are done before real images. In the
        background mode (its graphs captured in a thread of their own) one eager pass instead, the close look
        included: the kernels the first frames would wait for are loaded."""
        blank = np.zeros(shape, np.uint8)
        sizes = [1] if self.background else sorted({*powers_of_two(self.max_batch),
                                                    *range(1, self._fine_unpadded + 1)})
        for b in sizes:
            self.detect([blank] * b)
        if self.close_look is not None:  # a blank image has no candidate: the close look on a made-up one
            self.close_look.warmup(shape)

    def fine_view(self, images: Sequence[Union[np.ndarray, torch.Tensor]]) -> tuple[torch.Tensor, list[tuple[float, float, float]]]:
        """Images of one size, each scaled by FINE_SCALE (at most FINE_MAX_SIDE long) and padded with black on
        the right and below to whole cells of the network's coarser grid: ``(B, 3, H, W)`` in [-1, 1] on the
        device and, per image, ``(scale, 0, 0)`` (see :meth:`letterbox`)."""
        return views.fine_view(images, self.size, self.device)

    def _launch_fine(self, images: Sequence[np.ndarray]) -> tuple:
        x, params = self.fine_view(images)
        return self._launch_input(x, len(images), params)

    def _launch(self, images: Sequence[np.ndarray]) -> tuple:
        x, params = self.letterbox(images)
        return self._launch_input(x, len(images), params)

    def _launch_input(self, x: torch.Tensor, n: int, params: list) -> tuple:
        cells = (x.shape[2] * 16 // self.size, x.shape[3] * 16 // self.size)
        # A padded batch size (few distinct shapes: few autotuning runs, few graphs), except for a few images in the
        # fine view on a GPU (see FINE_UNPADDED).
        fine = tuple(x.shape[2:]) != (self.size, self.size)
        padded = n if fine and n <= self._fine_unpadded else padded_count(n)
        with torch.inference_mode():
            raw_boxes, raw_scores = self._forward(x, padded=padded, fresh=False)  # the outputs are read at once
            # Decoded on the CPU after one copy (57 KB an image, 0.7 MB in the fine view of a 1080p frame): as
            # GPU launches, its dozens of tiny operations and a sync per image cost more than the network itself.
            return (*to_host(torch.cat([raw_boxes[:n], raw_scores[:n]], dim=2).float()), params, cells)

    def _collect(self, raw: torch.Tensor, done: Optional["torch.cuda.Event"], params: list,
                 cells: tuple[int, int] = (16, 16), floor: Optional[float] = None) -> list[np.ndarray]:
        if done is not None:
            done.synchronize()
        raw = raw.numpy()
        # Verified: candidates from CANDIDATE_SCORE, looked at again; else the detections themselves.
        floor = CANDIDATE_SCORE if self.verify else (self.min_score if floor is None else floor)
        per_image = decode_blazeface(self.net, raw[..., :-1], raw[..., -1:], _anchors(*cells), floor)
        faces = [weighted_nms(dets, self.net.min_suppression_threshold) for dets in per_image]
        counts = [len(f) for f in faces]
        if not sum(counts):
            return [np.zeros((0, 5)) for _ in faces]
        # All images' faces at once: into image pixels (ymin, xmin, ymax, xmax -> x1, y1, x2, y2), then apart.
        d = np.concatenate(faces).astype(np.float64)
        view = np.repeat(np.asarray(params, np.float64), counts, axis=0)  # scale, pad_x, pad_y
        boxes = np.stack([d[:, 1], d[:, 0], d[:, 3], d[:, 2]], axis=1) * self.size
        boxes = (boxes - view[:, [1, 2, 1, 2]]) / view[:, :1]
        out = np.concatenate([boxes, d[:, -1:]], axis=1)
        return [part[np.argsort(-part[:, 4])] if len(part) else np.zeros((0, 5))
                for part in np.split(out, np.cumsum(counts)[:-1])]

    def prepare(self) -> None:
        """Capture the graph of every padded batch size, the close look's too, in the background."""
        dtype = next(self.net.parameters()).dtype
        self._graphs.prepare([(b, dtype, self.size, self.size) for b in powers_of_two(self.max_batch)][::-1])
        if self.close_look is not None:
            self.close_look.prepare()

    def wait_for_graphs(self) -> None:
        """Until the graphs being captured in the background, the close look's too, are ready."""
        if self._graphs is not None:
            self._graphs.wait()
        if self.close_look is not None:
            self.close_look.wait()

    def _capture(self, key: tuple, stream: "torch.cuda.Stream", error_mode: str) -> tuple:
        batch, dtype, height, width = key
        static_in = torch.zeros(batch, 3, height, width, device=self.device, dtype=dtype)
        graph, outputs = capture_graph(lambda: self.net(static_in), stream, error_mode)
        return graph, static_in, outputs

    def _graph_worth_it(self, size: tuple[int, int]) -> bool:
        """Whether an input of this size runs as a CUDA graph (see :func:`.graph_policy.graph_worth_it`)."""
        return graph_worth_it(self._fine_seen, size, self.size)

    def _forward(self, x: torch.Tensor, padded: Optional[int] = None,
                 fresh: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The network on ``x`` run as a batch of ``padded`` (default its own size; the outputs' rows past ``x``'s
        are not to be read); on a GPU as a CUDA graph per padded batch size and input size (eager, it is ~150 tiny
        launches). In the background mode a size first seen (the fine view's) is captured in the background.
        ``fresh=False``: a graph's outputs as they are, overwritten by its next replay (for a caller that only
        queues work reading them)."""
        padded = padded or len(x)
        key = (padded, x.dtype, *x.shape[2:])
        entry = None
        if self._graphs is not None and self._graph_worth_it(tuple(x.shape[2:])):
            entry = self._graphs.get(key, later=self.background)
        if entry is None:  # no graphs, or this one's is being captured in the background: the same network
            return self.net(pad_rows(x, padded))
        graph, static_in, (boxes, scores) = entry
        static_in[:len(x)].copy_(x)  # rows past them keep earlier inputs: their outputs are not read
        graph.replay()
        return (boxes.clone(), scores.clone()) if fresh else (boxes, scores)
