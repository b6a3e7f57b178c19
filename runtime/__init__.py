"""norcal.runtime: host pre/post-processing, ONNX Runtime and TensorRT runners."""
