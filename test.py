#!/usr/bin/env python
"""Evaluate EmoNet on AffectNet by the authors' protocol, or on any labelled face dataset (CSV). Same as ``emonet-eval``; ``--help`` has examples."""
from emonet.apps.common import exit_tool
from emonet.apps.evaluate import main

if __name__ == "__main__":
    exit_tool(main(prog="test.py"))
