"""What every family's PyTorch side shares: the Runner over a torch model, the NorCal sigmoid
module, ONNX-exportable NMS / RoIAlign, and small torch helpers."""
