"""Will TensorRT's ONNX parser take this model? A static check that needs no TensorRT.

``check_model`` expands model-local functions (TensorRT parses them since 9.0: what counts is
each body op), then checks every node against the TensorRT 10.15 support matrix
(:mod:`norcal.export.trt_support`): the operator, its data type, the attribute values and
inputs the parser restricts, the opset, and that every dynamic input dimension is covered by
an optimization profile. Findings name the node (name and op_type) and the reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from norcal.core.errors import NorcalError
from norcal.core.profiles import Profile, default_profiles, make_profile
from norcal.export import trt_support as ts

DEFAULT_DOMAINS = ("", "ai.onnx")

# Ops cheap and deterministic enough to fold when all their inputs are known constants, so that
# "must be resolvable to a constant" checks see through Cast/Concat/Unsqueeze chains.
_FOLDABLE = frozenset({
    "Identity", "Cast", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Neg", "Add", "Sub", "Mul",
    "Div", "Gather", "Slice", "ConstantOfShape", "Range", "Min", "Max", "Abs", "Floor", "Ceil",
    "Equal", "Where", "Expand", "Tile", "Transpose", "Sqrt", "ReduceProd", "ReduceMin", "ReduceMax",
})
_FOLD_MAX_ELEMENTS = 1 << 16


# ----------------------------------------------------------------------------- report

@dataclass
class Finding:
    """One problem: ``severity`` is "error" (TensorRT would refuse it) or "warning"."""

    severity: str
    node: str  # node name, with the calling function nodes before it ("norcal > sub")
    op_type: str
    reason: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.node} ({self.op_type}): {self.reason}"


@dataclass
class Report:
    """The outcome of :func:`check_model`."""

    tensorrt_version: str
    opset: int | None
    num_nodes: int  # after expanding local functions, subgraphs included
    op_types: list[str]
    findings: list[Finding] = field(default_factory=list)
    profiles: dict[str, Profile] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def compatible(self) -> bool:
        return not self.errors


# ----------------------------------------------------------------------------- graph walk

@dataclass
class _Node:
    proto: onnx.NodeProto  # names rewritten to the flattened graph's
    label: str
    opset: int  # default-domain opset the node is read with


def _is_default(domain: str) -> bool:
    return domain in DEFAULT_DOMAINS


def _label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index} {node.op_type}"


class _Flattener:
    """Expands local-function calls in place, renaming body tensors, resolving attribute refs."""

    def __init__(self, model: onnx.ModelProto, default_opset: int):
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.default_opset = default_opset
        self.top: list[_Node] = []  # what shape inference sees
        self.sub: list[_Node] = []  # nodes of If/Loop/Scan bodies, checked but not re-inferred
        self.counter = 0

    def run(self, graph: onnx.GraphProto) -> None:
        for i, node in enumerate(graph.node):
            self._emit(node, {}, None, "", _label(node, i), self.default_opset, self.top, 0)

    def _emit(self, node, attrs, rename, prefix, label, opset, out, depth):
        node = self._resolve(node, attrs, rename, prefix)
        key = (node.domain, node.op_type)
        fn = self.functions.get(key)
        # A function named like a built-in op is never expanded by TensorRT (its importer wins,
        # whatever the domain); _check_opsets reports it, and the node is checked as that op.
        if fn is not None and node.op_type not in ts.OPERATORS:
            if depth > 32:
                raise NorcalError(f"local function {fn.domain}.{fn.name}: nested more than 32 deep (recursive?)")
            self._expand(node, fn, label, out, depth)
            return
        out.append(_Node(node, label, opset))
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                for j, inner in enumerate(g.node):
                    self._emit(inner, {}, None, "", f"{label} > {a.name} > {_label(inner, j)}",
                               opset, self.sub, depth)

    def _expand(self, call, fn, label, out, depth):
        self.counter += 1
        prefix = f"__fn{self.counter}__"
        rename = {}
        for formal, actual in zip(fn.input, call.input):
            rename[formal] = actual
        for formal in fn.input[len(call.input):]:
            rename[formal] = ""  # omitted optional input
        for formal, actual in zip(fn.output, call.output):
            rename[formal] = actual
        attrs = {a.name: a for a in fn.attribute_proto}
        attrs.update({a.name: a for a in call.attribute})
        opset = next((o.version for o in fn.opset_import if _is_default(o.domain)), self.default_opset)
        for i, inner in enumerate(fn.node):
            self._emit(inner, attrs, rename, prefix, f"{label} > {_label(inner, i)}", opset, out, depth + 1)

    @staticmethod
    def _resolve(node, attrs, rename, prefix):
        if rename is None and not any(a.ref_attr_name for a in node.attribute):
            return node
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if rename is not None:
            def name(n):
                return n if n == "" else rename.get(n, prefix + n)
            new.input[:] = [name(n) for n in node.input]
            new.output[:] = [name(n) for n in node.output]
        del new.attribute[:]
        for a in node.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    b = onnx.AttributeProto()
                    b.CopyFrom(attrs[a.ref_attr_name])
                    b.name = a.name
                    new.attribute.append(b)
            else:
                new.attribute.append(a)
        return new


# ----------------------------------------------------------------------------- helpers

def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def _has_attr(node: onnx.NodeProto, name: str) -> bool:
    return any(a.name == name for a in node.attribute)


def _type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"


def _shape_text(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


class _Facts:
    """Types, shapes and constant values of the flattened graph's tensors."""

    def __init__(self):
        self.types: dict[str, int] = {}
        self.shapes: dict[str, list] = {}  # dims: int or a str (symbolic) or None (unknown)
        self.consts: dict[str, np.ndarray | None] = {}  # None: constant, value unreadable
        self.initializers: set[str] = set()
        self.constant_outputs: set[str] = set()  # outputs of Constant nodes (imported as weights)

    def add_value_info(self, vi: onnx.ValueInfoProto) -> None:
        if not vi.type.HasField("tensor_type"):
            return
        t = vi.type.tensor_type
        if t.elem_type:
            self.types[vi.name] = t.elem_type
        if t.HasField("shape"):
            self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                    for d in t.shape.dim]

    def static_shape(self, name: str) -> list[int] | None:
        dims = self.shapes.get(name)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        return dims

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def value(self, name: str) -> np.ndarray | None:
        return self.consts.get(name)


def _collect_types(graph: onnx.GraphProto, facts: _Facts) -> None:
    for vi in (*graph.input, *graph.output, *graph.value_info):
        facts.add_value_info(vi)
    for init in graph.initializer:
        facts.types.setdefault(init.name, init.data_type)
        facts.shapes.setdefault(init.name, list(init.dims))
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _collect_types(g, facts)


def _read_initializer(init: onnx.TensorProto) -> np.ndarray | None:
    if init.data_location == TensorProto.EXTERNAL and not init.raw_data:
        return None
    try:
        return numpy_helper.to_array(init)
    except Exception:  # unreadable (external data not loaded): constant, value unknown
        return None


def _fold(nodes: list[_Node], facts: _Facts) -> None:
    from onnx.reference import ReferenceEvaluator

    for n in nodes:
        p = n.proto
        if p.op_type == "Constant" and _is_default(p.domain):
            facts.constant_outputs.add(p.output[0])
            value = None
            if _has_attr(p, "value"):
                value = _read_initializer(_attr(p, "value"))
            elif any(_has_attr(p, k) for k in ("value_int", "value_ints", "value_float", "value_floats")):
                for k in ("value_int", "value_ints", "value_float", "value_floats"):
                    if _has_attr(p, k):
                        value = np.array(_attr(p, k))
            facts.consts[p.output[0]] = value
            continue
        if not _is_default(p.domain):
            continue
        if p.op_type in ("Shape", "Size") and p.input:
            dims = facts.static_shape(p.input[0])
            if dims is not None:
                if p.op_type == "Size":
                    facts.consts[p.output[0]] = np.array(int(np.prod(dims)), np.int64)
                else:
                    start, end = _attr(p, "start", 0), _attr(p, "end", None)
                    facts.consts[p.output[0]] = np.array(dims[start:end], np.int64)
            continue
        if p.op_type not in _FOLDABLE:
            continue
        ins = [i for i in p.input if i]
        if not ins or not all(facts.is_const(i) for i in ins):
            continue
        vals = [facts.value(i) for i in ins]
        if any(v is None or v.size > _FOLD_MAX_ELEMENTS for v in vals):
            for o in p.output:
                facts.consts[o] = None  # constant, but we do not compute it
            continue
        try:
            feeds = {i: facts.value(i) for i in ins}
            outs = ReferenceEvaluator(p, opsets={"": n.opset}).run(None, feeds)
        except Exception:
            for o in p.output:
                facts.consts[o] = None
            continue
        for o, v in zip(p.output, outs):
            facts.consts[o] = np.asarray(v) if np.asarray(v).size <= _FOLD_MAX_ELEMENTS else None


# ----------------------------------------------------------------------------- node checks

def _check_node(n: _Node, facts: _Facts, io_names: set[str], out: list[Finding]) -> None:
    p = n.proto

    def err(reason):
        out.append(Finding("error", n.label, p.op_type, reason))

    def warn(reason):
        out.append(Finding("warning", n.label, p.op_type, reason))

    if not _is_default(p.domain):
        if p.op_type in ts.OPERATORS:
            warn(f"domain '{p.domain}' is ignored: TensorRT dispatches on op_type alone and would "
                 f"import this as the built-in ONNX {p.op_type}")
        elif p.op_type.endswith("_TRT"):
            warn(f"imported as the TensorRT plugin '{p.op_type}': it must be in the plugin registry")
            return
        else:
            err(f"domain '{p.domain}' op is neither a model-local function nor a TensorRT operator; "
                f"the parser would need a plugin named '{p.op_type}' registered")
            return
    row = ts.op_support(p.op_type)
    if row is None:
        err(f"not in the TensorRT {ts.TENSORRT_VERSION} ONNX operator support matrix")
        return
    if not row.supported:
        err(f"not supported by TensorRT {ts.TENSORRT_VERSION}'s ONNX parser"
            + (f" ({row.restrictions})" if row.restrictions else ""))
        return
    _check_types(n, row, facts, io_names, err, warn)
    rule = _RULES.get(p.op_type)
    if rule is None and p.op_type in ts.REDUCE_OPS:
        rule = _rule_reduce
    if rule is not None:
        rule(n, facts, err, warn)


def _check_types(n, row, facts, io_names, err, warn):
    p = n.proto
    for o in p.output:
        t = facts.types.get(o)
        if t == TensorProto.UINT8 and o not in io_names:
            err(f"output '{o}' is UINT8 inside the network; TensorRT supports UINT8 only as a "
                f"network input or output")
        elif t == TensorProto.DOUBLE and o not in io_names:  # graph outputs: _check_io_types
            warn(f"output '{o}' is DOUBLE: TensorRT casts DOUBLE down to FLOAT (clamping to +-FLT_MAX)")
    if p.op_type in ("If", "Loop", "Scan"):
        return  # their types are the branch/body outputs', checked node by node
    if p.op_type == "Constant":
        value = _attr(p, "value")
        t = value.data_type if isinstance(value, TensorProto) else None
        what = "value"
    elif p.op_type == "ConstantOfShape":
        value = _attr(p, "value")
        t = value.data_type if isinstance(value, TensorProto) else TensorProto.FLOAT
        what = "value"
    elif p.op_type in ("RandomNormal", "RandomUniform"):
        t, what = _attr(p, "dtype", TensorProto.FLOAT), "dtype"
    else:
        idx = 1 if p.op_type == "Where" else 0
        if len(p.input) <= idx or not p.input[idx]:
            return
        what = f"input '{p.input[idx]}'"
        t = facts.types.get(p.input[idx])
    if not t:
        return  # type unknown (shape inference could not tell): nothing to judge
    name = ts.MATRIX_TYPE.get(t)
    allowed = ts.NONZERO_TYPES if p.op_type == "NonZero" else row.types
    if name == "DOUBLE":
        name = "FP32"  # the parser casts it down; warned where it is produced
    if name is None or name not in allowed:
        err(f"{what} is {_type_name(t)}; TensorRT {ts.TENSORRT_VERSION} supports {p.op_type} for "
            f"{', '.join(sorted(allowed))}")


def _const_input(p, idx) -> str | None:
    return p.input[idx] if len(p.input) > idx and p.input[idx] else None


def _rule_topk(n, facts, err, warn):
    p = n.proto
    if _attr(p, "sorted", 1) != 1:
        err("sorted=0: TensorRT requires sorted=1")
    k = None
    if n.opset < 10:
        k = _attr(p, "k")
    else:
        name = _const_input(p, 1)
        v = facts.value(name) if name else None
        if v is not None:
            k = int(np.asarray(v).reshape(-1)[0])
    if k is not None:
        if k >= ts.TOPK_K_LIMIT:
            err(f"K={k}: TensorRT needs K < {ts.TOPK_K_LIMIT}")
        return
    dims = facts.shapes.get(p.input[0])
    axis = _attr(p, "axis", -1)
    d = dims[axis] if dims and -len(dims) <= axis < len(dims) else None
    if isinstance(d, int) and d < ts.TOPK_K_LIMIT:
        return  # K <= the axis length, which is already below the limit
    warn(f"K is computed at run time and the axis length is {d if d is not None else 'unknown'}: "
         f"TensorRT fails unless K < {ts.TOPK_K_LIMIT}")


def _rule_roialign(n, facts, err, warn):
    p = n.proto
    if not _has_attr(p, "sampling_ratio"):
        err("sampling_ratio is not set: TensorRT's importer then uses 1 while ONNX means 0 "
            "(adaptive); write it explicitly")
    elif _attr(p, "sampling_ratio") < 0:
        err("sampling_ratio is negative")
    if n.opset >= 16:
        mode = _attr(p, "coordinate_transformation_mode", "half_pixel")
        if mode not in ts.ROIALIGN_COORD_MODES:
            err(f"coordinate_transformation_mode={mode!r}: TensorRT supports half_pixel or output_half_pixel")
    mode = _attr(p, "mode", "avg")
    if mode not in ts.ROIALIGN_MODES:
        err(f"mode={mode!r}: TensorRT supports avg or max")
    rois = facts.shapes.get(p.input[1]) if len(p.input) > 1 else None
    if rois is not None and (len(rois) != 2 or (isinstance(rois[1], int) and rois[1] != 4)):
        err(f"rois shape {_shape_text(rois)}: TensorRT needs [R, 4]")


def _rule_resize(n, facts, err, warn):
    p = n.proto
    mode = _attr(p, "mode", "nearest")
    if mode not in ts.RESIZE_MODES:
        err(f"mode={mode!r}: TensorRT supports nearest or linear")
    if n.opset >= 11:
        ctm = _attr(p, "coordinate_transformation_mode", "half_pixel")
        if ctm not in ts.RESIZE_COORD_MODES:
            err(f"coordinate_transformation_mode={ctm!r}: TensorRT supports "
                f"{', '.join(sorted(ts.RESIZE_COORD_MODES))}")
        nearest = _attr(p, "nearest_mode", "round_prefer_floor")
        if mode == "nearest" and nearest not in ts.RESIZE_NEAREST_MODES:
            err(f"nearest_mode={nearest!r}: TensorRT supports {', '.join(sorted(ts.RESIZE_NEAREST_MODES))}")
        if mode == "nearest" and ctm == "tf_half_pixel_for_nn" and nearest != "round_prefer_floor":
            err("tf_half_pixel_for_nn works only with nearest_mode=round_prefer_floor in TensorRT")
    if _attr(p, "antialias", 0):
        err("antialias=1: TensorRT does not support antialiasing")
    policy = _attr(p, "keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        err(f"keep_aspect_ratio_policy={policy!r}: TensorRT supports only stretch")
    axes = _attr(p, "axes")
    scales = _const_input(p, 2)
    if axes is not None and scales is not None:
        rank = len(facts.shapes.get(p.input[0]) or axes)
        if list(axes) != list(range(rank)):
            err(f"axes={list(axes)} with a scales input: TensorRT needs axes = 0..rank-1 ({rank})")


def _rule_upsample(n, facts, err, warn):
    mode = _attr(n.proto, "mode", "nearest")
    if mode not in ts.UPSAMPLE_MODES:
        err(f"mode={mode!r}: TensorRT supports nearest, linear or bilinear")


def _rule_reduce(n, facts, err, warn):
    p = n.proto
    name = _const_input(p, 1)
    if name is None:
        return  # axes as an attribute (older opsets) or absent (all axes)
    if name not in facts.initializers and name not in facts.constant_outputs:
        err(f"axes input '{name}' is computed: TensorRT needs it to be an initializer")


def _rule_squeeze(n, facts, err, warn):
    p = n.proto
    name = _const_input(p, 1)
    if name is not None:
        if not facts.is_const(name):
            err(f"axes input '{name}' is not resolvable to a constant, as TensorRT requires")
        return
    if _has_attr(p, "axes"):
        return
    if p.op_type == "Squeeze" and facts.static_shape(p.input[0]) is None:
        warn("Squeeze without axes on an input whose shape is not static: TensorRT must "
             "resolve which dims are 1 at build time")


def _rule_scatternd(n, facts, err, warn):
    red = _attr(n.proto, "reduction", "none")
    if red != "none":
        err(f"reduction={red!r}: TensorRT supports only reduction='none'")


def _rule_cast(n, facts, err, warn):
    p = n.proto
    to = _attr(p, "to")
    if p.op_type == "CastLike":
        to = facts.types.get(p.input[1]) if len(p.input) > 1 else None
    if to is None:
        return
    name = ts.MATRIX_TYPE.get(to)
    if name == "DOUBLE":
        if facts.types.get(p.output[0]) != TensorProto.DOUBLE:  # else already warned for the output
            warn("casts to DOUBLE: TensorRT casts to FLOAT instead")
    elif name not in ts.CAST_TARGETS:
        err(f"target type {_type_name(to)} is not one TensorRT casts to "
            f"({', '.join(sorted(ts.CAST_TARGETS))})")


def _rule_nms(n, facts, err, warn):
    p = n.proto
    boxes = facts.shapes.get(p.input[0])
    if boxes is not None and len(boxes) != 3:
        err(f"boxes shape {_shape_text(boxes)}: TensorRT needs a 3-D boxes tensor")
    if _attr(p, "center_point_box", 0) not in (0, 1):
        err("center_point_box must be 0 or 1")
    mob = _const_input(p, 2)
    if mob is not None and not facts.is_const(mob):
        warn(f"max_output_boxes_per_class '{mob}' is not constant: TensorRT then sizes the output "
             f"for every box of every class")
    scores = facts.shapes.get(p.input[1]) if len(p.input) > 1 else None
    limit = ts.NMS_BOXES_PER_BATCH_ITEM
    if scores is not None and len(scores) == 3 and all(isinstance(d, int) for d in scores[1:]):
        candidates = scores[1] * scores[2]
        if candidates > limit:
            warn(f"scores {_shape_text(scores)}: {candidates} (class, box) candidates per batch item, "
                 f"but TensorRT's NMS considers only the top {limit} "
                 f"({ts.NMS_BOXES_PER_BATCH_ITEM_SMALL_SM} on SM 5.3/6.2)")
    else:
        shape = _shape_text(scores) if scores is not None else "of unknown shape"
        warn(f"scores {shape}: TensorRT's NMS considers at most {limit} (class, box) candidates per "
             f"batch item ({ts.NMS_BOXES_PER_BATCH_ITEM_SMALL_SM} on SM 5.3/6.2); more are dropped")


def _rule_pool(n, facts, err, warn):
    p = n.proto
    dil = _attr(p, "dilations")
    if dil and any(d != 1 for d in dil):
        err(f"dilations={list(dil)}: TensorRT supports only dilations of 1")
    kernel = _attr(p, "kernel_shape")
    if kernel is not None and p.op_type != "LpPool" and len(kernel) not in (2, 3):
        err(f"{len(kernel)}-D pooling: TensorRT supports 2-D or 3-D only")
    if p.op_type == "MaxPool" and len(p.output) > 1 and p.output[1]:
        err("the Indices output is not supported by TensorRT")


def _rule_batchnorm(n, facts, err, warn):
    if _attr(n.proto, "training_mode", 0) == 1:
        err("training_mode=1 is not supported by TensorRT")


def _rule_dropout(n, facts, err, warn):
    name = _const_input(n.proto, 2)
    if name is None:
        return
    v = facts.value(name)
    if name not in facts.initializers or v is None or bool(np.asarray(v).reshape(-1)[0]):
        err(f"training_mode '{name}' must be an initializer that is False")


def _rule_constant(n, facts, err, warn):
    for a in ("sparse_value", "value_string", "value_strings"):
        if _has_attr(n.proto, a):
            err(f"attribute {a} is not supported by TensorRT")


def _rule_build_time_input(idx, what):
    def rule(n, facts, err, warn):
        name = _const_input(n.proto, idx)
        if name is not None and not facts.is_const(name):
            err(f"{what} '{name}' must be a build-time constant for TensorRT")
    return rule


def _rule_layernorm(n, facts, err, warn):
    if any(o for o in n.proto.output[1:]):
        err("only the first output (Y) is supported by TensorRT")


def _rule_zero_point(idx, what):
    def rule(n, facts, err, warn):
        name = _const_input(n.proto, idx)
        v = facts.value(name) if name else None
        if v is not None and np.any(np.asarray(v, dtype=np.float64) != 0):
            err(f"{what} must be zero for TensorRT")
    return rule


_RULES = {
    "TopK": _rule_topk,
    "RoiAlign": _rule_roialign,
    "Resize": _rule_resize,
    "Upsample": _rule_upsample,
    "Squeeze": _rule_squeeze,
    "Unsqueeze": _rule_squeeze,
    "ScatterND": _rule_scatternd,
    "Cast": _rule_cast,
    "CastLike": _rule_cast,
    "NonMaxSuppression": _rule_nms,
    "MaxPool": _rule_pool,
    "AveragePool": _rule_pool,
    "LpPool": _rule_pool,
    "BatchNormalization": _rule_batchnorm,
    "Dropout": _rule_dropout,
    "Constant": _rule_constant,
    "CumSum": _rule_build_time_input(1, "axis"),
    "OneHot": _rule_build_time_input(1, "depth"),
    "LayerNormalization": _rule_layernorm,
    "QuantizeLinear": _rule_zero_point(2, "y_zero_point"),
    "DequantizeLinear": _rule_zero_point(2, "x_zero_point"),
}


# ----------------------------------------------------------------------------- model checks

def _check_opsets(model, findings) -> int | None:
    default = None
    for o in model.opset_import:
        if _is_default(o.domain):
            default = o.version
    for f in model.functions:
        for o in f.opset_import:
            if _is_default(o.domain) and not ts.OPSET_MIN <= o.version <= ts.OPSET_MAX:
                findings.append(Finding("error", f"function {f.domain}.{f.name}", "-",
                                        f"opset {o.version} is outside TensorRT {ts.TENSORRT_VERSION}'s "
                                        f"range {ts.OPSET_MIN}..{ts.OPSET_MAX}"))
    if default is None:
        findings.append(Finding("error", "model", "-", "no default-domain opset import"))
    elif not ts.OPSET_MIN <= default <= ts.OPSET_MAX:
        findings.append(Finding("error", "model", "-", f"opset {default} is outside TensorRT "
                                f"{ts.TENSORRT_VERSION}'s range {ts.OPSET_MIN}..{ts.OPSET_MAX}"))
    for (domain, name) in {(f.domain, f.name) for f in model.functions}:
        if name in ts.OPERATORS:
            findings.append(Finding(
                "error", f"function {domain}.{name}", name,
                f"a local function named like the built-in ONNX op {name}: TensorRT imports the "
                f"built-in op for every {name} node and never uses the function's body"))
    return default


def _check_io_types(model, facts, findings) -> None:
    g = model.graph
    for kind, values in (("input", g.input), ("output", g.output)):
        for v in values:
            t = v.type.tensor_type.elem_type
            name = ts.MATRIX_TYPE.get(t)
            if name == "DOUBLE":
                findings.append(Finding("warning", f"graph {kind} '{v.name}'", "-",
                                        "DOUBLE: TensorRT casts it down to FLOAT"))
            elif t and (name is None or name in ts.QUANTIZED_TYPES):
                findings.append(Finding("error", f"graph {kind} '{v.name}'", "-",
                                        f"type {_type_name(t)} is not a TensorRT I/O type"))
    for init in g.initializer:
        if init.data_type == TensorProto.DOUBLE:
            findings.append(Finding("warning", f"initializer '{init.name}'", "-",
                                    "DOUBLE: TensorRT casts it down to FLOAT"))


def _check_profiles(model, facts, profiles, findings) -> None:
    inits = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    names = {v.name for v in inputs}
    for extra in sorted(set(profiles) - names):
        raise NorcalError(f"profile for {extra!r}: the model has no such input "
                          f"(inputs: {', '.join(sorted(names)) or 'none'})")
    for v in inputs:
        dims = facts.shapes.get(v.name)
        where = f"graph input '{v.name}'"
        if dims is None:
            findings.append(Finding("error", where, "-", "has no shape: TensorRT needs the input's rank"))
            continue
        dynamic = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int) or d <= 0]
        prof = profiles.get(v.name)
        if prof is None:
            if dynamic:
                what = ", ".join(f"dim {i} ({d or '?'})" for i, d in dynamic)
                findings.append(Finding("error", where, "-",
                                        f"dynamic {what} not covered by any profile; pass "
                                        f"--profile {v.name}:MIN:OPT:MAX"))
            continue
        if len(prof.min) != len(dims):
            findings.append(Finding("error", where, "-", f"profile {prof.text()} has rank "
                                    f"{len(prof.min)}, the input has rank {len(dims)} {_shape_text(dims)}"))
            continue
        for i, d in enumerate(dims):
            if isinstance(d, int) and d > 0 and not (prof.min[i] == prof.opt[i] == prof.max[i] == d):
                findings.append(Finding("error", where, "-", f"profile {prof.text()} sets dim {i}, "
                                        f"which the model fixes at {d}"))


def check_model(model: onnx.ModelProto | str | Path, profiles=None) -> Report:
    """Check an ONNX model against the TensorRT 10.15 ONNX parser without TensorRT.

    ``profiles``: {input name: Profile} or a list of Profiles (``--profile`` entries); inputs not
    named there get :func:`default_profiles` (the detector contract's inputs only).
    """
    if not isinstance(model, onnx.ModelProto):
        from norcal.core.onnx_io import load_onnx

        model = load_onnx(model)
    if isinstance(profiles, (list, tuple)):
        profiles = {p.input: p for p in profiles}
    given = dict(profiles or {})
    findings: list[Finding] = []
    opset = _check_opsets(model, findings)
    flat = _Flattener(model, opset or ts.OPSET_MAX)
    flat.run(model.graph)

    facts = _Facts()
    notes = []
    g = model.graph
    flat_graph = helper.make_graph([n.proto for n in flat.top], g.name or "main", g.input, g.output,
                                   g.initializer, value_info=g.value_info)
    flat_model = helper.make_model(flat_graph, opset_imports=[o for o in model.opset_import],
                                   ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(flat_model, check_type=False, strict_mode=False,
                                                     data_prop=True)
        _collect_types(inferred.graph, facts)
    except Exception as e:  # a model ONNX Runtime runs can still trip the inferencer
        notes.append(f"shape inference failed ({type(e).__name__}); type checks use declared types only")
        _collect_types(flat_graph, facts)
    for init in g.initializer:
        facts.initializers.add(init.name)
        facts.consts[init.name] = _read_initializer(init)
    _fold(flat.top + flat.sub, facts)

    _check_io_types(model, facts, findings)
    io_names = {v.name for v in (*g.input, *g.output)}
    nodes = flat.top + flat.sub
    for n in nodes:
        _check_node(n, facts, io_names, findings)

    defaults, assumption = default_profiles(model)
    merged = {**defaults, **given}
    if any(p.source == "default" for p in merged.values()):
        notes.append(assumption)
    _check_profiles(model, facts, merged, findings)
    return Report(ts.TENSORRT_VERSION, opset, len(nodes), sorted({n.proto.op_type for n in nodes}),
                  findings, merged, notes)
