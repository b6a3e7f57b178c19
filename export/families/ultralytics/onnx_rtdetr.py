"""Ultralytics' own RT-DETR ONNX export (``RTDETR(...).export(format="onnx")``) -> our output
contract, the graph :class:`RtdetrDetector` exports from the same model.

Ultralytics' graph ends in its decoder's selection: the last decoder layer's class logits
[B, Q, C] go through one Sigmoid, are flattened and cut to the top K (query, class) scores
(``RTDETRDecoder.postprocess``), and the boxes [B, Q, 4] (cx, cy, w, h normalised, a Sigmoid's
output) are gathered for them: output [B, K, 6]. Older Ultralytics instead concatenated the
boxes and the Sigmoid's scores on the last axis: output [B, Q, 4 + C]. Either is recognised by
structure (the metadata's ``head``, RTDETRDecoder since 8.1, must agree when present). The
ingest keeps Ultralytics' network up to the boxes and logits, puts a Div by 255 in front (our
host feeds 0-255 RGB stretched to the square imgsz), names the logits ``cls_logits`` and
appends RtdetrDetector's own traced post-processing (one Sigmoid, ``decode``'s top K over
queries x classes with the score threshold, boxes x0,y0,x1,y1 in input pixels) and metadata.
Anything else is refused in one line naming what was found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import onnx

from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.export.families.ultralytics.onnx_common import (assemble, at_least_opset, class_names, cut_network,
                                                            graph_metadata, square_imgsz, static_input)
from norcal.export.graph.onnx_helpers import GraphIndex, inferred_types, tensor_sizes
from norcal.export.pytorch.onnx_trace import trace_onnx

HEAD = "RTDETRDecoder"  # the metadata's ``head`` of an Ultralytics RT-DETR export
LOGITS_NODE = "norcal_ingest/cls_logits"
# ops that carry a tensor through unchanged in value (Ultralytics stacks and squeezes the last layer)
_PASS = ("Squeeze", "Unsqueeze", "Identity", "Concat")


@dataclass(frozen=True)
class RtdetrHead:
    """The last decoder layer's tensors found in an Ultralytics RT-DETR graph, and its metadata."""

    names: list
    imgsz: int
    boxes: str  # [B, Q, 4] cx, cy, w, h normalised to the input
    logits: str  # [B, Q, C] class logits (the Sigmoid's input)
    sigmoid: str  # that Sigmoid's node name
    layout: str  # "topk": Ultralytics' selection in the graph; "concat": [B, Q, 4 + C] output
    queries: int | None  # Q when shape inference tells it


def _graph_maps(g: onnx.GraphProto) -> tuple[dict, dict]:
    index = GraphIndex.of(g)
    return index.consumers, index.producer


def _attr(node, name: str, default=None):
    a = next((x for x in node.attribute if x.name == name), None)
    return default if a is None else onnx.helper.get_attribute_value(a)


def _selections(g: onnx.GraphProto) -> list[tuple]:
    """(Sigmoid, layout, boxes tensor) for each Sigmoid that ends the graph as RT-DETR's head does."""
    consumers, producer = _graph_maps(g)
    outputs = {o.name for o in g.output}
    found = []
    for s in g.node:
        if s.op_type != "Sigmoid":
            continue
        readers = consumers.get(s.output[0], [])
        flat = [c for c in readers if c.op_type == "Flatten" and _attr(c, "axis", 1) == 1]
        topk = [t for f in flat for t in consumers.get(f.output[0], [])
                if t.op_type == "TopK" and t.input[0] == f.output[0] and _attr(t, "axis", -1) in (1, -1)
                and _attr(t, "largest", 1) == 1]
        if len(flat) == 1 and len(topk) == 1 and all(c.op_type in ("Flatten", "Shape") for c in readers):
            gathers = [n for n in g.node if n.op_type == "GatherElements" and _attr(n, "axis", 0) == 1
                       and _derives_from(n.input[1], topk[0].output[1], producer)]
            found.append((s, "topk", gathers[0].input[0] if len(gathers) == 1 else None))
            continue
        cats = [c for c in readers if c.op_type == "Concat" and _attr(c, "axis") in (-1, 2)
                and list(c.input) == [c.input[0], s.output[0]] and c.output[0] in outputs]
        if len(cats) == 1 and len(readers) == 1:
            found.append((s, "concat", cats[0].input[0]))
    return found


def _derives_from(tensor: str, source: str, producer: dict, limit: int = 4096) -> bool:
    """Whether ``tensor`` is computed from ``source`` (within ``limit`` nodes back)."""
    stack, seen = [tensor], set()
    while stack and len(seen) < limit:
        t = stack.pop()
        if t == source:
            return True
        n = producer.get(t)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(n.input)
    return False


def _source_op(tensor: str, producer: dict) -> str | None:
    """The op that computed ``tensor``'s values, looking through stack / squeeze ops."""
    n = producer.get(tensor)
    while n is not None and n.op_type in _PASS:
        if n.op_type == "Concat" and len(n.input) != 1:
            return "Concat"
        n = producer.get(n.input[0])
    return None if n is None else n.op_type


def is_rtdetr(model: onnx.ModelProto) -> bool:
    """Whether an Ultralytics graph is (or says it is) an RT-DETR: metadata head RTDETRDecoder,
    or the deformable decoder's GridSample with a Sigmoid ending the graph as RT-DETR's does."""
    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get("head") == HEAD:
        return True
    g = model.graph
    return any(n.op_type == "GridSample" for n in g.node) and bool(_selections(g))


def find_rtdetr_head(model: onnx.ModelProto, where: str = "model") -> RtdetrHead:
    """The last decoder layer's boxes and class logits in an Ultralytics RT-DETR graph, checked
    against its metadata; a one-line NorcalError naming what was found otherwise."""
    meta = graph_metadata(model)
    head = meta.get("head")
    if head is not None and head != HEAD:
        raise NorcalError(f"{where}: an Ultralytics graph shaped like RT-DETR's but its metadata says head "
                          f"{head!r}, not {HEAD}; structure not recognised, refused")
    if meta.get("task") != "detect":
        raise NorcalError(f"{where}: an Ultralytics RT-DETR whose metadata says task "
                          f"{meta.get('task') or 'unknown'!r}; only detect can be ingested")
    names, imgsz = class_names(meta, where), square_imgsz(meta, where)
    if imgsz % 32:
        raise NorcalError(f"{where}: an Ultralytics RT-DETR exported at imgsz {imgsz}, not a multiple of 32 "
                          "(its stride)")
    g = model.graph
    found = _selections(g)
    if len(found) != 1:
        raise NorcalError(f"{where}: an Ultralytics RT-DETR graph with {len(found)} Sigmoids ending the graph as "
                          "RT-DETR's class scores do (expected 1: into Flatten and TopK, or concatenated after "
                          "the boxes); structure not recognised, refused")
    sig, layout, boxes = found[0]
    if boxes is None:
        raise NorcalError(f"{where}: the RT-DETR top K {sig.name!r} selects no one box tensor (expected one "
                          "GatherElements on axis 1 indexed by the top K); structure not recognised, refused")
    _, producer = _graph_maps(g)
    src = _source_op(boxes, producer)
    if src != "Sigmoid":
        raise NorcalError(f"{where}: the RT-DETR boxes {boxes!r} come from {src or 'no op'}, not a Sigmoid: "
                          "cannot tell they are cx, cy, w, h normalised to the input, refused")
    types = inferred_types(static_input(model, imgsz, where, batch=1))
    logits = sig.input[0]
    dl, db = tensor_sizes(types.get(logits)), tensor_sizes(types.get(boxes))
    for what, d, width in (("class logits", dl, len(names)), ("boxes", db, 4)):
        if d is None or len(d) != 3 or d[2] is None:
            raise NorcalError(f"{where}: the RT-DETR {what} {logits if what == 'class logits' else boxes!r} have "
                              f"shape {d}, expected [batch, queries, {width}]")
        if d[2] != width:
            raise NorcalError(f"{where}: the RT-DETR class logits {logits!r} have {d[2]} classes, expected "
                              f"{width} (len(names) = {width})" if what == "class logits" else
                              f"{where}: the RT-DETR boxes {boxes!r} have {d[2]} values per query, expected 4")
    for name in (logits, boxes):
        elem = types[name].tensor_type.elem_type
        if elem != onnx.TensorProto.FLOAT:
            raise NorcalError(f"{where}: the RT-DETR tensor {name!r} is {onnx.TensorProto.DataType.Name(elem)}, not "
                              "FLOAT (a half-precision export?); export it in float32")
    if dl[1] is not None and db[1] is not None and dl[1] != db[1]:
        raise NorcalError(f"{where}: the RT-DETR boxes cover {db[1]} queries, its class logits {dl[1]}")
    return RtdetrHead(names=names, imgsz=imgsz, boxes=boxes, logits=logits, sigmoid=sig.name, layout=layout,
                      queries=dl[1] if dl[1] is not None else db[1])


class _OnnxNetwork:
    """Stands in for the RT-DETR network, which is Ultralytics' ONNX here: what RtdetrDetector
    reads of a model (its head's class and query counts)."""

    def __init__(self, num_classes: int, num_queries: int):
        head = type("RTDETRDecoder", (), {})()
        head.nc, head.num_queries = int(num_classes), int(num_queries)
        self.model = [head]

    def eval(self):
        return self


def _probe_queries(body: onnx.GraphProto, model: onnx.ModelProto, head: RtdetrHead, opset: int,
                   where: str) -> int:
    """Q of a graph whose shapes do not tell it (a dynamic export): one run of the cut network
    at batch 1 in ONNX Runtime, its boxes and logits checked against each other."""
    import numpy as np
    import onnxruntime as ort

    g = onnx.GraphProto()
    g.CopyFrom(body)
    image = next(i for i in model.graph.input if i.name not in {x.name for x in model.graph.initializer})
    g.input.append(image)
    for name in (head.boxes, head.logits):
        g.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    probe = onnx.helper.make_model(g, opset_imports=model.opset_import)
    probe.ir_version = model.ir_version
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        boxes, logits = sess.run(None, {image.name: np.zeros((1, 3, head.imgsz, head.imgsz), np.float32)})
    except Exception as e:  # ONNX Runtime raises its own kinds
        raise NorcalError(f"{where}: the RT-DETR network could not be run once to read its query count "
                          f"({type(e).__name__}); refused") from None
    if boxes.shape[:2] != logits.shape[:2] or boxes.shape[2:] != (4,) or logits.shape[2:] != (len(head.names),):
        raise NorcalError(f"{where}: the RT-DETR network gives boxes {list(boxes.shape)} and class logits "
                          f"{list(logits.shape)}, expected [1, Q, 4] and [1, Q, {len(head.names)}]")
    return int(logits.shape[1])


def _post_graph(detector, opset: int) -> onnx.ModelProto:
    """RtdetrDetector's post-processing (its graph module after the network) traced to ONNX:
    inputs ``ul_boxes``, ``cls_logits``, ``image_sizes`` -> the contract's four outputs."""
    import torch

    module = detector.graph_module()

    class Post(torch.nn.Module):  # the network is Ultralytics' graph: only what follows its head
        def __init__(self):
            super().__init__()
            self.graph = module

        def forward(self, boxes, logits, image_sizes):
            return tuple(self.graph.detections(boxes, logits, image_sizes).values())

    gen = torch.Generator().manual_seed(0)
    q, c = detector.num_queries, detector.num_classes
    args = (torch.rand((1, q, 4), generator=gen), torch.randn((1, q, c), generator=gen),
            torch.tensor([[detector.height, detector.width]], dtype=torch.int64))
    inputs = ["ul_boxes", contract.CLS_LOGITS_TENSOR, "image_sizes"]
    outputs = list(contract.OUTPUT_NAMES[:4])
    return trace_onnx(Post().eval(), args, inputs, outputs, opset, {n: {0: "batch"} for n in (*inputs, *outputs)})


def _integer_clips(body: onnx.GraphProto, model: onnx.ModelProto, imgsz: int, where: str) -> int:
    """Ultralytics' dynamic export clamps shape values (int64) with Clip, which TensorRT takes on
    floats only: each such Clip becomes the Max then Min it computes (exact on integers, also
    when min > max: ONNX's Clip then gives max, as Min(Max(x, min), max) does). Returns how many."""
    if not any(n.op_type == "Clip" for n in body.node):
        return 0
    types = inferred_types(static_input(model, imgsz, where, batch=1))
    integer = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    nodes, count = [], 0
    for n in body.node:
        tp = types.get(n.input[0]) if n.op_type == "Clip" else None
        if tp is None or tp.tensor_type.elem_type not in integer:
            keep = onnx.NodeProto()
            keep.CopyFrom(n)  # the repeated field is cleared below
            nodes.append(keep)
            continue
        count += 1
        x, bounds = n.input[0], [(op, b) for op, b in zip(("Max", "Min"), list(n.input[1:3])) if b]
        for k, (op, bound) in enumerate(bounds):
            out = n.output[0] if k == len(bounds) - 1 else f"{n.output[0]}/{op}"
            nodes.append(onnx.helper.make_node(op, [x, bound], [out], name=f"norcal_ingest/{n.name}/{op}"))
            x = out
        if not bounds:
            nodes.append(onnx.helper.make_node("Identity", [x], [n.output[0]], name=f"norcal_ingest/{n.name}"))
    del body.node[:]
    body.node.extend(nodes)
    return count


def ingest_rtdetr(model: onnx.ModelProto, where: str = "model", *, score_thresh: float | None = None,
                  detections_per_image: int | None = None, decoding=None) -> tuple[onnx.ModelProto, RtdetrHead]:
    """Ultralytics' RT-DETR ONNX -> the plain graph RtdetrDetector exports (no NorCal node yet):
    ``images`` RGB 0-255 stretched to imgsz, ``image_sizes`` -> num_detections, boxes, scores,
    classes, ``cls_logits`` recorded as the classifier, RtdetrDetector's metadata. Thresholds
    default to RtdetrDetector's; ``decoding`` (norcal.core.decoding.Decoding) as RtdetrDetector
    takes it (best-class: each query's best class). Returns the graph and what was found."""
    from norcal.export.families.ultralytics.rtdetr import DEFAULT_SCORE_THRESH, RtdetrDetector

    head = find_rtdetr_head(model, where)
    model, opset = at_least_opset(model, where)
    static = static_input(model, head.imgsz, where)
    body = cut_network(static, [head.boxes, head.logits])
    _integer_clips(body, static, head.imgsz, where)
    queries = head.queries or _probe_queries(body, static, head, opset, where)
    detector = RtdetrDetector(_OnnxNetwork(len(head.names), queries), head.names, head.imgsz,
                              topk=int(detections_per_image or 300),
                              score_thresh=DEFAULT_SCORE_THRESH if score_thresh is None else float(score_thresh),
                              decoding=decoding)
    body.node.append(onnx.helper.make_node("Identity", [head.logits], [contract.CLS_LOGITS_TENSOR],
                                           name=LOGITS_NODE))
    post = _post_graph(detector, opset)
    merged = assemble(static, body, post, {"ul_boxes": head.boxes}, detector.topk, opset)
    meta = detector.metadata()
    settings = json.loads(meta[contract.DETECTOR])
    settings.update(names=head.names, source="ultralytics-onnx")
    meta[contract.DETECTOR] = json.dumps(settings, sort_keys=True)
    onnx.helper.set_model_props(merged, meta)
    return merged, replace(head, queries=queries)


def summary(head: RtdetrHead) -> str:
    """One line saying what the ingest did."""
    return (f"Ultralytics RT-DETR ONNX ({len(head.names)} classes, {head.queries} queries, imgsz {head.imgsz}) "
            f"converted to our outputs; NorCal on {contract.CLS_LOGITS_TENSOR} (its last decoder layer's class "
            f"logits, {head.logits!r})")
