"""Where the video runtime's sinks send their work (emonet.video.sinks)."""
import torch

from emonet.drawing.process import DrawingProcess, LocalDrawing
from emonet.video import Drawers
from emonet.video.config import WAIT_FRAMES


def test_a_short_video_is_drawn_here_and_a_long_or_endless_one_by_a_drawing_process():
    short = Drawers(torch.device("cpu"))
    short.start(300)  # its start would outlast the model's load: none is started
    assert short.process is None and isinstance(short.choose(300), LocalDrawing)
    short.start(WAIT_FRAMES)  # decided with the first video, for all
    assert short.process is None
    short.close()
    for frames in (WAIT_FRAMES, None):  # None: a camera's, of unknown length
        drawers = Drawers(torch.device("cpu"))
        drawers.start(frames)
        try:
            assert isinstance(drawers.choose(frames), DrawingProcess) and drawers.chosen is drawers.process
        finally:
            drawers.close()
