#!/usr/bin/env python
"""Evaluate EmoNet on AffectNet by the authors' protocol, or on any labelled face dataset (CSV). Same as ``emonet-eval``; ``--help`` has examples."""
import sys

from emonet.apps.evaluate import main

if __name__ == "__main__":
    sys.exit(main(prog="test.py"))
