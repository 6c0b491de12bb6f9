"""The video runtime: sources yield frames, one runner takes them through detect -> track -> crop -> engine
-> results, sinks consume the results. The same for a file, a camera, a collection and frames from Python.

    from emonet.build import ModelOptions
    from emonet.video import VideoConfig, VideoInput, open_source, run_video, sinks_for

    config = VideoConfig(model=ModelOptions(weights="random"))
    run = run_video(VideoInput(lambda: open_source("clip.mp4", config, device), sinks_for(csv_path="rows.csv")), config)
"""
from .config import VideoConfig
from .loading import PipelineLoader
from .runner import Sink, StopToken, VideoInput, VideoRun, run_video, run_videos
from .sinks import AnnotatedSink, CallbackSink, Drawers, RowSink, SummarySink, sinks_for
from .sources import ArraySource, Source, open_source, open_sources

__all__ = ["VideoConfig", "PipelineLoader", "StopToken", "VideoInput", "VideoRun", "run_video", "run_videos",
           "AnnotatedSink", "CallbackSink", "Drawers", "RowSink", "Sink", "SummarySink", "sinks_for", "ArraySource",
           "Source", "open_source", "open_sources"]
