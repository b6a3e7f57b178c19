"""Ultralytics YOLO and RT-DETR checkpoints (.pt) and Ultralytics' own ONNX exports."""

from norcal.export.families.ultralytics.family import UltralyticsFamily

__all__ = ["UltralyticsFamily"]
