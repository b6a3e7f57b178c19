"""Which nodes of a detector stay in fp32 when the rest goes to int8 or fp16.

The NorCal node subtracts ``gamma * log N_c`` from logits whose rare-class entries differ by
small amounts; box decoding works in pixels up to the image size; NMS and TopK compare scores.
So everything from the box classifier's logits on (the NorCal node, the softmax, box decoding,
NMS, TopK, the mask branch that the kept boxes select) stays fp32, and so does the box
predictor itself (the layers that write the classifier logits and, beside them, the box
deltas). The layers are found by walking back from the logits through ops that only move,
stack or pick values and through a fully connected layer's bias Add (a transformer decoder's
logits are its last layer's class head, MatMul + Add, gathered from every layer's). What is
left for lower precision is the backbone, the FPN, the RPN head and the box head (a
transformer's encoder and decoder layers): the convolutions and fully connected layers that do
nearly all the arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import onnx

from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.export.graph.onnx_helpers import GraphIndex

COMPUTE_OPS = ("Conv", "Gemm", "MatMul")  # the ops int8 quantizes
# ops that only move or reshape values: walking back from the logits through them reaches the
# layer that computed them
LAYOUT_OPS = frozenset({"Reshape", "Flatten", "Transpose", "Concat", "Identity", "Squeeze", "Unsqueeze"})
# ops that pick entries of their first input: a transformer decoder's logits are the last
# layer's, gathered from the stack of every layer's
SELECT_OPS = frozenset({"Gather", "Slice"})


def classifier_logits(model: onnx.ModelProto, where: str = "model") -> list[str]:
    """The box classifiers' logits tensors the export recorded (the NorCal node's input for a
    calibrated graph); a NorcalError when the model carries neither key."""
    meta = {p.key: p.value for p in model.metadata_props}
    names = contract.classifier_tensors(meta)
    if not names:
        raise NorcalError(f"{where}: no {contract.CLASSIFIER_LOGITS} metadata: the model was not exported by "
                          f"norcal export (or lost its metadata), so its classifier cannot be found to keep "
                          f"NorCal, box decoding and NMS in fp32", param="model")
    produced = {o for n in model.graph.node for o in n.output}
    missing = [t for t in names if t not in produced]
    if missing:
        raise NorcalError(f"{where}: {contract.CLASSIFIER_LOGITS} names {', '.join(missing)}, which no node "
                          f"of the graph writes", param="model")
    return names


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node of the main graph a unique name (the quantizers select by name)."""
    taken = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in taken:
                name += "_"
            n.name = name
            taken.add(name)


def fp32_nodes(model: onnx.ModelProto, where: str = "model") -> set[str]:
    """Names of the nodes that stay fp32: the box predictor, everything downstream of the
    classifier logits, and the layers that feed the masks output only (:func:`mask_only_layers`:
    an R-CNN's mask head runs after NMS and is downstream anyway, a YOLO's prototype and mask
    coefficient convolutions run before it). Nodes must be named (:func:`name_nodes`)."""
    logits = classifier_logits(model, where)
    index = GraphIndex.of(model.graph)
    consumers, producer = defaultdict(list, index.consumers), index.producer
    constants = {t.name for t in model.graph.initializer}
    keep: set[str] = set()

    # downstream of the logits: the NorCal node(s), activation, decoding, NMS, TopK, masks
    todo = list(logits)
    seen_tensors: set[str] = set()
    while todo:
        t = todo.pop()
        if t in seen_tensors:
            continue
        seen_tensors.add(t)
        for n in consumers.get(t, ()):
            if n.name not in keep:
                keep.add(n.name)
                todo.extend(o for o in n.output if o)

    # upstream, through layout ops, to the layers that compute the logits; their siblings
    # (the box regression layer reading the same features) feed box decoding and stay too
    predictors: list[onnx.NodeProto] = []
    todo, seen_tensors = list(logits), set()
    while todo:
        t = todo.pop()
        n = producer.get(t)
        if n is None or t in seen_tensors:
            continue
        seen_tensors.add(t)
        if n.op_type in COMPUTE_OPS:
            predictors.append(n)
        elif n.op_type in LAYOUT_OPS or n.op_type in SELECT_OPS:
            keep.add(n.name)
            todo.extend(i for i in n.input[:1 if n.op_type != "Concat" else None] if i)
        elif n.op_type == "Add" and _bias_add_input(n, producer, constants) is not None:
            # a fully connected layer exported as MatMul + Add(bias): the bias Add is the layer's
            keep.add(n.name)
            todo.append(_bias_add_input(n, producer, constants))
    for p in predictors:
        keep.add(p.name)
        keep.update(s.name for s in consumers.get(p.input[0], ()) if s.op_type in COMPUTE_OPS)
    return keep | mask_only_layers(model)


def weightless_products(model: onnx.ModelProto) -> set[str]:
    """Names of the MatMuls that are no layer with weights: two computed values (a transformer's
    attention: q by k, the weights by v, q by relative positions gathered at run time) or two
    constants (a relative-position table resampled to the input's grid, which TensorRT folds).
    int8 would round a value that no weight scale covers, or a constant once more: they stay fp32."""
    producer = GraphIndex.of(model.graph).producer
    constants = {t.name for t in model.graph.initializer}
    return {n.name for n in model.graph.node if n.op_type == "MatMul"
            and sum(_is_constant(t, producer, constants) for t in n.input) != 1}


def _is_constant(t: str, producer: dict[str, onnx.NodeProto], constants: set[str]) -> bool:
    """Whether ``t`` is an initializer, a Constant's output or an Identity copy of either."""
    while t not in constants:
        n = producer.get(t)
        if n is None or n.op_type not in ("Constant", "Identity"):
            return False
        if n.op_type == "Constant":
            return True
        t = n.input[0]
    return True


def _bias_add_input(n: onnx.NodeProto, producer: dict[str, onnx.NodeProto], constants: set[str]) -> str | None:
    """The computed input of an Add whose other input is a constant (a bias), else None."""
    computed = [t for t in n.input if not _is_constant(t, producer, constants)]
    return computed[0] if len(computed) == 1 and len(n.input) == 2 else None


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every value name the node's subgraphs (If / Loop / Scan bodies) read: outer-scope values
    among them are inputs of the node too."""
    names: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                names.update(i for i in n.input if i)
                names.update(_subgraph_reads(n))
    return names


def mask_only_layers(model: onnx.ModelProto, mask_outputs: Sequence[str] = ("masks", contract.MASK_PROTOS)) -> set[str]:
    """Names of the layers (:data:`COMPUTE_OPS` with a constant weight) whose results reach the
    graph's mask outputs ``mask_outputs`` (the masks, a YOLO's prototypes) and no other output:
    the mask head's convolutions. Quantizing them changes the masks only, never the boxes,
    scores or classes. Products of two activations (a post-processing's sampling matrices times
    a map) are no layers. Empty for a model without those outputs."""
    outputs = {o.name for o in model.graph.output}
    masks = frozenset(mask_outputs) & outputs
    if not masks:
        return set()
    producer = GraphIndex.of(model.graph).producer
    constants = {t.name for t in model.graph.initializer}
    # which graph outputs each tensor reaches, walking the (topologically sorted) nodes backwards
    reach: dict[str, frozenset[str]] = {t: frozenset({t}) for t in outputs}
    layers = set()
    for n in reversed(model.graph.node):
        got = frozenset().union(*(reach.get(o, frozenset()) for o in n.output if o))
        for t in [*n.input, *_subgraph_reads(n)]:
            if t:
                reach[t] = reach.get(t, frozenset()) | got
        if (n.op_type in COMPUTE_OPS and got and got <= masks
                and any(_is_constant(t, producer, constants) for t in n.input[:2])):
            layers.add(n.name)
    return layers
