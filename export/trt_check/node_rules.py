"""Per-node checks against the TensorRT support matrix: operator, data types, and the attribute
values and inputs the parser restricts (one rule per op type)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from norcal.export.trt_check import support as ts

from .folding import Facts, get_attr, has_attr, shape_text, type_name
from .graph_walk import FlatNode, is_default
from .report import Finding


def check_node(n: FlatNode, facts: Facts, io_names: set[str], out: list[Finding]) -> None:
    p = n.proto

    def err(reason):
        out.append(Finding("error", n.label, p.op_type, reason))

    def warn(reason):
        out.append(Finding("warning", n.label, p.op_type, reason))

    if not is_default(p.domain):
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
        elif t == TensorProto.DOUBLE and o not in io_names:  # graph outputs: check_io_types
            warn(f"output '{o}' is DOUBLE: TensorRT casts DOUBLE down to FLOAT (clamping to +-FLT_MAX)")
    if p.op_type in ("If", "Loop", "Scan"):
        return  # their types are the branch/body outputs', checked node by node
    if p.op_type == "Constant":
        value = get_attr(p, "value")
        t = value.data_type if isinstance(value, TensorProto) else None
        what = "value"
    elif p.op_type == "ConstantOfShape":
        value = get_attr(p, "value")
        t = value.data_type if isinstance(value, TensorProto) else TensorProto.FLOAT
        what = "value"
    elif p.op_type in ("RandomNormal", "RandomUniform"):
        t, what = get_attr(p, "dtype", TensorProto.FLOAT), "dtype"
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
        err(f"{what} is {type_name(t)}; TensorRT {ts.TENSORRT_VERSION} supports {p.op_type} for "
            f"{', '.join(sorted(allowed))}")


def _const_input(p, idx) -> str | None:
    return p.input[idx] if len(p.input) > idx and p.input[idx] else None


def _rule_topk(n, facts, err, warn):
    p = n.proto
    if get_attr(p, "sorted", 1) != 1:
        err("sorted=0: TensorRT requires sorted=1")
    k = None
    if n.opset < 10:
        k = get_attr(p, "k")
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
    axis = get_attr(p, "axis", -1)
    d = dims[axis] if dims and -len(dims) <= axis < len(dims) else None
    if isinstance(d, int) and d < ts.TOPK_K_LIMIT:
        return  # K <= the axis length, which is already below the limit
    warn(f"K is computed at run time and the axis length is {d if d is not None else 'unknown'}: "
         f"TensorRT fails unless K < {ts.TOPK_K_LIMIT}")


def _rule_roialign(n, facts, err, warn):
    p = n.proto
    if not has_attr(p, "sampling_ratio"):
        err("sampling_ratio is not set: TensorRT's importer then uses 1 while ONNX means 0 "
            "(adaptive); write it explicitly")
    elif get_attr(p, "sampling_ratio") < 0:
        err("sampling_ratio is negative")
    if n.opset >= 16:
        mode = get_attr(p, "coordinate_transformation_mode", "half_pixel")
        if mode not in ts.ROIALIGN_COORD_MODES:
            err(f"coordinate_transformation_mode={mode!r}: TensorRT supports half_pixel or output_half_pixel")
    mode = get_attr(p, "mode", "avg")
    if mode not in ts.ROIALIGN_MODES:
        err(f"mode={mode!r}: TensorRT supports avg or max")
    rois = facts.shapes.get(p.input[1]) if len(p.input) > 1 else None
    if rois is not None and (len(rois) != 2 or (isinstance(rois[1], int) and rois[1] != 4)):
        err(f"rois shape {shape_text(rois)}: TensorRT needs [R, 4]")


def _rule_resize(n, facts, err, warn):
    p = n.proto
    mode = get_attr(p, "mode", "nearest")
    if mode not in ts.RESIZE_MODES:
        err(f"mode={mode!r}: TensorRT supports nearest or linear")
    if n.opset >= 11:
        ctm = get_attr(p, "coordinate_transformation_mode", "half_pixel")
        if ctm not in ts.RESIZE_COORD_MODES:
            err(f"coordinate_transformation_mode={ctm!r}: TensorRT supports "
                f"{', '.join(sorted(ts.RESIZE_COORD_MODES))}")
        nearest = get_attr(p, "nearest_mode", "round_prefer_floor")
        if mode == "nearest" and nearest not in ts.RESIZE_NEAREST_MODES:
            err(f"nearest_mode={nearest!r}: TensorRT supports {', '.join(sorted(ts.RESIZE_NEAREST_MODES))}")
        if mode == "nearest" and ctm == "tf_half_pixel_for_nn" and nearest != "round_prefer_floor":
            err("tf_half_pixel_for_nn works only with nearest_mode=round_prefer_floor in TensorRT")
    if get_attr(p, "antialias", 0):
        err("antialias=1: TensorRT does not support antialiasing")
    policy = get_attr(p, "keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        err(f"keep_aspect_ratio_policy={policy!r}: TensorRT supports only stretch")
    axes = get_attr(p, "axes")
    scales = _const_input(p, 2)
    if axes is not None and scales is not None:
        rank = len(facts.shapes.get(p.input[0]) or axes)
        if list(axes) != list(range(rank)):
            err(f"axes={list(axes)} with a scales input: TensorRT needs axes = 0..rank-1 ({rank})")


def _rule_upsample(n, facts, err, warn):
    mode = get_attr(n.proto, "mode", "nearest")
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
    if has_attr(p, "axes"):
        return
    if p.op_type == "Squeeze" and facts.static_shape(p.input[0]) is None:
        warn("Squeeze without axes on an input whose shape is not static: TensorRT must "
             "resolve which dims are 1 at build time")


def _rule_scatternd(n, facts, err, warn):
    red = get_attr(n.proto, "reduction", "none")
    if red != "none":
        err(f"reduction={red!r}: TensorRT supports only reduction='none'")


def _rule_cast(n, facts, err, warn):
    p = n.proto
    to = get_attr(p, "to")
    if p.op_type == "CastLike":
        to = facts.types.get(p.input[1]) if len(p.input) > 1 else None
    if to is None:
        return
    name = ts.MATRIX_TYPE.get(to)
    if name == "DOUBLE":
        if facts.types.get(p.output[0]) != TensorProto.DOUBLE:  # else already warned for the output
            warn("casts to DOUBLE: TensorRT casts to FLOAT instead")
    elif name not in ts.CAST_TARGETS:
        err(f"target type {type_name(to)} is not one TensorRT casts to "
            f"({', '.join(sorted(ts.CAST_TARGETS))})")


def _rule_nms(n, facts, err, warn):
    p = n.proto
    boxes = facts.shapes.get(p.input[0])
    if boxes is not None and len(boxes) != 3:
        err(f"boxes shape {shape_text(boxes)}: TensorRT needs a 3-D boxes tensor")
    if get_attr(p, "center_point_box", 0) not in (0, 1):
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
            warn(f"scores {shape_text(scores)}: {candidates} (class, box) candidates per batch item, "
                 f"but TensorRT's NMS considers only the top {limit} "
                 f"({ts.NMS_BOXES_PER_BATCH_ITEM_SMALL_SM} on SM 5.3/6.2)")
    else:
        shape = shape_text(scores) if scores is not None else "of unknown shape"
        warn(f"scores {shape}: TensorRT's NMS considers at most {limit} (class, box) candidates per "
             f"batch item ({ts.NMS_BOXES_PER_BATCH_ITEM_SMALL_SM} on SM 5.3/6.2); more are dropped")


def _rule_pool(n, facts, err, warn):
    p = n.proto
    dil = get_attr(p, "dilations")
    if dil and any(d != 1 for d in dil):
        err(f"dilations={list(dil)}: TensorRT supports only dilations of 1")
    kernel = get_attr(p, "kernel_shape")
    if kernel is not None and p.op_type != "LpPool" and len(kernel) not in (2, 3):
        err(f"{len(kernel)}-D pooling: TensorRT supports 2-D or 3-D only")
    if p.op_type == "MaxPool" and len(p.output) > 1 and p.output[1]:
        err("the Indices output is not supported by TensorRT")


def _rule_batchnorm(n, facts, err, warn):
    if get_attr(n.proto, "training_mode", 0) == 1:
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
        if has_attr(n.proto, a):
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


def _rule_qdq(zero_point: str):
    """Explicit quantization as TensorRT imports it: a constant scale, zero point 0 of a signed
    type, one scale per channel of ``axis``; per-channel scales on a computed (activation)
    input are warned."""
    check_zero = _rule_zero_point(2, zero_point)

    def rule(n, facts, err, warn):
        p = n.proto
        check_zero(n, facts, err, warn)
        zp = _const_input(p, 2)
        if zp is not None and facts.types.get(zp) in (TensorProto.UINT8, TensorProto.UINT16):
            err(f"{zero_point} is {type_name(facts.types[zp])}: TensorRT quantizes to signed INT8 "
                f"(symmetric, zero point 0), not to unsigned types")
        scale = _const_input(p, 1)
        if scale is None:
            return
        if not facts.is_const(scale):
            err(f"scale '{scale}' must be a build-time constant for TensorRT")
            return
        v = facts.value(scale)
        size = int(np.asarray(v).size) if v is not None else None
        if size is None:
            dims = facts.static_shape(scale)
            size = int(np.prod(dims)) if dims is not None else None
        if size is None or size <= 1:
            return
        if get_attr(p, "block_size", 0):
            return  # blocked (INT4 weight) quantization: TensorRT's own rules, not checked here
        if not facts.is_const(p.input[0]):
            # TensorRT's INT8 scheme scales activations per tensor and weights per channel;
            # a warning, as the parser's own message for the other case is not documented
            warn(f"per-channel scale ({size} values) on '{p.input[0]}', which is computed: TensorRT "
                 f"quantizes activations per tensor (one scale), weights per channel")
        dims = facts.shapes.get(p.input[0])
        axis = get_attr(p, "axis", 1)
        if dims is not None and -len(dims) <= axis < len(dims) and isinstance(dims[axis], int) \
                and dims[axis] != size:
            err(f"axis={axis} has {dims[axis]} channels but the scale has {size} values")
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
    "QuantizeLinear": _rule_qdq("y_zero_point"),
    "DequantizeLinear": _rule_qdq("x_zero_point"),
}
