"""norcal.export: checkpoints of the detector families (``families``: detectron2, torchvision,
Ultralytics; foreign ONNX graphs) to ONNX of our output contract, the shared R-CNN they rebuild
(``rcnn``), the NorCal node's graph surgery (``graph``), the PyTorch reference runner
(``pytorch``) and the TensorRT-parser check (``trt_check``)."""
