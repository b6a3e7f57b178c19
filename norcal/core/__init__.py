"""The layer every other imports: the ONNX contract, resize rules, decodings, TensorRT profiles,
errors; calibration/ (NorCal math, tables), datasets/ (what annotations and labels are read as),
files/ (atomic writes, a run's outputs, ONNX and YAML reads, stop signals)."""
