"""The network, pure (one forward, as the spec describes it), and its released weights beside it."""
from .emonet import N_LANDMARKS, ConvBlock, EmoNet, HourGlass
from .weights import UNTRAINED_LABEL, WEIGHTS, CheckpointError, Weights, load_model

__all__ = ["EmoNet", "ConvBlock", "HourGlass", "N_LANDMARKS", "Weights", "WEIGHTS", "CheckpointError",
           "UNTRAINED_LABEL", "load_model"]
