"""Will TensorRT's ONNX parser take this model? A static check that needs no TensorRT.

``check_model`` expands model-local functions (TensorRT parses them since 9.0: what counts is
each body op), then checks every node against the TensorRT 10.15 support matrix
(:mod:`norcal.export.trt_check.support`): the operator, its data type, the attribute values and
inputs the parser restricts, the opset, and that every dynamic input dimension is covered by
an optimization profile. Findings name the node (name and op_type) and the reason.

Modules: report (Finding, Report), graph_walk (function expansion), folding (tensor facts,
constant folding), node_rules (per-op rules), model_checks (opsets, I/O, profiles, check_model).
"""

from .model_checks import check_model
from .report import Finding, Report

__all__ = ["Finding", "Report", "check_model"]
