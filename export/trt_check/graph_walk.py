"""The graph as TensorRT's parser sees it: model-local function calls expanded in place (the
parser imports each body op since TensorRT 9.0), nodes labelled with their call path."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from norcal.core.errors import NorcalError
from norcal.export.trt_check import support as ts

DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class FlatNode:
    proto: onnx.NodeProto  # names rewritten to the flattened graph's
    label: str
    opset: int  # default-domain opset the node is read with


def is_default(domain: str) -> bool:
    return domain in DEFAULT_DOMAINS


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index} {node.op_type}"


class Flattener:
    """Expands local-function calls in place, renaming body tensors, resolving attribute refs.

    Not onnx.inliner (onnx 1.23): inline_local_functions renames body nodes ``uniq__1``, losing the
    call path findings name ("dedup > uniq"), and silently leaves a call unexpanded when the
    function imports another default opset version than the model, even one the ONNX checker
    accepts (TensorRT expands it, reading the body at the function's opset, as this does). Its
    exclusion list could keep functions named like built-in ops, which TensorRT never expands;
    that alone would not have decided it.
    """

    def __init__(self, model: onnx.ModelProto, default_opset: int):
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.default_opset = default_opset
        self.top: list[FlatNode] = []  # what shape inference sees
        self.sub: list[FlatNode] = []  # nodes of If/Loop/Scan bodies, checked but not re-inferred
        self.counter = 0

    def run(self, graph: onnx.GraphProto) -> None:
        for i, node in enumerate(graph.node):
            self._emit(node, {}, None, "", node_label(node, i), self.default_opset, self.top, 0)

    def _emit(self, node, attrs, rename, prefix, label, opset, out, depth):
        node = self._resolve(node, attrs, rename, prefix)
        key = (node.domain, node.op_type)
        fn = self.functions.get(key)
        # A function named like a built-in op is never expanded by TensorRT (its importer wins,
        # whatever the domain); check_opsets reports it, and the node is checked as that op.
        if fn is not None and node.op_type not in ts.OPERATORS:
            if depth > 32:
                raise NorcalError(f"local function {fn.domain}.{fn.name}: nested more than 32 deep (recursive?)")
            self._expand(node, fn, label, out, depth)
            return
        out.append(FlatNode(node, label, opset))
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                for j, inner in enumerate(g.node):
                    self._emit(inner, {}, None, "", f"{label} > {a.name} > {node_label(inner, j)}",
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
        opset = next((o.version for o in fn.opset_import if is_default(o.domain)), self.default_opset)
        for i, inner in enumerate(fn.node):
            self._emit(inner, attrs, rename, prefix, f"{label} > {node_label(inner, i)}", opset, out, depth + 1)

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
