"""Any ONNX detector of no known family."""
