"""The NorCal node: one ``ai.norcal::NorCal`` node backed by a model-local ONNX function.

Inputs: the classifier logits [..., K] and the initializer ``norcal.log_prior`` [K]
(log a_c per class, -log b at the background slot). The body is plain ONNX, so ONNX Runtime
and TensorRT's parser (>= 9.0) expand it with no plugin; ``inline=True`` writes the same ops
straight into the graph instead. What the body holds depends on the variant (the formulas
are listed in norcal.core.calibration; s = the prior sliced to the foreground slots, with the
background slot apart, for the logit mechanism only):

    softmax, exp/prob, renormalised:   Softmax(logits - log_prior)
    softmax, exp, not renormalised:    Exp(logits - log_prior)
    softmax, prob, not renormalised:   Exp(LogSoftmax(logits) - log_prior)
    softmax, logit:                    Softmax|Exp(Concat(logits_fg * Exp(-s_fg), logits_bg - s_bg))
    sigmoid, exp:                      Sigmoid(logits - log_prior)
    sigmoid, prob:                     Sigmoid(logits) * Exp(-log_prior)
    sigmoid, logit:                    Sigmoid(Concat(logits_fg * Exp(s_fg), logits_bg - s_bg))

The builders return onnx-graphsurgeon objects for :mod:`norcal.export.surgery`; names and
metadata keys come from :mod:`norcal.core.contract`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper

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
    renormalize: bool | None = None  # None: the head's own form (softmax yes, sigmoid no)
    activation: str = "softmax"
    background: str = "last"
    background_scale: float = 1.0
    count_type: str = "image"
    table: str = ""
    table_sha256: str = ""
    num_classes: int = 0
    min_count: float | None = None  # counts below it were raised to it (absent when unused)
    min_count_clamped: int | None = None  # how many classes that raised

    def validate(self) -> bool:
        """Refuse a variant that does not exist; return whether it renormalises."""
        return check_variant(self.mechanism, self.renormalize, self.activation)

    def metadata(self) -> dict[str, str]:
        """The settings' node keys (:data:`norcal.core.contract.NODE_KEYS`): what was computed
        (renormalize as resolved for the activation); unused fields left out."""
        values = {**asdict(self), "renormalize": self.validate()}
        out = {}
        for field, key in SETTING_KEYS.items():
            v = values[field]
            if v is None:
                continue
            if isinstance(v, bool):
                v = str(v).lower()
            elif field == "min_count":
                v = f"{v:g}"  # "2", not "2.0": counts are usually whole numbers
            out[key] = str(v)
        return out


# settings field -> node key; table and num_classes are runtime keys (see NorCalSettings)
SETTING_KEYS = {
    "gamma": contract.GAMMA, "factor": contract.FACTOR, "mechanism": contract.MECHANISM,
    "renormalize": contract.RENORMALIZE, "activation": contract.ACTIVATION,
    "background": contract.BACKGROUND, "background_scale": contract.BACKGROUND_SCALE,
    "count_type": contract.COUNT_TYPE, "table_sha256": contract.TABLE_SHA256,
    "min_count": contract.MIN_COUNT, "min_count_clamped": contract.MIN_COUNT_CLAMPED,
}


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


def _body(settings: NorCalSettings, x: str, prior: str, out: str, prefix: str) -> list[onnx.NodeProto]:
    """The ops computing ``out`` from logits ``x`` and ``prior``; names carry ``prefix``."""
    t = lambda s: f"{prefix}{s}"  # noqa: E731 - tensor/node names inside the body

    def node(op: str, inputs: list[str], output: str | None, **attrs) -> onnx.NodeProto:
        """One op writing the body tensor ``output``, or ``out`` when None."""
        return helper.make_node(op, inputs, [out if output is None else t(output)],
                                name=t(f"{op}_{output or 'out'}"), **attrs)

    renormalize = settings.validate()
    sigmoid = settings.activation == "sigmoid"
    if settings.mechanism == "prob" and not renormalize:
        if sigmoid:  # s_c / a_c
            return [node("Sigmoid", [x], "sigmoid"), node("Neg", [prior], "neg_prior"),
                    node("Exp", [t("neg_prior")], "inv_factor"),
                    node("Mul", [t("sigmoid"), t("inv_factor")], None)]
        return [node("LogSoftmax", [x], "log_probs", axis=-1),  # p(c|x) / a_c
                node("Sub", [t("log_probs"), prior], "shifted"), node("Exp", [t("shifted")], None)]
    if settings.mechanism == "logit":
        nodes = _logit_nodes(settings, x, prior, t, node)
    else:
        nodes = [node("Sub", [x, prior], "shifted")]
    z = nodes[-1].output[0]
    if sigmoid:
        return nodes + [node("Sigmoid", [z], None)]
    if renormalize:
        return nodes + [node("Softmax", [z], None, axis=-1)]
    return nodes + [node("Exp", [z], None)]  # no denominator


def _logit_nodes(settings: NorCalSettings, x: str, prior: str, t, node) -> list[onnx.NodeProto]:
    """Logits scaled by the factors (softmax: phi_c / a_c, sigmoid: phi_c * a_c); the background
    slot gets phi_bg + log b instead, since b multiplies exp(phi_bg) in every mechanism."""
    divide = settings.activation == "softmax"
    if settings.background == "none":
        neg = [node("Neg", [prior], "neg_prior")] if divide else []
        return neg + [node("Exp", [t("neg_prior") if divide else prior], "factor"),
                      node("Mul", [x, t("factor")], "scaled")]
    # [fg, bg] or [bg, fg] along the last axis: Slice with constant bounds (TensorRT-friendly)
    last = settings.background == "last"
    end = np.iinfo(np.int64).max
    bounds = {"fg": (0, -1), "bg": (-1, end)} if last else {"fg": (1, end), "bg": (0, 1)}
    const = lambda name, v: node("Constant", [], name, value=numpy_helper.from_array(np.array([v], np.int64)))  # noqa: E731
    nodes = [const("axis", -1)]
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
    return nodes + [node("Concat", parts, "scaled", axis=-1)]


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
