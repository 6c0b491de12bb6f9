"""Drawing results: on photos with OpenCV (:mod:`.opencv`), on video frames with torch (:mod:`.canvas`)."""
from .canvas import VideoCanvas, coded_size, panel_width
from .opencv import PALETTE, annotate, draw_circumplex, draw_face, face_marks

__all__ = ["PALETTE", "VideoCanvas", "annotate", "coded_size", "draw_circumplex", "draw_face", "face_marks",
           "panel_width"]
