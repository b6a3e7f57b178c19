"""Every graph we trace from torch goes through :func:`trace_onnx`: torch's TorchScript
exporter with our settings, and the opset range the families' graphs need."""

from __future__ import annotations

import io
import warnings
from typing import Iterable

import onnx

from norcal.core.errors import NorcalError

MIN_OPSET = 17  # RoiAlign-16 (half_pixel) and Softmax-13 on the last axis


def max_opset() -> int:
    """The newest opset torch's TorchScript exporter writes (23 in torch 2.14); a newer one
    ends in torch's own error after the model was traced."""
    from torch.onnx import _constants

    return int(getattr(_constants, "ONNX_MAX_OPSET", 23))


def require_opset(opset: int) -> None:
    """Refuse an opset older than every family's graphs need."""
    if opset < MIN_OPSET:
        raise NorcalError(f"opset {opset} is too old: the export needs opset >= {MIN_OPSET}", param="opset")


def trace_onnx(module, args: tuple, input_names: Iterable[str], output_names: Iterable[str], opset: int,
               dynamic_axes: dict | None = None, internal: Iterable[str] = (), **options) -> onnx.ModelProto:
    """``module`` traced on ``args`` to ONNX (no gradients, constants folded, the tracer's chatter
    about Python ints silenced). ``internal``: outputs traced only to give their tensors a name,
    ordinary tensors again in the returned graph. ``options`` go to ``torch.onnx.export``."""
    import torch

    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=list(input_names), output_names=list(output_names),
                          dynamic_axes=dynamic_axes or None, opset_version=opset, dynamo=False,
                          do_constant_folding=True, **options)
    proto = onnx.load_from_string(buf.getvalue())
    proto.producer_name = "norcal-deploy"
    drop_outputs(proto, internal)
    return proto


def drop_outputs(proto: onnx.ModelProto, names: Iterable[str]) -> None:
    """Make the graph outputs ``names`` ordinary tensors (their producers and readers stay)."""
    hidden = set(names)
    kept = [o for o in proto.graph.output if o.name not in hidden]
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
