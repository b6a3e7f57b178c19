"""An export-friendly implementation of detectron2's GeneralizedRCNN family."""
