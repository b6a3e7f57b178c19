"""Graph surgery: find a detector's box classifier, put the NorCal node there, or take it out.

Pure functions ``ModelProto -> ModelProto`` (the input is never modified). The NorCal node
replaces the classifier's activation (Softmax over the last axis, or Sigmoid) and writes the
activation's output tensor, so everything downstream (score threshold, NMS, top-k) reads
calibrated scores. Running insertion on a model that already has NorCal replaces it.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from norcal.export.norcal_node import (DOMAIN, INLINE_PREFIX, META_PREFIX, OP_TYPE, PRIOR_NAME,
                                NorCalSettings, calibration_keys, make_function, make_nodes,
                                make_prior)
from norcal.core.version import __version__
from norcal.core.errors import NorcalError

# ops a classifier's logits may pass through between the Gemm/MatMul and the activation
_PASS_THROUGH = {"Identity", "Cast", "Reshape", "Flatten", "Add", "Squeeze", "Unsqueeze"}
_CLASSIFIER_OPS = {"Gemm", "MatMul"}


@dataclass
class Candidate:
    """A classifier activation the NorCal node can replace."""

    node: str          # the activation node's name
    op_type: str       # Softmax or Sigmoid
    logits: str        # tensor the activation reads
    output: str        # tensor the activation writes
    width: int | None  # size of the class axis (C+1 with background), when known
    producer: str      # op type of the classifier layer feeding it

    def describe(self) -> str:
        w = "?" if self.width is None else str(self.width)
        return f"{self.op_type} node {self.node!r} on {self.logits!r} ({w} classes, from {self.producer})"


def _opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    raise NorcalError("the model imports no default ONNX opset")


def _shapes(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference is a help here, never a requirement
        inferred = model
    g = inferred.graph
    return {v.name: v.type for v in [*g.value_info, *g.input, *g.output]}


def _last_dim(tp: onnx.TypeProto | None) -> tuple[int | None, int | None]:
    """(rank, last dimension) of a tensor type, None where unknown."""
    if tp is None or not tp.tensor_type.HasField("shape"):
        return None, None
    dims = tp.tensor_type.shape.dim
    if not dims:
        return 0, None
    last = dims[-1]
    return len(dims), (last.dim_value if last.HasField("dim_value") else None)


def _weight_width(model: onnx.ModelProto, node: onnx.NodeProto) -> int | None:
    """Output width of a Gemm/MatMul from its weight initializer."""
    inits = {i.name: i for i in model.graph.initializer}
    if len(node.input) < 2 or node.input[1] not in inits:
        return None
    dims = list(inits[node.input[1]].dims)
    if len(dims) != 2:
        return None
    trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
    return dims[0] if (node.op_type == "Gemm" and trans_b) else dims[1]


def _classifier_producer(model, producers, tensor, depth=4):
    inits = {i.name for i in model.graph.initializer}
    for _ in range(depth):
        node = producers.get(tensor)
        if node is None:
            return None
        if node.op_type in _CLASSIFIER_OPS:
            return node
        if node.op_type not in _PASS_THROUGH:
            return None
        data_inputs = [i for i in node.input if i and i not in inits]
        if not data_inputs:
            return None
        tensor = data_inputs[0]
    return None


def find_classifiers(model: onnx.ModelProto) -> list[Candidate]:
    """Softmax-over-last-axis and Sigmoid nodes fed by a Gemm/MatMul: the box classifiers."""
    producers = {o: n for n in model.graph.node for o in n.output}
    shapes = _shapes(model)
    opset = _opset(model)
    found = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Softmax", "Sigmoid"):
            continue
        rank, width = _last_dim(shapes.get(node.input[0]))
        if node.op_type == "Softmax":
            axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
            if not (axis == -1 or (rank is not None and axis == rank - 1)):
                continue
        producer = _classifier_producer(model, producers, node.input[0])
        if producer is None:
            continue
        width = width or _weight_width(model, producer)
        found.append(Candidate(node.name, node.op_type, node.input[0], node.output[0], width,
                               producer.op_type))
    return found


def _expected_width(num_classes: int, background: str) -> int:
    return num_classes + (0 if background == "none" else 1)


def _choose(model: onnx.ModelProto, settings: NorCalSettings, logits: str | None) -> Candidate:
    found = find_classifiers(model)
    if logits is not None:
        acts = [n for n in model.graph.node
                if logits in n.input[:1] and n.op_type in ("Softmax", "Sigmoid")]
        if not acts:
            raise NorcalError(f"tensor {logits!r} feeds no Softmax or Sigmoid node")
        if len(acts) > 1:
            raise NorcalError(f"tensor {logits!r} feeds {len(acts)} activations; cannot choose")
        match = [c for c in found if c.node == acts[0].name and c.logits == logits]
        if match:
            return match[0]
        _, width = _last_dim(_shapes(model).get(logits))
        n = acts[0]
        return Candidate(n.name, n.op_type, logits, n.output[0], width, "?")
    if not found:
        raise NorcalError("found no box classifier (a Softmax over the last axis or a Sigmoid fed by "
                          "a Gemm/MatMul); name the logits tensor with --logits")
    want = _expected_width(settings.num_classes, settings.background) if settings.num_classes else None
    fitting = [c for c in found if want is None or c.width in (want, None)]
    if len(fitting) == 1:
        return fitting[0]
    listing = "; ".join(c.describe() for c in (fitting or found))
    if not fitting:
        raise NorcalError(f"the table has {settings.num_classes} classes, so the classifier should have "
                          f"{want} outputs, but the candidates are: {listing}")
    raise NorcalError(f"ambiguous: {len(fitting)} classifier candidates: {listing}; "
                      "choose one with --logits TENSOR")


def _elem_type(model: onnx.ModelProto, tensor: str) -> int:
    tp = _shapes(model).get(tensor)
    if tp is not None and tp.tensor_type.elem_type:
        return tp.tensor_type.elem_type
    return onnx.TensorProto.FLOAT


def norcal_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The ``norcal.*`` metadata_props of a model: what the NorCal node baked in, and the
    runtime contract (resize sizes, category ids) of models exported from checkpoints."""
    return {p.key: p.value for p in model.metadata_props if p.key.startswith(META_PREFIX)}


def has_norcal(model: onnx.ModelProto) -> bool:
    return any(_is_norcal_node(n) for n in model.graph.node)


def _is_norcal_node(n: onnx.NodeProto) -> bool:
    return (n.domain == DOMAIN and n.op_type == OP_TYPE) or n.name.startswith(INLINE_PREFIX)


def strip_norcal(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the NorCal node (or its inlined ops), restoring the plain activation."""
    meta = norcal_metadata(model)
    if not has_norcal(model):
        raise NorcalError("the model has no NorCal node to strip")
    logits, output = meta.get("norcal.logits"), meta.get("norcal.output")
    if not logits or not output:
        raise NorcalError("the model's NorCal node has no norcal.logits/norcal.output metadata")
    out = copy.deepcopy(model)
    nodes = list(out.graph.node)
    first = next(i for i, n in enumerate(nodes) if _is_norcal_node(n))
    kept = [n for n in nodes if not _is_norcal_node(n)]
    if meta.get("norcal.activation") == "sigmoid":
        act = helper.make_node("Sigmoid", [logits], [output], name=meta.get("norcal.node", "Sigmoid"))
    else:
        act = helper.make_node("Softmax", [logits], [output], name=meta.get("norcal.node", "Softmax"),
                               axis=-1)
    kept.insert(first, act)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    inits = [i for i in out.graph.initializer if i.name != PRIOR_NAME]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    funcs = [f for f in out.functions if not (f.domain == DOMAIN and f.name == OP_TYPE)]
    del out.functions[:]
    out.functions.extend(funcs)
    ops = [o for o in out.opset_import if o.domain != DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend(ops)
    owned = calibration_keys()
    props = [p for p in out.metadata_props if p.key not in owned]
    del out.metadata_props[:]
    out.metadata_props.extend(props)
    return out


def insert_norcal(model: onnx.ModelProto, log_prior: np.ndarray, settings: NorCalSettings,
                  logits: str | None = None, inline: bool = False) -> onnx.ModelProto:
    """Put a NorCal node on the box classifier (replacing one already there).

    log_prior: [K] from :func:`norcal.core.calibration.log_prior`, K = the classifier's width.
    logits: the classifier's logits tensor; found automatically when None.
    """
    base = model
    if has_norcal(model):
        meta = norcal_metadata(model)
        logits = logits or meta.get("norcal.logits")
        base = strip_norcal(model)
    cand = _choose(base, settings, logits)
    lp = np.asarray(log_prior, dtype=np.float64).reshape(-1)
    if cand.width is not None and cand.width != lp.size:
        raise NorcalError(f"the classifier {cand.node!r} has {cand.width} outputs but the calibration "
                          f"has {lp.size} entries ({settings.num_classes} classes + background "
                          f"{settings.background!r})")
    settings = dataclasses.replace(settings, activation=cand.op_type.lower())
    settings.validate()
    out = copy.deepcopy(base)
    nodes = list(out.graph.node)
    idx = next(i for i, n in enumerate(nodes) if n.name == cand.node and n.output[0] == cand.output)
    opset = _opset(out)
    nodes[idx:idx + 1] = make_nodes(settings, cand.logits, cand.output, inline)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.append(make_prior(lp, _elem_type(base, cand.logits)))
    if not inline:
        out.functions.append(make_function(settings, opset))
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    meta = settings.metadata()
    meta.update({"norcal.logits": cand.logits, "norcal.output": cand.output,
                 "norcal.node": cand.node, "norcal.inline": str(inline).lower(),
                 "norcal.background_index": str({"last": lp.size - 1, "first": 0}.get(settings.background, -1)),
                 "norcal.tool_version": __version__})
    onnx.helper.set_model_props(out, {**{p.key: p.value for p in out.metadata_props}, **meta})
    return out

