"""norcal.export: detectron2 checkpoints to ONNX, and the NorCal node's graph surgery."""
