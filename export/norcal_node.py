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

The builders return onnx-graphsurgeon objects for :mod:`norcal.export.surgery`; names and
metadata keys come from :mod:`norcal.core.contract`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from norcal.core import contract
from norcal.core.calibration import check_variant
from norcal.core.errors import NorcalError


@dataclass
class NorCalSettings:
    """What is baked into a model. :meth:`metadata` gives the node keys; ``table`` and
    ``num_classes`` describe the model's classes, so they are runtime keys, written by
    :func:`norcal.export.calibrate_onnx.calibrate_onnx` rather than by the node."""

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
        """The settings' node keys (:data:`norcal.core.contract.NODE_KEYS`) and values."""
        out = {}
        for field, key in SETTING_KEYS.items():
            v = getattr(self, field)
            out[key] = str(v).lower() if isinstance(v, bool) else str(v)
        return out


# settings field -> node key; table and num_classes are runtime keys (see NorCalSettings)
SETTING_KEYS = {
    "gamma": contract.GAMMA, "factor": contract.FACTOR, "mechanism": contract.MECHANISM,
    "renormalize": contract.RENORMALIZE, "activation": contract.ACTIVATION,
    "background": contract.BACKGROUND, "background_scale": contract.BACKGROUND_SCALE,
    "count_type": contract.COUNT_TYPE, "table_sha256": contract.TABLE_SHA256,
}


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


def _gs_nodes(protos: list[onnx.NodeProto], tensors: dict[str, gs.Tensor]) -> list[gs.Node]:
    """graphsurgeon nodes for ``protos``, wired to ``tensors`` by name (new names become Variables)."""
    def tensor(name: str) -> gs.Tensor:
        if name not in tensors:
            tensors[name] = gs.Variable(name)
        return tensors[name]

    return [gs.Node(p.op_type, name=p.name, domain=p.domain or None,
                    attrs={a.name: helper.get_attribute_value(a) for a in p.attribute},
                    inputs=[tensor(n) for n in p.input], outputs=[tensor(n) for n in p.output])
            for p in protos]


def make_function(settings: NorCalSettings, opset: int) -> gs.Function:
    """The model-local function ``ai.norcal::NorCal(logits, log_prior) -> probs``."""
    io = {n: gs.Variable(n) for n in ("logits", "log_prior", "probs")}
    nodes = _gs_nodes(_body(settings, "logits", "log_prior", "probs", ""), io)
    return gs.Function(
        contract.NODE_OP_TYPE, domain=contract.NODE_DOMAIN, nodes=nodes,
        inputs=[io["logits"], io["log_prior"]], outputs=[io["probs"]], opset=opset,
        import_domains=[helper.make_opsetid("", opset)],
        doc_string="NorCal calibration (NeurIPS 2021): scores from logits with per-class log prior "
                   "subtracted; see metadata_props norcal.* for the variant.",
    )


def make_nodes(settings: NorCalSettings, logits: gs.Tensor, prior: gs.Constant, output: gs.Tensor,
               inline: bool) -> list[gs.Node]:
    """Nodes that compute ``output`` from ``logits``: one NorCal node, or its body inlined."""
    if inline:
        tensors = {t.name: t for t in (logits, prior, output)}
        return _gs_nodes(_body(settings, logits.name, prior.name, output.name, contract.INLINE_PREFIX),
                         tensors)
    return [gs.Node(contract.NODE_OP_TYPE, name=contract.NODE_NAME, domain=contract.NODE_DOMAIN,
                    inputs=[logits, prior], outputs=[output])]


def make_prior(log_prior: np.ndarray, dtype: int = onnx.TensorProto.FLOAT) -> gs.Constant:
    """The ``norcal.log_prior`` initializer [K], in the logits' element type."""
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    arr = np.asarray(log_prior, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise NorcalError("log prior holds a non-finite value")
    return gs.Constant(contract.PRIOR_NAME, arr.astype(np_dtype))
