"""Files in and out: atomic writes, a run's outputs staged together, ONNX and YAML reads, the
stop signals a run honours."""
