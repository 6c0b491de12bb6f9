"""Network definitions."""
from .emonet import EmoNet, ConvBlock, HourGlass, N_LANDMARKS

__all__ = ["EmoNet", "ConvBlock", "HourGlass", "N_LANDMARKS"]
