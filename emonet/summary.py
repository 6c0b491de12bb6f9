"""Per-video summaries a person reads: figures per face (:class:`VideoSummary`), the ``summary.csv`` of a
collection, and a plot of valence, arousal and expression over time (matplotlib, Agg)."""
from __future__ import annotations

import csv
import importlib
import io
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from .io import ipc
from .io.helper import HelperClient, start_helper
from .io.atomic import write_bytes, write_text
from .results import FaceResult


PLOT_FACES = 4  # faces drawn in a video's plot: those seen longest


@dataclass
class _Track:
    seconds: list = field(default_factory=list)
    valence: list = field(default_factory=list)
    arousal: list = field(default_factory=list)
    expression: list = field(default_factory=list)


class VideoSummary:
    """Collects a video's results frame by frame; :meth:`faces` gives the figures per face id."""

    def __init__(self, video: str, class_names: Sequence[str], fps: float, untrained: bool = False) -> None:
        self.video = video
        self.class_names = list(class_names)
        self.fps = fps
        self.untrained = untrained
        self.frames = 0
        self.tracks: dict[int, _Track] = {}
        self.note: Optional[str] = None         # why the frames read are not the whole video, if they are not
        self.provenance: Optional[dict] = None  # what made the results (emonet.provenance)

    def add(self, timestamp: float, faces: Sequence[FaceResult]) -> None:
        """One frame's faces (none: a frame without a face, still counted)."""
        self.frames += 1
        for face in faces:
            track = self.tracks.setdefault(face.face_id, _Track())
            track.seconds.append(timestamp)
            track.valence.append(face.valence)
            track.arousal.append(face.arousal)
            track.expression.append(face.expression)

    def faces(self) -> list[dict]:
        """Per face id: frames seen, valence and arousal mean and standard deviation, the share of frames
        with each expression, and the dominant one."""
        out = []
        for face_id in sorted(self.tracks):
            t = self.tracks[face_id]
            counts = np.bincount(np.asarray(t.expression, np.int64), minlength=len(self.class_names))
            shares = counts / max(1, counts.sum())
            row = {"face_id": face_id, "frames": len(t.seconds),
                   "valence_mean": _r(np.mean(t.valence)), "valence_std": _r(np.std(t.valence)),
                   "arousal_mean": _r(np.mean(t.arousal)), "arousal_std": _r(np.std(t.arousal))}
            row.update({f"share_{c}": _r(s) for c, s in zip(self.class_names, shares)})
            row["dominant_expression"] = self.class_names[int(counts.argmax())]
            out.append(row)
        return out

    def to_dict(self) -> dict:
        """The ``<stem>.summary.json`` content."""
        return {"video": self.video, "frames": self.frames, "fps": round(self.fps, 4),
                "class_names": self.class_names, "untrained": self.untrained, "faces": self.faces(), "error": None,
                "note": self.note, "provenance": self.provenance}

    def write_json(self, path: Union[str, Path]) -> None:
        """Write :meth:`to_dict` as JSON (atomically)."""
        write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    def plot(self, path: Union[str, Path], title: Optional[str] = None) -> None:
        """PNG: valence and arousal over time per face (per frame, and a 1-s moving average), with the
        expression over time as a coloured band beneath each face's curves; the faces seen longest, at
        most :data:`PLOT_FACES` of them (every face is in the summary's figures)."""
        import matplotlib
        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch

        from .drawing import PALETTE

        longest = sorted(self.tracks, key=lambda i: (-len(self.tracks[i].seconds), i))[:PLOT_FACES]
        ids = sorted(longest) or [None]
        # A fixed layout: matplotlib's constrained layout costs more than the drawing itself.
        fig = Figure(figsize=(11, 1.2 + 2.6 * len(ids)))
        height = fig.get_figheight()
        outer = fig.add_gridspec(len(ids), 1, left=0.07, right=0.8, top=1 - 0.75 / height, bottom=0.5 / height,
                                 hspace=0.6 / ((height - 1.25) / len(ids)))  # about 0.6 inch between faces
        colors = np.array(PALETTE, np.float64) / 255
        fps = self.fps or 1.0
        duration = self.frames / fps
        for k, face_id in enumerate(ids):
            inner = outer[k].subgridspec(2, 1, height_ratios=[4, 0.6], hspace=0.08)
            ax = fig.add_subplot(inner[0])
            band = fig.add_subplot(inner[1], sharex=ax)
            ax.set_ylim(-1.05, 1.05)
            ax.axhline(0, color="0.7", lw=0.8)
            ax.set_ylabel("valence / arousal")
            ax.grid(alpha=0.3)
            ax.tick_params(labelbottom=False)
            band.set_yticks([])
            if k == len(ids) - 1:
                band.set_xlabel("time (s)")
            if face_id is None:
                ax.set_title("no face found")
                ax.set_xlim(0, max(duration, 1e-3))
                continue
            t = self.tracks[face_id]
            s = np.asarray(t.seconds)
            window = max(1, int(round(fps)))
            for values, color, name in ((t.valence, "tab:blue", "valence"), (t.arousal, "tab:red", "arousal")):
                ax.plot(s, values, color=color, lw=0.6, alpha=0.35, label=f"{name} (per frame)")
                ax.plot(s, _moving_average(np.asarray(values), window), color=color, lw=1.8,
                        label=f"{name} (1-s average)")
            ax.set_title(f"face {face_id}: {len(s)} frames")
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
            # The band: one image, a pixel per frame of the video (white where this face is absent), so
            # its cost does not grow with the number of frames as one bar per frame did.
            end = max(duration, s[-1] + 1 / fps)
            strip = np.ones((1, max(1, int(round(end * fps))), 3))
            expr = np.asarray(t.expression)
            strip[0, np.clip(np.round(s * fps).astype(int), 0, strip.shape[1] - 1)] = colors[expr % len(colors)]
            band.imshow(strip, aspect="auto", extent=(0, end, 0, 1), interpolation="nearest")
            seen = sorted(set(expr.tolist()))
            band.legend(handles=[Patch(color=colors[i % len(colors)], label=self.class_names[i]) for i in seen],
                        loc="center left", bbox_to_anchor=(1.0, 0.5), ncol=2, fontsize=7, frameon=False)
            ax.set_xlim(0, end)
        more = len(self.tracks) - len(longest)
        fig.suptitle((title or Path(self.video).name)
                     + (f" ({more} more faces seen for less time: see the summary)" if more > 0 else "")
                     + (" (untrained weights: meaningless)" if self.untrained else ""))
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        write_bytes(path, buffer.getvalue())


FAST_EXIT = True  # the plotting process: every plot is written when serve_plots returns; no tear-down waited for


class PlotProcess:
    """Plots drawn by a process of its own, one after the other, while the caller goes on.

    A plot holds the GIL for a tenth of a second or more (matplotlib is Python): in a collection, drawn
    between videos, it left the GPU idle each time. The process imports NumPy and matplotlib only.
    ``submit`` hands a summary over (pickled: the process is this one's own child); :meth:`wait` returns
    once every plot is written, with the paths whose plot failed and why.
    """

    def __init__(self) -> None:
        self._helper: Optional[HelperClient] = None
        self._failed: dict[str, str] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the process now (once), so that it has imported matplotlib before the first plot: a run
        that starts it with its videos pays none of that after its last frame."""
        if self._helper is None:
            # A plot not handed over (the process had ended) fails with the process's reason.
            self._helper = HelperClient("plotting", start_helper("emonet.summary:serve_plots"),
                                        {"error": self._fail}, thread="emonet-plots",
                                        unsent=lambda item, why: self._fail(item[1], why))
            self._helper.start()

    def submit(self, summary: VideoSummary, path: Union[str, Path]) -> None:
        """Plot ``summary`` into ``path`` (atomically, as :meth:`VideoSummary.plot`); ``summary`` must not
        change afterwards."""
        self.start()
        # Sent from a thread: a summary larger than the pipe's buffer would otherwise wait here until the
        # process has finished the plot before (a tenth of a second or more).
        self._helper.send((summary, str(path)))

    def _fail(self, path: str, message: str) -> None:
        with self._lock:
            self._failed.setdefault(path, message)

    def wait(self) -> dict[str, str]:
        """Let every plot handed over be written; ``{path: why}`` for those that failed."""
        if self._helper is not None:
            failure = self._helper.close()  # the process died, or exited with an error
            if failure is not None:
                self._fail("", failure)
            self._helper = None
        return dict(self._failed)


def serve_plots() -> None:
    """The plotting process of :class:`PlotProcess`: ``(summary, path)`` messages (:mod:`emonet.io.ipc`) in, an
    ``("error", path, why)`` message out per failure.

    It ignores Ctrl-C (:mod:`emonet.io.helper`): the parent, which sees it too, closes its stdin, and the plots
    handed over are finished.
    """
    os.environ.setdefault("MPLBACKEND", "Agg")
    importlib.import_module("matplotlib.figure")  # now, while the caller's videos run, not at the first plot
    for summary, path in ipc.messages(sys.stdin.buffer):
        try:
            summary.plot(path)
        except Exception as exc:  # reported as that video's error; the others go on
            ipc.send(sys.stdout.buffer, ("error", path, f"{type(exc).__name__}: {exc}".replace("\n", " ")))


def _r(value: float) -> float:
    return round(float(value), 5)


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average, over the frames available at the ends."""
    window = min(window, len(values))
    if window <= 1:
        return values
    kernel = np.ones(window)
    sums = np.convolve(values, kernel, mode="same")
    counts = np.convolve(np.ones(len(values)), kernel, mode="same")
    return sums / counts


def summary_fields(class_names: Sequence[str]) -> list[str]:
    """The columns of ``summary.csv``."""
    return ["video", "face_id", "frames", "valence_mean", "valence_std", "arousal_mean", "arousal_std",
            *[f"share_{c}" for c in class_names], "dominant_expression", "untrained", "note", "error"]


def summary_rows(record: dict) -> list[dict]:
    """``summary.csv`` rows of one video's summary record (a failed or faceless video: one row, its note
    saying so)."""
    base = {"video": record["video"], "error": record.get("error") or "", "note": record.get("note") or "",
            "untrained": "" if record.get("error") else int(bool(record.get("untrained")))}
    if record.get("error"):
        return [{**base, "frames": 0, "face_id": ""}]
    if not record.get("faces"):
        note = "; ".join(n for n in ("no face", base["note"]) if n)
        return [{**base, "frames": record.get("frames", ""), "face_id": "", "note": note}]
    return [{**base, **face} for face in record["faces"]]


def write_summary_csv(path: Union[str, Path], records: Iterable[dict], class_names: Sequence[str]) -> None:
    """``summary.csv``: one row per (video, face id), in the order given (atomically)."""
    fields = summary_fields(class_names)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for record in records:
        for row in summary_rows(record):
            writer.writerow({f: row.get(f, "") for f in fields})
    write_text(path, buffer.getvalue())
