#!/usr/bin/env python
"""Read every face in a video, frame by frame: expression, valence, arousal and landmarks, with EmoNet.

    python demo_video.py --video clip.mp4 --output annotated.mp4 --csv frames.csv
    python demo_video.py --video 0            # a camera
"""
import argparse
import sys

from emonet import cli, videotool


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Stream a video (or camera) through face detection, tracking and EmoNet; write an annotated "
                    "video and per-frame results. Ctrl-C or SIGTERM stops cleanly, keeping every finished frame.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--video", required=True, help="video file, or a camera index such as 0")
    parser.add_argument("--output", metavar="FILE", help="annotated video (.mp4, mp4v codec, same frame rate)")
    parser.add_argument("--no-video", action="store_true", help="analysis only: write no video")
    parser.add_argument("--csv", metavar="FILE", help="one row per face per frame (a frame with no face: one "
                                                       "row with empty values)")
    parser.add_argument("--jsonl", metavar="FILE", help="the same rows as JSON lines")
    parser.add_argument("--landmarks", action="store_true", help="add the 68 landmarks to the rows")
    parser.add_argument("--max-frames", type=int, default=None, help="stop after N frames")
    parser.add_argument("--start", type=float, default=0.0, help="start at this time (seconds)")
    parser.add_argument("--end", type=float, default=None, help="stop at this time (seconds)")
    parser.add_argument("--batch-size", type=int, default=8, help="frames whose faces go through EmoNet together")
    parser.add_argument("--detect-every", type=int, default=5,
                        help="run the face detector every N frames (and whenever no face is tracked); "
                             "in between, crop from the last landmarks")
    parser.add_argument("--max-faces", type=int, default=None, help="at most this many faces per frame")
    parser.add_argument("--smooth", action=argparse.BooleanOptionalAction, default=True,
                        help="temporal smoothing per face (weighted mean of the last 5 outputs)")
    cli.add_model_arguments(parser)
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.detect_every < 1 or (args.max_frames is not None and args.max_frames < 1):
        parser.error("--batch-size, --detect-every and --max-frames must be at least 1")
    if args.start < 0 or (args.end is not None and args.end <= args.start):
        parser.error("--start must be >= 0 and --end after --start")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(cli.run(lambda: videotool.run(arguments)))
