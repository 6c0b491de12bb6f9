"""Make emonet/detection/onet.pth from facenet-pytorch's MTCNN ONet weights (facenet_pytorch/data/onet.pt in its
wheel, MIT; the weights are Kaipeng Zhang's MTCNN, MIT): the same tensors, saved as a plain state dict that
``torch.load(weights_only=True)`` reads, checked to give facenet-pytorch's outputs.

    pip download --no-deps facenet-pytorch==2.6.0 && unzip facenet_pytorch-2.6.0-py3-none-any.whl 'facenet_pytorch/data/onet.pt'
    python tools/convert_onet.py facenet_pytorch/data/onet.pt
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from emonet.detection.onet import ONET_WEIGHTS, ONet, load_onet  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="facenet_pytorch/data/onet.pt")
    args = parser.parse_args()
    state = torch.load(args.source, map_location="cpu", weights_only=True)
    ONet().load_state_dict(state)  # every tensor, and no other
    torch.save({k: v.contiguous().clone() for k, v in state.items()}, ONET_WEIGHTS)
    x = torch.rand(8, 3, 48, 48, generator=torch.Generator().manual_seed(0)) * 2 - 1
    net = ONet()
    net.load_state_dict(state)
    with torch.no_grad():
        same = torch.equal(net.eval()(x), load_onet("cpu")(x))
    print(f"wrote {ONET_WEIGHTS} ({ONET_WEIGHTS.stat().st_size // 1024} KB); outputs {'equal' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
