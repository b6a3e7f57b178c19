"""The NorCal node: one ``ai.norcal::NorCal`` node backed by a model-local ONNX function.

Inputs: the classifier logits [..., K] and the initializer ``norcal.log_prior`` [K]
(log a_c per class, -log b at the background slot). The body is plain ONNX, so ONNX Runtime
and TensorRT's parser (>= 9.0) expand it with no plugin; ``inline=True`` writes the same ops
straight into the graph instead. What the body holds depends on the variant (the formulas
are listed in norcal.core.calibration.formula; s = the prior sliced to the foreground slots, with the
background slot apart, for the logit mechanism only):

    softmax, exp/prob, renormalised:   Softmax(logits - log_prior)
    softmax, exp, not renormalised:    Exp(logits - log_prior)
    softmax, prob, not renormalised:   Exp(LogSoftmax(logits) - log_prior)
    softmax, logit:                    Softmax|Exp(Concat(logits_fg * Exp(-s_fg), logits_bg - s_bg))
    sigmoid, exp:                      Sigmoid(logits - log_prior)
    sigmoid, prob:                     Sigmoid(logits) * Exp(-log_prior)
    sigmoid, logit:                    Sigmoid(Concat(logits_fg * Exp(s_fg), logits_bg - s_bg))

Classes on another axis than the last (YOLO's [B, C, A]): the body first reshapes the prior to
[K, 1, ..., 1] so that it broadcasts along that axis, and every axis-taking op (Softmax,
LogSoftmax, Slice, Concat) uses that axis, counted from the end.

The builders return onnx-graphsurgeon objects for :mod:`norcal.export.graph.surgery`; names and
metadata keys come from :mod:`norcal.core.contract`.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper

from norcal.core import contract
from norcal.core.calibration.formula import check_variant
from norcal.core.calibration.spec import Calibration
from norcal.core.errors import NorcalError


# what the node computes per (activation, mechanism, renormalised), as docs/variants.md writes
# it; phi the logits, log_prior [log a_1 .. log a_C, -log b], a_c the factor, b the background scale
_COMPUTED_AS = {
    ("softmax", "exp", True): "softmax(phi - log_prior)",
    ("softmax", "prob", True): "softmax(phi - log_prior)",
    ("softmax", "logit", True): "softmax([phi_c/a_c, phi_bg + log b])",
    ("softmax", "exp", False): "exp(phi - log_prior), not normalised",
    ("softmax", "prob", False): "exp(log_softmax(phi) - log_prior), not normalised",
    ("softmax", "logit", False): "exp([phi_c/a_c, phi_bg + log b]), not normalised",
    ("sigmoid", "exp", False): "sigmoid(phi - log_prior)",
    ("sigmoid", "prob", False): "sigmoid(phi) * exp(-log_prior)",
    ("sigmoid", "logit", False): "sigmoid(phi_c * a_c)",
}


def computed_as(mechanism: str, renormalize: bool | None, activation: str) -> str:
    """The formula the node computes for a variant (docs/variants.md, "computed as")."""
    renormalize = check_variant(mechanism, renormalize, activation)
    return _COMPUTED_AS[(activation, mechanism, renormalize)]


def _body(settings: Calibration, x: str, prior: str, out: str, prefix: str,
          axis: int = -1) -> list[onnx.NodeProto]:
    """The ops computing ``out`` from logits ``x`` and ``prior``; names carry ``prefix``.

    axis: the logits' class axis, counted from the end (-1: the last). Another axis gets the
    prior reshaped to [K, 1, ..., 1] first, so that it broadcasts along that axis."""
    t = lambda s: f"{prefix}{s}"  # noqa: E731 - tensor/node names inside the body

    def node(op: str, inputs: list[str], output: str | None, **attrs) -> onnx.NodeProto:
        """One op writing the body tensor ``output``, or ``out`` when None."""
        return helper.make_node(op, inputs, [out if output is None else t(output)],
                                name=t(f"{op}_{output or 'out'}"), **attrs)

    if axis >= 0:
        raise ValueError(f"the class axis is counted from the end here, got {axis}")
    head: list[onnx.NodeProto] = []
    if axis != -1:
        shape = numpy_helper.from_array(np.array([-1] + [1] * (-axis - 1), np.int64))
        head = [node("Constant", [], "prior_shape", value=shape),
                node("Reshape", [prior, t("prior_shape")], "prior_on_axis")]
        prior = t("prior_on_axis")
    return head + _variant_body(settings, x, prior, t, node, axis)


def _variant_body(settings: Calibration, x: str, prior: str, t, node, axis: int) -> list[onnx.NodeProto]:
    renormalize = settings.renormalized
    sigmoid = settings.activation == "sigmoid"
    if settings.mechanism == "prob" and not renormalize:
        if sigmoid:  # s_c / a_c
            return [node("Sigmoid", [x], "sigmoid"), node("Neg", [prior], "neg_prior"),
                    node("Exp", [t("neg_prior")], "inv_factor"),
                    node("Mul", [t("sigmoid"), t("inv_factor")], None)]
        return [node("LogSoftmax", [x], "log_probs", axis=axis),  # p(c|x) / a_c
                node("Sub", [t("log_probs"), prior], "shifted"), node("Exp", [t("shifted")], None)]
    if settings.mechanism == "logit":
        nodes = _logit_nodes(settings, x, prior, t, node, axis)
    else:
        nodes = [node("Sub", [x, prior], "shifted")]
    z = nodes[-1].output[0]
    if sigmoid:
        return nodes + [node("Sigmoid", [z], None)]
    if renormalize:
        return nodes + [node("Softmax", [z], None, axis=axis)]
    return nodes + [node("Exp", [z], None)]  # no denominator


def _logit_nodes(settings: Calibration, x: str, prior: str, t, node, axis: int) -> list[onnx.NodeProto]:
    """Logits scaled by the factors (softmax: phi_c / a_c, sigmoid: phi_c * a_c); the background
    slot gets phi_bg + log b instead, since b multiplies exp(phi_bg) in every mechanism."""
    divide = settings.activation == "softmax"
    if settings.background == "none":
        neg = [node("Neg", [prior], "neg_prior")] if divide else []
        return neg + [node("Exp", [t("neg_prior") if divide else prior], "factor"),
                      node("Mul", [x, t("factor")], "scaled")]
    # [fg, bg] or [bg, fg] along the class axis: Slice with constant bounds (TensorRT-friendly);
    # the prior has been reshaped so that its class axis is the same axis from the end
    last = settings.background == "last"
    end = np.iinfo(np.int64).max
    bounds = {"fg": (0, -1), "bg": (-1, end)} if last else {"fg": (1, end), "bg": (0, 1)}
    const = lambda name, v: node("Constant", [], name, value=numpy_helper.from_array(np.array([v], np.int64)))  # noqa: E731
    nodes = [const("axis", axis)]
    for part, (lo, hi) in bounds.items():
        nodes += [const(f"{part}_lo", lo), const(f"{part}_hi", hi)]
        for src, tag in ((x, "x"), (prior, "prior")):
            nodes.append(node("Slice", [src, t(f"{part}_lo"), t(f"{part}_hi"), t("axis")], f"{part}_{tag}"))
    if divide:
        nodes.append(node("Neg", [t("fg_prior")], "fg_neg_prior"))
    nodes += [node("Exp", [t("fg_neg_prior" if divide else "fg_prior")], "factor"),
              node("Mul", [t("fg_x"), t("factor")], "fg_scaled"),
              node("Sub", [t("bg_x"), t("bg_prior")], "bg_shifted")]
    parts = [t("fg_scaled"), t("bg_shifted")] if last else [t("bg_shifted"), t("fg_scaled")]
    return nodes + [node("Concat", parts, "scaled", axis=axis)]


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


def make_function(settings: Calibration, opset: int, axis: int = -1) -> gs.Function:
    """The model-local function ``ai.norcal::NorCal(logits, log_prior) -> probs`` (``axis``: the
    logits' class axis, from the end)."""
    io = {n: gs.Variable(n) for n in ("logits", "log_prior", "probs")}
    nodes = _gs_nodes(_body(settings, "logits", "log_prior", "probs", "", axis), io)
    return gs.Function(
        contract.NODE_OP_TYPE, domain=contract.NODE_DOMAIN, nodes=nodes,
        inputs=[io["logits"], io["log_prior"]], outputs=[io["probs"]], opset=opset,
        import_domains=[helper.make_opsetid("", opset)],
        doc_string="NorCal calibration (NeurIPS 2021): scores from logits with per-class log prior "
                   "subtracted; see metadata_props norcal.* for the variant.",
    )


def make_nodes(settings: Calibration, logits: gs.Tensor, prior: gs.Constant, output: gs.Tensor,
               inline: bool, axis: int = -1) -> list[gs.Node]:
    """Nodes that compute ``output`` from ``logits``: one NorCal node, or its body inlined."""
    if inline:
        tensors = {t.name: t for t in (logits, prior, output)}
        return _gs_nodes(_body(settings, logits.name, prior.name, output.name, contract.INLINE_PREFIX,
                               axis), tensors)
    return [gs.Node(contract.NODE_OP_TYPE, name=contract.NODE_NAME, domain=contract.NODE_DOMAIN,
                    inputs=[logits, prior], outputs=[output])]


def make_prior(log_prior: np.ndarray, dtype: int = onnx.TensorProto.FLOAT) -> gs.Constant:
    """The ``norcal.log_prior`` initializer [K], in the logits' element type."""
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    arr = np.asarray(log_prior, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise NorcalError("log prior holds a non-finite value")
    return gs.Constant(contract.PRIOR_NAME, arr.astype(np_dtype))
