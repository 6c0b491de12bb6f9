"""The fine-tuning loop: AdamW with a cosine schedule after a warm-up, autocast and gradient clipping on GPUs,
the evaluation's metrics on the validation set each epoch, the best checkpoint in the released format, a state
to resume from after an interruption, and ``torchrun`` (DDP) across GPUs.

What trains (``train``): ``head``, the last linear layers; ``emotion``, the emotion branch on the frozen landmark
network (the paper's way); ``all``, everything. Frozen parts stay in eval mode (their BatchNorm statistics kept).
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .. import __version__
from ..choices import DEFAULT_DETECTOR
from ..classes import class_names
from ..evaluation.datasets import FaceDataset, affectnet, csv_dataset
from ..distributed import join
from ..evaluation.loop import locate_faces
from ..io.atomic import AtomicFile, write_text
from ..log import progress_bar, say
from ..models.emonet import EmoNet
from ..models.weights import load_model
from ..provenance import weights_record
from .data import CropSet, Reader, TrainDataError, augment, batches, crop_set, split
from .objective import objective
from .report import (epoch_line, evaluate, flat_metrics, plot_curves, predict, predictions_csv, score_of,
                     write_log)

MODES = ("head", "emotion", "all")
DEFAULT_LR = {"head": 1e-3, "emotion": 3e-4, "all": 1e-4}
EMOTION_BRANCH = ("conv1x1_input_emo_2", "emo_net_2", "emo_fc_2")
WARM_STEPS = 3  # steps left out of the reported training rate


@dataclass
class TrainConfig:
    """What to fine-tune on what, and how (the options of ``emonet-train``)."""

    out_dir: str
    csv: Optional[str] = None               # a CSV of image, expression, valence, arousal (any target optional)
    affectnet: Optional[str] = None         # or an AffectNet root: <root>/train_fullpath.pkl (and val_... for --val)
    root: Optional[str] = None              # the CSV's images' folder (default: the CSV's)
    val: Optional[str] = None               # a validation CSV; default: AffectNet's val subset, or a split
    val_fraction: float = 0.1
    weights: str = "pretrained"             # pretrained, a checkpoint path, or random
    nclasses: Optional[int] = None          # with random weights (default 8); else read from the checkpoint
    train: str = "emotion"                  # head | emotion | all
    epochs: int = 10
    batch_size: int = 32
    lr: Optional[float] = None              # default by mode (DEFAULT_LR)
    weight_decay: float = 0.01
    warmup: float = 0.05                    # share of the steps the learning rate rises over
    clip: float = 1.0                       # gradients' norm, at most
    seed: int = 0
    augment: bool = True
    device: Optional[str] = None            # None: cuda:0, else the CPU
    precision: str = "auto"                 # auto: bf16 (fp16 where not supported) autocast on a GPU; fp32
    detector: str = DEFAULT_DETECTOR
    cache_dir: Optional[str] = None         # where the crops are cached (default: OUT/cache); runs may share it
    resume: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.train not in MODES:
            raise TrainDataError(f"--train must be one of {', '.join(MODES)}, not {self.train!r}")
        if (self.csv is None) == (self.affectnet is None):
            raise TrainDataError("give the training set as --csv FILE or --affectnet ROOT (one of them)")
        if self.epochs < 1 or self.batch_size < 2:
            raise TrainDataError("--epochs must be 1 or more and --batch-size 2 or more")
        if not 0 < self.val_fraction < 1:
            raise TrainDataError("--val-fraction must be between 0 and 1")
        if self.precision not in ("auto", "fp32"):
            raise TrainDataError(f"--precision must be auto or fp32, not {self.precision!r}")


@dataclass
class TrainResult:
    """Where the run left its files, and the validation metrics before training and at the best epoch."""

    best: Path
    log: Path
    before: dict
    after: dict
    best_epoch: int
    epochs_run: int
    interrupted: bool = False
    throughput: float = 0.0                 # training crops a second (augmentation included), after WARM_STEPS
    files: dict = field(default_factory=dict)


def trainable(model: EmoNet, mode: str) -> list[torch.nn.Parameter]:
    """Freeze all but what ``mode`` trains; the parameters that train."""
    for p in model.parameters():
        p.requires_grad_(mode == "all")
    if mode != "all":
        names = ("emo_fc_2",) if mode == "head" else EMOTION_BRANCH
        for name in names:
            for p in getattr(model, name).parameters():
                p.requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]


def set_train_mode(model: EmoNet, mode: str) -> None:
    """Training mode for what trains, eval mode (BatchNorm statistics kept) for the rest. The head's one BatchNorm
    keeps its statistics when only the head trains: a few thousand faces in small batches would estimate them
    worse than the data they came from, and the network then reads a face in training as it does afterwards."""
    model.eval()
    if mode == "all":
        model.train()
    elif mode == "emotion":
        for name in EMOTION_BRANCH:
            getattr(model, name).train()


@torch.no_grad()
def head_inputs(model: EmoNet, crops: np.ndarray, device: torch.device, batch: int = 64) -> torch.Tensor:
    """What the head (``emo_fc_2``) takes for each crop: with only the head training and the crops unchanged
    from epoch to epoch (no augmentation), the rest of the network runs once and epochs take the head alone."""
    taken: list[torch.Tensor] = []
    hook = model.emo_fc_2.register_forward_hook(lambda module, inputs, output: taken.append(inputs[0].float()))
    try:
        predict(model, crops, device, batch)
    finally:
        hook.remove()
    return torch.cat(taken)


def head_outputs(model: EmoNet, features: torch.Tensor) -> dict:
    """EmoNet's outputs from the head's inputs (see :func:`head_inputs`)."""
    out, n = model.emo_fc_2(features), model.n_expression
    return {"expression": out[:, :n], "valence": out[:, n], "arousal": out[:, n + 1]}


def _now(device: torch.device) -> float:
    """The clock once the device has done all it was given."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class StopVote:
    """Whether to stop before a step, the same answer in every process: alone, as soon as asked; under torchrun,
    once any process was asked, a step later (each step's flag is all-reduced without waiting and read at the next
    step, so no process stops while another waits for it in a collective, and the host stays a step ahead)."""

    def __init__(self, world: int, device: torch.device) -> None:
        self.world, self.device = world, device
        self._pending = None  # the last step's vote: (host copy, event)

    def __call__(self, asked: bool) -> bool:
        if self.world == 1:
            return asked
        import torch.distributed as dist

        agreed = False
        if self._pending is not None:
            host, done = self._pending
            if done is not None:
                done.synchronize()  # the vote's copy, queued before the last step's work: not that work
            agreed = bool(host.item())
        flag = torch.full((1,), float(asked), device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True).wait()  # on a GPU: the stream waits, not us
        if self.device.type == "cuda":
            host = torch.empty(1, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._pending = (host, done)
        else:
            self._pending = (flag, None)
        return agreed


def _save_state(path: Path, state: dict) -> None:
    with AtomicFile(path, "wb") as fh:
        torch.save(state, fh)


def _load_sets(config: TrainConfig, n: int, device: torch.device, main: bool) -> tuple[CropSet, CropSet, dict]:
    """The training and validation crops (made and cached by the main process), and what the data was."""
    from ..detection import create_detector
    from ..pipeline import Pipeline

    names = class_names(n)
    cache = Path(config.cache_dir) if config.cache_dir else Path(config.out_dir) / "cache"
    detector = []

    def locate(dataset: FaceDataset):
        if not detector:
            detector.append(create_detector(config.detector, device))
        return locate_faces(dataset, Pipeline(None, detector[0]), progress=config.progress and main)

    def load(dataset: FaceDataset) -> CropSet:
        return crop_set(dataset, cache, locate, config.detector, progress=config.progress and main)

    if config.affectnet:
        train_set = load(affectnet(Path(config.affectnet), "train", n, names)[0])
        val_set = None if config.val else load(affectnet(Path(config.affectnet), "val", n, names)[0])
        source = {"affectnet": str(Path(config.affectnet).resolve())}
    else:
        train_set = load(csv_dataset(Path(config.csv), config.root and Path(config.root), names))
        val_set = None
        source = {"csv": str(Path(config.csv).resolve())}
    if config.val:
        val_set = load(csv_dataset(Path(config.val), config.root and Path(config.root), names))
        source["val"] = str(Path(config.val).resolve())
    if val_set is None:
        train_idx, val_idx = split(len(train_set), config.val_fraction, config.seed)
        train_set, val_set = train_set.subset(train_idx), train_set.subset(val_idx)
        source["val"] = f"{config.val_fraction:g} of the training set, seed {config.seed}"
    if len(train_set) < 2:
        raise TrainDataError(f"{len(train_set)} training sample: at least 2 are needed")
    source.update({"train_samples": len(train_set), "val_samples": len(val_set)})
    return train_set, val_set, source


def train(config: TrainConfig) -> TrainResult:
    """Fine-tune as ``config`` says; see the module. Under ``torchrun`` every process trains on its share of each
    batch (DDP) and the first one evaluates and writes."""
    out = Path(config.out_dir)  # made once the data is read: bad input leaves nothing behind
    ddp = join(config.device)
    try:
        return _train(config, out, ddp, ddp.device(config.device))
    finally:
        ddp.close()


def _train(config: TrainConfig, out: Path, ddp, device_name: Optional[str]) -> TrainResult:
    model = load_model(config.weights, config.nclasses, device=device_name)
    device = next(model.parameters()).device
    base = weights_record(model.weights_source)
    names = class_names(model.n_expression)
    if ddp.main:
        train_set, val_set, source = _load_sets(config, model.n_expression, device, True)
    if ddp.world > 1:
        ddp.barrier()  # the main process made the cache; the others read it
        if not ddp.main:
            train_set, val_set, source = _load_sets(config, model.n_expression, device, False)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    gpu = device.type == "cuda"
    if gpu:  # one input shape throughout: cuDNN's fastest kernels for it; tensor cores read channels-last
        torch.backends.cudnn.benchmark = True
        model = model.to(memory_format=torch.channels_last)
    params = trainable(model, config.train)
    net = model
    if ddp.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            # The main process's BatchNorm statistics are what is saved, and they come from its own batches
            # either way (DDP would send them to the others before every step): no broadcast.
            model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False,
            # The same parameters take part in every step: the reducer keeps its buckets and hook order from the
            # first one, and the gradients stay in the buckets that are all-reduced (no copy back out of them).
            static_graph=True, gradient_as_bucket_view=True)
    lr = config.lr or DEFAULT_LR[config.train]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=config.weight_decay)
    steps_per_epoch = len(batches(len(train_set), config.batch_size, least=2 * ddp.world))
    total = steps_per_epoch * config.epochs
    warm = max(1, round(config.warmup * total))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    dtype = None
    if gpu and config.precision == "auto":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    state_path, best_path, log_path = out / "last.state", out / "best.pth", out / "log.csv"
    rows: list[dict] = []
    start_epoch, start_step, best_score, best_epoch = 0, 0, -math.inf, 0
    resumed_loss = None  # the stopped epoch's loss summed over its steps before the stop (its log row needs it)
    generator = torch.Generator().manual_seed(config.seed + 1000 * ddp.rank)
    # What a resumed run must share with the one that was stopped (the optimizer, the schedule and the batches
    # depend on them): checked before anything is loaded, said in one line.
    run_record = {"--train": config.train, "--epochs": config.epochs, "--batch-size": config.batch_size, "--lr": lr,
                  "--weight-decay": config.weight_decay, "--seed": config.seed, "augmentation": config.augment,
                  "--precision": config.precision, "classes": model.n_expression,
                  "data": dict(source)}
    if config.resume:
        if not state_path.is_file():
            raise TrainDataError(f"nothing to resume: {state_path} not found (start without --resume)")
        try:
            state = torch.load(state_path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a truncated or foreign file: said in one line
            raise TrainDataError(f"{state_path}: cannot be read as a saved state (damaged, or another kind of "
                                 f"file); start without --resume") from None
        if not isinstance(state, dict) or not {"model", "optimizer", "epoch", "step"} <= set(state):
            raise TrainDataError(f"{state_path}: not a state this trainer wrote; start without --resume")
        saved = json.loads(state.get("run", "null"))  # (None in states written before the record was kept)
        for key, value in (saved or {}).items():
            if json.loads(json.dumps(run_record.get(key))) != value:
                raise TrainDataError(
                    f"--resume goes on with the run that was stopped, but its {key} was {_said(value)} and this "
                    f"command gives {_said(run_record.get(key))}: give the same options, or a new --out")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        scaler.load_state_dict(state["scaler"])
        generator.set_state(state["generator"])
        start_epoch, start_step = state["epoch"], state["step"]
        resumed_loss = state.get("epoch_loss")  # (None in states written before it was kept)
        best_score, best_epoch, rows = state["best_score"], state["best_epoch"], json.loads(state["rows"])
        before = json.loads(state["before"])
        if ddp.main:
            say(f"resuming {state_path}: epoch {start_epoch + 1} of {config.epochs}, from its step {start_step + 1}")
    else:
        before, _ = evaluate(model, val_set, device) if ddp.main else ({}, None)

    # Only the head trains on crops that do not change: the rest of the network runs once.
    features = (head_inputs(model, train_set.crops, device)
                if config.train == "head" and not config.augment and ddp.world == 1 else None)
    stop = {"signal": None}
    previous = {s: signal.signal(s, lambda sig, _f: stop.update(signal=sig)) for s in (signal.SIGINT, signal.SIGTERM)}
    trained, seconds, done_steps, shapes = 0, 0.0, 0, set()
    vote, stopped = StopVote(ddp.world, device), False
    workers = min(4, max(1, (os.cpu_count() or 2) // (2 * ddp.world))) if gpu else 0

    def epoch_batches(epoch: int) -> list[np.ndarray]:
        """The epoch's batches, from the seed and the epoch alone (a resumed run takes the same ones)."""
        return batches(len(train_set), config.batch_size, torch.Generator().manual_seed(config.seed + epoch),
                       least=2 * ddp.world)

    def my_share(batch: np.ndarray) -> np.ndarray:
        return np.sort(np.array_split(batch, ddp.world)[ddp.rank])

    # One reader for the whole run: its processes read the next epoch's first batches while this one's
    # evaluation runs.
    first_step = start_step  # (bound now: the generator runs later, as the reader asks)
    plan = ([my_share(b) for b in epoch_batches(e)[first_step if e == start_epoch else 0:]]
            for e in range(start_epoch, config.epochs))
    reader = Reader(train_set, (b for bs in plan for b in bs), crops=features is None, workers=workers, pin=gpu)
    epoch = start_epoch
    try:
        for epoch in range(start_epoch, config.epochs):
            order = epoch_batches(epoch)
            # A resumed epoch's loss goes on from the steps it ran before the stop: its row is the uninterrupted one's.
            carried = epoch == start_epoch and start_step > 0 and resumed_loss is not None
            loss_sum = torch.full((), resumed_loss if carried else 0.0, device=device)
            counted, clock, ran = start_step if carried else 0, None, 0
            set_train_mode(model, config.train)
            bar = progress_bar(total=len(order), initial=start_step, desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch",
                       disable=not (config.progress and ddp.main), file=sys.stderr)
            step = start_step
            for step in range(start_step, len(order)):
                if vote(stop["signal"] is not None):
                    stopped = True
                    break
                # The rate at steady state: the first steps, and the first of each batch shape (an epoch's batches
                # differ by a crop where the set does not divide evenly), choose kernels and allocate; left out.
                shape = len(my_share(order[step]))
                if shape not in shapes and clock is not None:
                    seconds, clock = seconds + _now(device) - clock, None
                if shape in shapes and done_steps >= WARM_STEPS and clock is None:
                    clock = _now(device)
                shapes.add(shape)
                pixels, labels, valence, arousal, index = (t.to(device, non_blocking=True) for t in next(reader))
                if features is None:
                    x = pixels.permute(0, 3, 1, 2).float().div(255.0)  # (a channels-last view of the NHWC crops)
                    if config.augment:
                        x = augment(x, generator)
                with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                    outputs = net(x) if features is None else head_outputs(model, features[index])
                loss, _ = objective(outputs, labels, valence, arousal, generator)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, config.clip)
                scaler.step(optimizer)
                scaler.update()
                schedule.step()
                loss_sum += loss.detach()  # read at the epoch's end: no step waits for the GPU
                done_steps, ran = done_steps + 1, ran + 1
                if clock is not None:
                    trained += len(order[step])
                bar.update(1)
            if clock is not None:
                seconds += _now(device) - clock
            epoch_loss = float(loss_sum) / (counted + ran) if counted + ran else float("nan")
            bar.set_postfix(loss=f"{epoch_loss:.3f}", refresh=False)  # shown as the bar closes
            bar.close()
            if stopped:  # (asked during an epoch's last step: the epoch is finished, and the next one stops at once)
                start_step += ran  # resumed from the next step
                break
            start_step = 0
            if ddp.main:
                metrics, pred = evaluate(model, val_set, device)
                row = {"epoch": epoch + 1, "train_loss": epoch_loss,
                       "lr": schedule.get_last_lr()[0], **flat_metrics(metrics)}
                rows.append(row)
                score = score_of(metrics)
                if score > best_score:
                    best_score, best_epoch = score, epoch + 1
                    _write_best(model, best_path, pred, val_set, names, config, base, source, metrics, epoch + 1)
                write_log(rows, log_path)
                plot_curves(rows, out / "curves.png")
                say(epoch_line(row))
            ddp.barrier()
        else:
            epoch = config.epochs
    finally:
        reader.close()  # its reading processes end now, however the run ends (see Reader.close)
        for s, handler in previous.items():
            signal.signal(s, handler)
    interrupted = stopped or stop["signal"] is not None
    if ddp.main:
        _save_state(state_path, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
            "scaler": scaler.state_dict(), "generator": generator.get_state(), "epoch": epoch,
            "step": start_step if interrupted else 0, "best_score": best_score, "best_epoch": best_epoch,
            "rows": json.dumps(rows), "before": json.dumps(before), "run": json.dumps(run_record),
            "epoch_loss": float(loss_sum) if interrupted and start_step else None})
    after = json.loads((out / "best.meta.json").read_text())["metrics"] if best_path.is_file() and ddp.main else {}
    return TrainResult(best_path, log_path, before, after, best_epoch, len(rows), interrupted,
                       trained / seconds if seconds else 0.0,
                       {"state": state_path, "curves": out / "curves.png", "predictions": out / "best.predictions.csv"})


def _said(value) -> str:
    """A recorded option's value as the command line gives it."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _write_best(model, path, pred, val_set, names, config, base, source, metrics, epoch) -> None:
    state = {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
             for k, v in model.state_dict().items()}
    _save_state(path, state)
    write_text(path.with_name("best.predictions.csv"), predictions_csv(val_set, pred, names))
    meta = {"emonet_version": __version__, "torch_version": torch.__version__, "base_weights": base,
            "data": source, "seed": config.seed, "train": config.train, "epoch": epoch,
            "config": {k: v for k, v in asdict(config).items() if k not in ("progress", "resume", "cache_dir")},
            "metrics": metrics}
    write_text(path.with_name("best.meta.json"), json.dumps(meta, indent=2, default=float) + "\n")
