"""Facts about the flattened graph's tensors (types, shapes, constant values), with the small
constant folding that lets "must be a constant" checks see through Cast/Concat/Unsqueeze chains."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph_walk import FlatNode, is_default

# Ops cheap and deterministic enough to fold when all their inputs are known constants, so that
# "must be resolvable to a constant" checks see through Cast/Concat/Unsqueeze chains.
_FOLDABLE = frozenset({
    "Identity", "Cast", "Unsqueeze", "Squeeze", "Concat", "Reshape", "Neg", "Add", "Sub", "Mul",
    "Div", "Gather", "Slice", "ConstantOfShape", "Range", "Min", "Max", "Abs", "Floor", "Ceil",
    "Equal", "Where", "Expand", "Tile", "Transpose", "Sqrt", "ReduceProd", "ReduceMin", "ReduceMax",
})
_FOLD_MAX_ELEMENTS = 1 << 16


def get_attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def has_attr(node: onnx.NodeProto, name: str) -> bool:
    return any(a.name == name for a in node.attribute)


def type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"


def shape_text(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


class Facts:
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


def collect_types(graph: onnx.GraphProto, facts: Facts) -> None:
    for vi in (*graph.input, *graph.output, *graph.value_info):
        facts.add_value_info(vi)
    for init in graph.initializer:
        facts.types.setdefault(init.name, init.data_type)
        facts.shapes.setdefault(init.name, list(init.dims))
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                collect_types(g, facts)


def read_initializer(init: onnx.TensorProto) -> np.ndarray | None:
    if init.data_location == TensorProto.EXTERNAL and not init.raw_data:
        return None
    try:
        return numpy_helper.to_array(init)
    except Exception:  # unreadable (external data not loaded): constant, value unknown
        return None


def fold(nodes: list[FlatNode], facts: Facts) -> None:
    from onnx.reference import ReferenceEvaluator

    for n in nodes:
        p = n.proto
        if p.op_type == "Constant" and is_default(p.domain):
            facts.constant_outputs.add(p.output[0])
            value = None
            if has_attr(p, "value"):
                value = read_initializer(get_attr(p, "value"))
            elif any(has_attr(p, k) for k in ("value_int", "value_ints", "value_float", "value_floats")):
                for k in ("value_int", "value_ints", "value_float", "value_floats"):
                    if has_attr(p, k):
                        value = np.array(get_attr(p, k))
            facts.consts[p.output[0]] = value
            continue
        if not is_default(p.domain):
            continue
        if p.op_type in ("Shape", "Size") and p.input:
            dims = facts.static_shape(p.input[0])
            if dims is not None:
                if p.op_type == "Size":
                    facts.consts[p.output[0]] = np.array(int(np.prod(dims)), np.int64)
                else:
                    start, end = get_attr(p, "start", 0), get_attr(p, "end", None)
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
