#!/usr/bin/env python
"""Read every face in photos: expression, valence, arousal and landmarks, with EmoNet. Same as ``emonet-photo``; ``--help`` has examples."""
import sys

from emonet.apps.photo import main

if __name__ == "__main__":
    sys.exit(main(prog="demo.py"))
