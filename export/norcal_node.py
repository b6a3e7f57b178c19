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
        """What was computed: renormalize as resolved for the activation; unused fields left out."""
        values = {**asdict(self), "renormalize": self.validate()}
        out = {}
        for k, v in values.items():
            if v is None:
                continue
            if isinstance(v, bool):
                v = str(v).lower()
            elif k == "min_count":
                v = f"{v:g}"  # "2", not "2.0": counts are usually whole numbers
            out[META_PREFIX + k] = str(v)
        return out


# what the surgery records besides the settings; with them, exactly what strip removes
SURGERY_KEYS = ("logits", "output", "node", "inline", "background_index", "tool_version")


def calibration_keys() -> set[str]:
    """The metadata_props keys the NorCal node owns (runtime contract keys are not among them)."""
    return {META_PREFIX + k for k in (*NorCalSettings.__dataclass_fields__, *SURGERY_KEYS)}


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
