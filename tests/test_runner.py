"""The video runtime's runner (emonet.video.runner), driven directly: in-memory sources, collecting sinks."""
import ast
import csv
from pathlib import Path

import cv2
import numpy as np
import pytest

import emonet
from emonet.build import ModelOptions
from emonet.errors import HelperError, InputError
from emonet.results import FrameFaces, frame_fields, frame_row
from emonet.video import (ArraySource, CallbackSink, PipelineLoader, RowSink, StopToken, VideoConfig, VideoInput,
                          VideoRun, run_video, run_videos)
from emonet.video.runner import steady_rate

from .test_video import SAMPLE_PHOTO, demo_video, make_clip

PACKAGE = Path(__file__).resolve().parents[1] / "emonet"


def scene(i: int, face: np.ndarray) -> np.ndarray:
    """A 320x480 RGB frame with the sample face moving right, as the test clips have it."""
    canvas = np.full((320, 480, 3), 40, np.uint8)
    x = 10 + 3 * i
    canvas[30:286, x:x + 256] = face
    return canvas


@pytest.fixture(scope="module")
def face():
    return cv2.cvtColor(cv2.resize(cv2.imread(str(SAMPLE_PHOTO)), (256, 256)), cv2.COLOR_BGR2RGB)


@pytest.fixture(scope="module")
def config():
    return VideoConfig(model=ModelOptions(weights="random", device="cpu"), batch_size=4, detect_every=3)


@pytest.fixture(scope="module")
def loader(config):
    return PipelineLoader(config)


def test_frames_go_to_the_sinks_and_come_out_in_order_with_stable_ids(face, config, loader):
    got = []
    sink = CallbackSink(lambda frame, faces: got.append((frame.index, frame.timestamp, faces)))
    frames = [scene(i, face) for i in range(9)] + [np.full((320, 480, 3), 40, np.uint8)] * 3  # gone on a detection frame
    items = list(run_videos([VideoInput(ArraySource(frames, fps=20.0), [sink], progress=False)], config, loader))
    yielded, runs = items[:-1], items[-1:]
    assert all(isinstance(f, FrameFaces) for f in yielded) and isinstance(runs[0], VideoRun)
    assert [f.index for f in yielded] == list(range(12)) == [i for i, _, _ in got]
    assert [f.timestamp for f in yielded] == pytest.approx([i / 20.0 for i in range(12)])
    assert all(len(f.faces) == 1 and f.faces[0].face_id == 0 for f in yielded[:9])
    assert not any(f.faces for f in yielded[9:])
    assert [f.faces for f in yielded] == [faces for _, _, faces in got]  # the same objects, sinks and caller
    # Detected on every 3rd frame (and where the tracker asks again); tracked rows carry no detector score.
    assert all(yielded[i].faces[0].detected for i in (0, 3, 6))
    assert all(np.isnan(f.faces[0].score) != f.faces[0].detected for f in yielded[:9])
    run = runs[0]
    assert run.closed and not run.interrupted and run.error is None and run.frames == 12 and run.faces == 9
    # The wall clock's steady state: one interval between each chunk's results and the next's (12 frames, chunks
    # of 4: two), each of the later chunk's frames; three chunks are no steady state.
    assert [frames for _, frames in run.intervals] == [4, 4] and all(s > 0 for s, _ in run.intervals)
    assert steady_rate(run.intervals) is None


def test_the_steady_rate_is_the_median_time_a_frame_took_between_chunks_results():
    assert steady_rate([]) is None  # one chunk: nothing to measure between two
    # A slow first interval (the warm-up) does not move the median; a short chunk counts per frame; the final
    # chunk's interval (read with nothing queued behind it: sooner) is left out.
    assert steady_rate([(0.5, 4), (0.1, 2), (0.2, 4), (0.2, 4), (0.001, 4)]) == pytest.approx(20.0)
    # A short video has no steady state: the first interval and the final one are all there is.
    assert steady_rate([(0.5, 32), (0.001, 28)]) is None
    assert steady_rate([(0.5, 4), (0.2, 4), (0.001, 4)]) is None  # four chunks


def test_a_chunks_results_are_handed_out_after_the_next_chunk_is_queued(face, config, loader, monkeypatch):
    # The host's work on a chunk's results (smoothing, rows, the caller's own loop) runs while the GPU reads the
    # next chunk, not before that chunk is queued; the rows are those the tracker gives either way (other tests).
    pipeline = loader((320, 480, 3))
    launches = []
    real_launch = pipeline.launch
    monkeypatch.setattr(pipeline, "launch", lambda *a, **k: launches.append(len(launches)) or real_launch(*a, **k))
    queued_by_then = {}
    sink = CallbackSink(lambda frame, faces: queued_by_then.setdefault(frame.index, len(launches)))
    frames = [scene(i, face) for i in range(10)]  # chunks of 4: frames 0-3, 4-7, 8-9
    yielded = list(run_videos([VideoInput(ArraySource(frames), [sink], progress=False)], config, loader))
    assert [f.index for f in yielded[:-1]] == list(range(10)) and len(launches) == 3
    assert [queued_by_then[i] for i in (0, 3, 4, 7, 8, 9)] == [2, 2, 3, 3, 3, 3]


def test_a_collection_gives_each_video_its_own_frames_sinks_and_run(face, config, loader):
    seen = {"a": [], "b": []}
    videos = [VideoInput(ArraySource([scene(i, face) for i in range(n)], source=name),
                         [CallbackSink(lambda f, faces, name=name: seen[name].append(f.index))], progress=False)
              for name, n in (("a", 6), ("b", 5))]
    kinds = [(type(x).__name__, x.name if isinstance(x, VideoRun) else x.index) for x in run_videos(videos, config, loader)]
    assert kinds == ([("FrameFaces", i) for i in range(6)] + [("VideoRun", "a")]
                     + [("FrameFaces", i) for i in range(5)] + [("VideoRun", "b")])
    assert seen == {"a": list(range(6)), "b": list(range(5))}


def test_a_stop_ends_the_run_after_the_chunk_in_hand_keeping_every_row_written(face, config, loader, tmp_path):
    stop = StopToken()
    rows = RowSink(str(tmp_path / "rows.csv"))

    def ask(frame, faces):
        if frame.index == 5:
            stop.stop()

    frames = (scene(i % 40, face) for i in range(1000))  # a stream: no length
    run = run_video(VideoInput(ArraySource(frames), [rows, CallbackSink(ask)], progress=False), config, loader, stop)
    assert run.interrupted and run.error is None
    assert run.frames == 8  # the chunk in hand (frames 4-7) finished; the one queued behind it dropped
    written = list(csv.DictReader((tmp_path / "rows.csv").open()))
    assert [int(r["frame"]) for r in written] == list(range(run.frames))


def test_an_interrupt_while_a_chunk_is_queued_keeps_the_chunk_finished_before_it(face, config, loader, monkeypatch):
    # The previous chunk's results are handed out after the next chunk is queued; a Ctrl-C (or an error) while
    # it is queued must not lose them.
    pipeline = loader((320, 480, 3))
    real_launch, calls = pipeline.launch, []

    def launch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(pipeline, "launch", launch)
    got = []
    sink = CallbackSink(lambda frame, faces: got.append(frame.index))
    run = run_video(VideoInput(ArraySource([scene(i, face) for i in range(16)]), [sink], progress=False), config, loader)
    assert run.interrupted and run.frames == 8 and got == list(range(8))


def test_a_source_that_fails_part_way_keeps_the_frames_before_it(face, config, loader, tmp_path):
    def frames():
        for i in range(6):
            yield scene(i, face)
        yield np.zeros((10, 10), np.uint8)  # not an RGB image

    run = run_video(VideoInput(ArraySource(frames()), [RowSink(str(tmp_path / "rows.csv"))], progress=False),
                    config, loader)
    assert isinstance(run.error, InputError) and "frame 6 is not an RGB" in str(run.error)
    assert run.frames == 6  # every frame read before it
    assert [int(r["frame"]) for r in csv.DictReader((tmp_path / "rows.csv").open())] == list(range(6))


def test_a_decoding_process_that_dies_part_way_keeps_the_frames_it_handed_over(face, config, loader, tmp_path):
    class Dying(ArraySource):  # as the video reader does when its decoding process dies
        def __iter__(self):
            yield from super().__iter__()
            raise HelperError("the decoding process died (killed by SIGKILL)")

    run = run_video(VideoInput(Dying([scene(i, face) for i in range(6)]), [RowSink(str(tmp_path / "rows.csv"))],
                               progress=False), config, loader)
    assert isinstance(run.error, HelperError) and run.frames == 6
    assert [int(r["frame"]) for r in csv.DictReader((tmp_path / "rows.csv").open())] == list(range(6))


def test_the_api_gives_the_rows_the_video_tool_writes(tmp_path):
    clip = make_clip(tmp_path / "clip.mp4", frames=40, blank_from=34)
    out = demo_video("--video", clip, "--csv", tmp_path / "tool.csv", "--weights", "random", "--device", "cpu",
                     "--detect-every", "4")
    assert out.returncode == 0, out.stderr
    tool = list(csv.reader((tmp_path / "tool.csv").open()))
    reader = emonet.Reader(weights="random", device="cpu")
    fields = frame_fields(reader.class_names, False)
    api = [fields + ["untrained"]]
    for frame in reader.video(str(clip), detect_every=4):
        for face in frame.faces or [None]:
            row = frame_row(face, frame.index, frame.timestamp, reader.class_names, False)
            api.append(["" if row.get(f) is None else str(row[f]) for f in fields] + ["1"])  # as csv writes them
    assert len(api) == len(tool) == 41 and api == tool


def test_the_api_reads_frames_handed_in_from_python(face):
    reader = emonet.Reader(weights="random", device="cpu", batch_size=4)
    frames = list(reader.video([scene(i, face) for i in range(7)], fps=10.0))
    assert [f.index for f in frames] == list(range(7)) and frames[3].timestamp == pytest.approx(0.3)
    assert all(len(f.faces) == 1 for f in frames)


def _imports(path: Path) -> set[str]:
    """The emonet modules ``path`` imports (relative imports resolved)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("emonet")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("emonet"):
                found.add(name)
                found |= {f"{name}.{a.name}" for a in node.names}
    return found


def test_the_library_never_imports_the_tools_and_has_no_import_cycle():
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    offenders = sorted(f"{m} -> {i}" for m, deps in graph.items() if not m.startswith("emonet.apps")
                       for i in deps if i.startswith("emonet.apps"))
    assert not offenders, offenders
    # A package's __init__ that gathers its submodules is no cycle of theirs: edges into a package are dropped.
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    edges = {m: {d for d in deps if d not in packages} for m, deps in graph.items()}
    state: dict = {}

    def visit(m, path):
        state[m] = "open"
        for d in edges[m]:
            if state.get(d) == "open":
                raise AssertionError(" -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])


def test_the_model_loads_while_the_video_opens_and_says_so_only_once_it_is_used(face, config, capsys):
    def unreadable():
        raise InputError("clip.mp4: no such video file")

    fresh = PipelineLoader(config)
    with pytest.raises(InputError, match="no such video file"):
        list(run_videos([VideoInput(unreadable, progress=False)], config, fresh))
    assert "EmoNet (" not in capsys.readouterr().err  # input that cannot be opened: its one line, no model's
    fresh = PipelineLoader(config)
    run = run_video(VideoInput(ArraySource([face] * 3), progress=False), config, fresh)
    assert run.frames == 3 and capsys.readouterr().err.count("EmoNet (") == 1
