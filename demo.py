#!/usr/bin/env python
"""Read every face in photos: expression, valence, arousal and landmarks, with EmoNet.

    python demo.py --image photo.jpg
    python demo.py --image photos/ "more/*.png" --json results.json --output annotated/
"""
import argparse
import sys

from emonet import cli, photo


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Find every face in photos and report its expression, valence, arousal and 68 "
                    "landmarks (EmoNet). Text goes to stderr; --json - writes JSON to stdout.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--image", nargs="+", required=True, metavar="PATH",
                        help="image files, folders (searched recursively) or glob patterns")
    parser.add_argument("--json", metavar="FILE", help="write results as JSON to FILE ('-' for stdout)")
    parser.add_argument("--output", metavar="FILE|DIR",
                        help="annotated images: a file for one input image, else a folder")
    parser.add_argument("--refine", action="store_true",
                        help="second pass: re-crop each face from EmoNet's own landmarks, as in training")
    cli.add_model_arguments(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(cli.run(lambda: photo.run(arguments)))
