"""Fine-tuning EmoNet on a labelled set of faces (``emonet-train``): faces found and cropped once by the
tools' own detector and crop, cached on disk; the paper's objective; a checkpoint every tool loads."""
from .data import CropSet, TrainDataError, augment, crop_set, split
from .loop import TrainConfig, TrainResult, train
from .objective import objective

__all__ = ["CropSet", "TrainDataError", "augment", "crop_set", "split", "TrainConfig", "TrainResult", "train",
           "objective"]
