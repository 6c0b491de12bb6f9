#!/usr/bin/env python
"""Read every face in photos: expression, valence, arousal and landmarks, with EmoNet. Same as ``emonet-photo``; ``--help`` has examples."""
from emonet.apps.common import exit_tool
from emonet.apps.photo import main

if __name__ == "__main__":
    exit_tool(main(prog="demo.py"))
