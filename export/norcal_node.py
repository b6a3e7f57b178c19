"""The NorCal node: one ``ai.norcal::NorCal`` node backed by a model-local ONNX function.

Inputs: the classifier logits [..., K] and the initializer ``norcal.log_prior`` [K]
(log a_c per class, -log b at the background slot). The body is plain ONNX, so ONNX Runtime
and TensorRT's parser (>= 9.0) expand it with no plugin; ``inline=True`` writes the same ops
straight into the graph instead. What the body holds depends on the variant:

    softmax, exp/prob, renormalised:   Softmax(logits - log_prior)
    softmax, exp/prob, not renorm.:    Exp(LogSoftmax(logits) - log_prior)
    softmax, logit:                    Softmax(logits * Exp(-log_prior))
    sigmoid, exp/prob:                 Sigmoid(logits - log_prior)
    sigmoid, logit:                    Sigmoid(logits * Exp(-log_prior))
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from norcal.core.calibration import check_variant
from norcal.core.errors import NorcalError

DOMAIN = "ai.norcal"
OP_TYPE = "NorCal"
PRIOR_NAME = "norcal.log_prior"
INLINE_PREFIX = "norcal/"
META_PREFIX = "norcal."


@dataclass
class NorCalSettings:
    """What is baked into a model; every field lands in metadata_props as ``norcal.<field>``."""

    gamma: float
    factor: str = "cdt"
    mechanism: str = "exp"
    renormalize: bool = True
    activation: str = "softmax"
    background: str = "last"
    background_scale: float = 1.0
    count_type: str = "image"
    table: str = ""
    table_sha256: str = ""
    num_classes: int = 0

    def validate(self) -> None:
        check_variant(self.mechanism, self.renormalize, self.activation)

    def metadata(self) -> dict[str, str]:
        out = {}
        for k, v in asdict(self).items():
            out[META_PREFIX + k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out


# what the surgery records besides the settings; with them, exactly what strip removes
SURGERY_KEYS = ("logits", "output", "node", "inline", "background_index", "tool_version")


def calibration_keys() -> set[str]:
    """The metadata_props keys the NorCal node owns (runtime contract keys are not among them)."""
    return {META_PREFIX + k for k in (*NorCalSettings.__dataclass_fields__, *SURGERY_KEYS)}


def _body(settings: NorCalSettings, x: str, prior: str, out: str, prefix: str) -> list[onnx.NodeProto]:
    """The ops computing ``out`` from logits ``x`` and ``prior``; names carry ``prefix``."""
    t = lambda s: f"{prefix}{s}"  # noqa: E731 - tensor/node names inside the body
    act = "Softmax" if settings.activation == "softmax" else "Sigmoid"
    act_attrs = {"axis": -1} if act == "Softmax" else {}
    if settings.mechanism == "logit":
        return [
            helper.make_node("Neg", [prior], [t("neg_prior")], name=t("Neg")),
            helper.make_node("Exp", [t("neg_prior")], [t("inv_factor")], name=t("Exp")),
            helper.make_node("Mul", [x, t("inv_factor")], [t("scaled")], name=t("Mul")),
            helper.make_node(act, [t("scaled")], [out], name=t(act), **act_attrs),
        ]
    if settings.activation == "softmax" and not settings.renormalize:
        return [
            helper.make_node("LogSoftmax", [x], [t("log_probs")], name=t("LogSoftmax"), axis=-1),
            helper.make_node("Sub", [t("log_probs"), prior], [t("shifted")], name=t("Sub")),
            helper.make_node("Exp", [t("shifted")], [out], name=t("Exp")),
        ]
    return [
        helper.make_node("Sub", [x, prior], [t("shifted")], name=t("Sub")),
        helper.make_node(act, [t("shifted")], [out], name=t(act), **act_attrs),
    ]


def make_function(settings: NorCalSettings, opset: int) -> onnx.FunctionProto:
    """The model-local function ``ai.norcal::NorCal(logits, log_prior) -> probs``."""
    return helper.make_function(
        DOMAIN, OP_TYPE, inputs=["logits", "log_prior"], outputs=["probs"],
        nodes=_body(settings, "logits", "log_prior", "probs", ""),
        opset_imports=[helper.make_opsetid("", opset)],
        doc_string="NorCal calibration (NeurIPS 2021): scores from logits with per-class log prior "
                   "subtracted; see metadata_props norcal.* for the variant.",
    )


def make_nodes(settings: NorCalSettings, logits: str, output: str, inline: bool) -> list[onnx.NodeProto]:
    """Nodes that compute ``output`` from ``logits``: one NorCal node, or its body inlined."""
    if inline:
        return _body(settings, logits, PRIOR_NAME, output, INLINE_PREFIX)
    return [helper.make_node(OP_TYPE, [logits, PRIOR_NAME], [output], name="NorCal", domain=DOMAIN)]


def make_prior(log_prior: np.ndarray, dtype: int = onnx.TensorProto.FLOAT) -> onnx.TensorProto:
    """The ``norcal.log_prior`` initializer [K], in the logits' element type."""
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    arr = np.asarray(log_prior, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise NorcalError("log prior holds a non-finite value")
    return numpy_helper.from_array(arr.astype(np_dtype), PRIOR_NAME)
