"""Facts about an ONNX graph that every graph tool reads: its default opset, its tensors' inferred
types and their dims. One definition each (the surgery, the ingest of other tools' graphs and
the quantizer read the same)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import onnx

from norcal.core.errors import NorcalError

# Shape inference is the slow part of a surgery on a large detector; tuning and demos calibrate
# the same graph for many gammas, so its result is kept per graph structure (weights aside).
_CACHE: dict[bytes, dict[str, onnx.TypeProto]] = {}
_CACHE_SIZE = 4
_SMALL_INIT = 4096  # bytes: initializers shape inference may read as values (shapes, axes)


def default_opset(model: onnx.ModelProto, required: bool = True) -> int:
    """The version of the default ONNX domain the model imports; none: refused, or 0 when not
    ``required``."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    if required:
        raise NorcalError("the model imports no default ONNX opset")
    return 0


def _structure_key(model: onnx.ModelProto) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    g = model.graph
    for part in (*model.opset_import, *model.functions, *g.node, *g.input, *g.output, *g.value_info):
        h.update(part.SerializeToString())
    for init in g.initializer:
        h.update(f"{init.name}|{init.data_type}|{list(init.dims)}".encode())
        if init.ByteSize() <= _SMALL_INIT:
            h.update(init.SerializeToString())
    return h.digest()


def inferred_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor's type by name, as ONNX shape inference finds it (with data propagation, which
    carries sizes through the Shape / Concat / Reshape chains dynamic exports build); where
    inference fails, the types the graph declares. Kept for the last few graph structures."""
    key = _structure_key(model)
    if key not in _CACHE:
        inferred = model
        for options in ({"data_prop": True}, {}):
            try:
                inferred = onnx.shape_inference.infer_shapes(model, **options)
                break
            except Exception:  # shape inference is a help here, never a requirement
                continue
        g = inferred.graph
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = {v.name: v.type for v in [*g.value_info, *g.input, *g.output]}
    return _CACHE[key]


def tensor_dims(tp: onnx.TypeProto | None) -> list[int | str | None] | None:
    """The dims of a tensor type (size, symbolic name, or None), None when the rank is unknown."""
    if tp is None or not tp.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tp.tensor_type.shape.dim]


def tensor_sizes(tp: onnx.TypeProto | None) -> list[int | None] | None:
    """The dims of a tensor type as sizes (None where a dim is symbolic or unknown), None when the
    rank is unknown."""
    found = tensor_dims(tp)
    return None if found is None else [d if isinstance(d, int) else None for d in found]


@dataclass(frozen=True)
class GraphIndex:
    """Who computes and who reads each tensor of one graph's nodes (not its subgraphs'), built
    in one pass: ``producer[t]`` the node writing ``t``, ``position[t]`` that node's index,
    ``consumers[t]`` the nodes reading ``t`` in graph order (each once per input it is)."""

    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> "GraphIndex":
        index = cls()
        for i, node in enumerate(graph.node):
            for t in node.input:
                index.consumers.setdefault(t, []).append(node)
            for t in node.output:
                index.producer[t], index.position[t] = node, i
        return index

    def readers(self, tensor: str) -> list[onnx.NodeProto]:
        return self.consumers.get(tensor, [])
