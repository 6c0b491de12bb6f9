"""Planning the annotated video's marks, and the canvas drawing them, chunk after chunk."""
import numpy as np
import pytest
import torch

from emonet.drawing import PALETTE, VideoCanvas
from emonet.drawing import marks as marks_module
from emonet.drawing.marks import Planner

from tests.test_canvas import NAMES, H, W, face, gradient


def chunks(count: int = 4, frames: int = 3):
    """Chunks of frames with faces of several sizes (several circumplex discs), some without a face."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        shapes, faces, colors = [], [], []
        for b in range(frames):
            fs = []
            for j in range(int(rng.integers(0, 3))):
                x1, y1, side = rng.uniform(-40, 450), rng.uniform(-40, 250), rng.uniform(40, 220)
                f = face((x1, y1, x1 + side, y1 + side), face_id=j, expression=int(rng.integers(0, 8)))
                f.valence, f.arousal = (float(v) for v in rng.uniform(-1, 1, 2))
                fs.append((f, [tuple(rng.uniform(-1, 1, 2)) for _ in range(int(rng.integers(0, 12)))]))
            shapes.append((H, W))
            faces.append(fs)
            colors.append([PALETTE[j % len(PALETTE)] for j in range(len(fs))])
        out.append((shapes, faces, colors))
    return out


def test_a_canvas_renders_a_planners_marks_as_it_draws_them_and_keeps_sprites_once():
    work = chunks()
    images = [torch.from_numpy(gradient(40 * b)) for b in range(3)]
    planner = Planner(NAMES, banner=True)  # the canvases below have a banner: marks go below it
    planned = [planner.plan(*chunk) for chunk in work]
    # Kept sprites (the discs, "no face found") go to the atlas once: later chunks name them.
    assert planned[0].atlas_at == 0 and planned[0].atlas_add is not None
    assert all(p.atlas_at > 0 for p in planned[1:])
    kept = sum(len(p.atlas_add) for p in planned if p.atlas_add is not None)
    assert kept == planned[-1].atlas_at + (len(planned[-1].atlas_add) if planned[-1].atlas_add is not None else 0)
    drawn, rendered = VideoCanvas(NAMES, banner="untrained"), VideoCanvas(NAMES, banner="untrained")
    for p, (_, faces, colors) in zip(planned, work):
        assert torch.equal(rendered.render(images, p), drawn.draw(images, faces, colors))


def test_a_full_atlas_starts_again_and_draws_the_same(monkeypatch):
    work = chunks(count=5)
    images = [torch.from_numpy(gradient(40 * b)) for b in range(3)]
    reference = VideoCanvas(NAMES)
    expected = [reference.draw(images, faces, colors) for _, faces, colors in work]
    monkeypatch.setattr(marks_module, "ATLAS_PIXELS", 60_000)  # a few discs
    planner, canvas = Planner(NAMES), VideoCanvas(NAMES)
    plans = [planner.plan(*chunk) for chunk in work]
    assert any(p.atlas_at == 0 and p.atlas_add is not None for p in plans[1:])  # started again
    for p, want in zip(plans, expected):
        assert torch.equal(canvas.render(images, p), want)


def test_marks_for_another_video_are_refused():
    canvas = VideoCanvas(NAMES)
    plan = Planner(NAMES).plan([(H // 2, W // 2)], [[]], [[]])
    with pytest.raises(ValueError, match="frames of"):
        canvas.render([torch.from_numpy(gradient())], plan)
