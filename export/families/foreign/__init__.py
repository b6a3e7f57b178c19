"""Any ONNX detector of no known family."""

from norcal.export.families.foreign.family import ForeignFamily

__all__ = ["ForeignFamily"]
