#!/usr/bin/env python
"""Read every face in a video, frame by frame: expression, valence, arousal and landmarks, with EmoNet. Same as ``emonet-video``; ``--help`` has examples."""
from emonet.apps.common import exit_tool
from emonet.apps.video import main

if __name__ == "__main__":
    exit_tool(main(prog="demo_video.py"))
