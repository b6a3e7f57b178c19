"""Ultralytics' own ONNX export (``YOLO(...).export(format="onnx")``, with or without its
``nms=True``) -> our output contract, ready for the NorCal surgery.

An Ultralytics graph is recognised by its metadata (author "Ultralytics", task, names, imgsz)
and then by structure: the head's one Sigmoid whose output is concatenated along axis 1 with the
decoded boxes (xywh in input pixels, [B, 4, A]) and, for segment models, the mask coefficients
([B, nm, A]); the prototypes [B, nm, h, w] are a graph output of their own. The ingest keeps
Ultralytics' network up to those tensors (its NMS, if exported, is dropped), puts a Div by 255
in front (our host feeds 0-255 RGB, letterboxed as the metadata says) and appends our
post-processing, traced from :class:`YoloGraph`'s own ``detections`` (the .pt export's code):
class logits transposed to ``cls_logits`` [B, A, C] (the tensor the NorCal node then reads), one
Sigmoid, the .pt export's NMS to K for the decoding asked (class-wise multi-label by default;
best-class: :class:`~norcal.export.families.ultralytics.yolo_graph.BestClassNms`, Ultralytics'
predictor NMS), letterbox offset removal, box-relative masks. Anything else is refused in one
line naming what was found: a silently wrong graph is the worst outcome.

An end-to-end export (YOLO26 with ``nms=False``: metadata ``end2end`` True) has the same head
structure, its one Sigmoid over the one-to-one branch's logits concatenated with that branch's
boxes (always corners) and coefficients; Ultralytics' top-k after it is dropped and
:class:`~norcal.export.families.ultralytics.yolo_graph.OneToOneTopk` (the .pt export's selection for
such a head) appended instead of the NMS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

from norcal.core import contract
from norcal.core.decoding import Decoding
from norcal.core.errors import NorcalError
from norcal.export.families.base import sigmoid_classifier
from norcal.export.families.ultralytics.onnx_common import (assemble, at_least_opset, class_names, cut_network,
                                                            graph_metadata, metadata_literal, square_imgsz,
                                                            static_input)
from norcal.export.families.ultralytics.yolo import DETECTIONS, NMS_THRESH, SCORE_THRESH
from norcal.export.graph.onnx_helpers import GraphIndex, inferred_types, tensor_sizes
from norcal.export.pytorch.onnx_trace import trace_onnx

if TYPE_CHECKING:
    from norcal.export.families.ultralytics.onnx_rtdetr import RtdetrHead

TASKS = ("detect", "segment")


@dataclass(frozen=True)
class HeadTensors:
    """The pre-NMS tensors found in an Ultralytics graph, and what the metadata says."""

    task: str
    names: list
    imgsz: int
    nms: bool  # Ultralytics' own NMS was in the graph (dropped by the ingest)
    end2end: bool  # the one-to-one branch and Ultralytics' top-k (dropped): our graph selects by top-k
    boxes: str  # [B, 4, A] in input pixels: x, y, w, h, or x0, y0, x1, y1 when ``xyxy``
    xyxy: bool  # Ultralytics decodes to corners when it exports its NMS (Detect.xyxy)
    logits: str  # [B, C, A] class logits (the head Sigmoid's input)
    sigmoid: str  # the head Sigmoid's node name
    coefs: str | None  # [B, nm, A] mask coefficients (segment)
    protos: str | None  # [B, nm, h, w] prototypes (segment)
    anchors: int
    num_masks: int
    proto_hw: tuple


def find_head(model: onnx.ModelProto, where: str = "model") -> HeadTensors:
    """The pre-NMS tensors of an Ultralytics detect / segment graph, checked against its
    metadata; a one-line NorcalError naming what was found when the structure is not the one
    Ultralytics' Detect / Segment head exports."""
    meta = graph_metadata(model)
    task = meta.get("task")
    if task not in TASKS:
        raise NorcalError(f"{where}: an Ultralytics {task or 'unknown-task'} model; only "
                          f"{' and '.join(TASKS)} models can be ingested")
    e2e = str(meta.get("end2end", "False"))
    if e2e not in ("True", "False"):
        raise NorcalError(f"{where}: Ultralytics metadata 'end2end' is {e2e[:40]!r}, not True or False")
    end2end = e2e == "True"
    names, imgsz = class_names(meta, where), square_imgsz(meta, where)
    args = metadata_literal(meta, "args", where) if "args" in meta else {}
    nms = bool(args.get("nms")) if isinstance(args, dict) else False
    index = GraphIndex.of(model.graph)
    sig, boxes, coefs = _head_concat(model.graph, index, task, where)
    xyxy = _box_format(boxes, index.producer, where)
    if end2end and not xyxy:
        raise NorcalError(f"{where}: an end-to-end Ultralytics head whose boxes are decoded to centre and size "
                          "(Ultralytics decodes an end-to-end head to corners); structure not recognised, refused")
    if not end2end and "nms" in (args if isinstance(args, dict) else {}) and xyxy != nms:
        raise NorcalError(f"{where}: the Ultralytics head decodes boxes to {'corners' if xyxy else 'centre and size'} "
                          f"but its metadata says nms={nms} (Ultralytics decodes to corners exactly when it "
                          "exports its NMS or an end-to-end head); structure not recognised, refused")
    types = inferred_types(static_input(model, imgsz, where, batch=1))
    anchors = _anchors(types, boxes, sig.input[0], len(names), where)
    protos, nm, hw = _prototypes(model.graph, index, types, coefs, anchors, where) if coefs else (None, 0, ())
    return HeadTensors(task=task, names=names, imgsz=imgsz, nms=nms, end2end=end2end, boxes=boxes, xyxy=xyxy,
                       logits=sig.input[0], sigmoid=sig.name, coefs=coefs, protos=protos, anchors=anchors,
                       num_masks=nm, proto_hw=hw)


def _axis(node) -> int | None:
    a = next((x for x in node.attribute if x.name == "axis"), None)
    return None if a is None else a.i


def _head_concat(g: onnx.GraphProto, index: GraphIndex, task: str, where: str):
    """(the class scores' Sigmoid, the boxes tensor, the mask coefficients or None) of the one
    Concat that joins the head's outputs."""
    heads = [(s, c) for s in g.node if s.op_type == "Sigmoid"
             for c in index.readers(s.output[0]) if c.op_type == "Concat"]
    if len(heads) != 1:
        raise NorcalError(f"{where}: an Ultralytics graph with {len(heads)} Sigmoid outputs concatenated into the "
                          "head's output (expected 1: the class scores); structure not recognised, refused")
    sig, cat = heads[0]
    if _axis(cat) not in (1, -2) or list(cat.input).index(sig.output[0]) != 1 or len(cat.input) not in (2, 3):
        raise NorcalError(f"{where}: the Ultralytics head concat {cat.name!r} joins {len(cat.input)} tensors on "
                          f"axis {_axis(cat)} with the class scores at input {list(cat.input).index(sig.output[0])}; "
                          "expected boxes, scores(, mask coefficients) on axis 1")
    coefs = cat.input[2] if len(cat.input) == 3 else None
    if coefs is None:  # older Ultralytics: Segment concatenates the coefficients to Detect's output
        outer = [c for c in index.readers(cat.output[0]) if c.op_type == "Concat"]
        if len(outer) == 1 and _axis(outer[0]) in (1, -2) and len(outer[0].input) == 2 \
                and outer[0].input[0] == cat.output[0]:
            coefs = outer[0].input[1]
    if (coefs is not None) != (task == "segment"):
        raise NorcalError(f"{where}: an Ultralytics {task} model whose head "
                          f"{'has' if coefs is not None else 'has no'} mask coefficients")
    return sig, cat.input[0], coefs


def _anchors(types: dict, boxes: str, logits: str, classes: int, where: str) -> int:
    """The anchors both the boxes [batch, 4, A] and the class logits [batch, C, A] cover."""
    found = {}
    for what, (name, width) in {"boxes": (boxes, 4), "class logits": (logits, classes)}.items():
        d = tensor_sizes(types.get(name))
        if d is None or len(d) != 3 or d[1] is None or d[2] is None:
            raise NorcalError(f"{where}: the Ultralytics head's {what} {name!r} have shape {d}, expected "
                              f"[batch, {width}, anchors] with known sizes")
        if d[1] != width:
            raise NorcalError(f"{where}: the Ultralytics head's {what} {name!r} have {d[1]} channels, expected "
                              f"{width}" + (f" (len(names) = {width})" if what == "class logits" else ""))
        found[what] = d
    anchors = found["boxes"][2]
    if found["class logits"][2] != anchors:
        raise NorcalError(f"{where}: the Ultralytics head's boxes cover {anchors} anchors, its class logits "
                          f"{found['class logits'][2]}")
    return anchors


def _prototypes(g: onnx.GraphProto, index: GraphIndex, types: dict, coefs: str, anchors: int, where: str):
    """(the prototypes output, nm, its (h, w)) of a segment head with coefficients [batch, nm, A]."""
    d = tensor_sizes(types.get(coefs))
    if d is None or len(d) != 3 or d[1] is None or d[2] != anchors:
        raise NorcalError(f"{where}: the Ultralytics head's mask coefficients {coefs!r} have shape {d}, "
                          f"expected [batch, nm, {anchors}]")
    nm = d[1]
    cands = [o.name for o in g.output
             if (pd := tensor_sizes(types.get(o.name))) is not None and len(pd) == 4 and pd[1] == nm
             and pd[2] is not None and pd[3] is not None]
    if len(cands) != 1:
        raise NorcalError(f"{where}: an Ultralytics segment graph with {len(cands)} prototype outputs "
                          f"[batch, {nm}, h, w] (expected 1)")
    pd = tensor_sizes(types.get(cands[0]))
    if index.producer.get(cands[0]) is None:
        raise NorcalError(f"{where}: the prototypes {cands[0]!r} are not computed by the graph")
    return cands[0], nm, (pd[2], pd[3])


def _box_format(boxes: str, producer: dict, where: str) -> bool:
    """True when the head decodes to x0,y0,x1,y1, False for x,y,w,h, read from the decoding's
    last ops (dist2bbox: Concat(Sub, Add) for corners, Concat(Div, Sub) for centre and size,
    times the strides); anything else is refused."""
    mul = producer.get(boxes)
    cats = [producer.get(x) for x in (mul.input if mul is not None and mul.op_type == "Mul" else ())]
    for cat in cats:
        if cat is not None and cat.op_type == "Concat" and len(cat.input) == 2:
            ops = tuple(getattr(producer.get(x), "op_type", None) for x in cat.input)
            if ops == ("Sub", "Add"):
                return True
            if ops == ("Div", "Sub"):
                return False
    raise NorcalError(f"{where}: the Ultralytics head's boxes {boxes!r} are not decoded as dist2bbox decodes them "
                      "(strides times Concat(Sub, Add) or Concat(Div, Sub)); cannot tell their format, refused")


def _post_graph(head: HeadTensors, opset: int, score_thresh: float, nms_thresh: float, topk: int,
                decoding: Decoding = Decoding()) -> onnx.ModelProto:
    """Our post-processing after Ultralytics' decoding, traced to ONNX: inputs ``ul_boxes``,
    ``ul_logits``, ``image_sizes`` (, ``ul_coefs``, ``ul_protos``) -> the contract's outputs,
    with ``cls_logits`` [B, A, C] named inside; the selection ``decoding``'s (as the .pt export's)."""
    import torch

    from norcal.export.families.ultralytics.yolo_graph import output_names

    post = _post_module_class()(len(head.names), head.imgsz, head.xyxy, score_thresh, nms_thresh, topk,
                                head.end2end, decoding)
    gen = torch.Generator().manual_seed(0)
    a, c = head.anchors, len(head.names)
    args = [torch.rand((1, 4, a), generator=gen) * head.imgsz, torch.randn((1, c, a), generator=gen) - 2.0,
            torch.tensor([[head.imgsz, head.imgsz]], dtype=torch.int64)]
    inputs = ["ul_boxes", "ul_logits", "image_sizes"]
    if head.coefs:
        args += [torch.randn((1, head.num_masks, a), generator=gen),
                 torch.randn((1, head.num_masks, *head.proto_hw), generator=gen)]
        inputs += ["ul_coefs", "ul_protos"]
    outputs = output_names(bool(head.coefs))
    logits = contract.CLS_LOGITS_TENSOR
    dynamic = {n: {0: "batch"} for n in (*inputs, *outputs)}
    return trace_onnx(post.eval(), tuple(args), inputs, [*outputs, logits], opset, dynamic)


def _post_module_class():
    from torch import nn

    from norcal.export.families.ultralytics.yolo_graph import YoloGraph, selection_for

    class Post(YoloGraph):
        """YoloGraph's detections and masks without its network: the part after decoding."""

        def __init__(self, num_classes, size, xyxy, score_thresh, nms_thresh, topk, end2end, decoding):
            nn.Module.__init__(self)  # no Ultralytics model: the network is Ultralytics' ONNX
            self.num_classes, self.size, self.xyxy = int(num_classes), int(size), bool(xyxy)
            self.score_thresh, self.nms_thresh = float(score_thresh), float(nms_thresh)
            self.end2end = bool(end2end)
            self.selection = selection_for(self.end2end, self.nms_thresh, decoding)
            self.topk = int(topk)
            self.init_norcal()  # plain sigmoid: the NorCal node goes into the graph afterwards

        def forward(self, boxes, logits, image_sizes, coefs=None, protos=None):
            import torch

            if self.xyxy:
                xyxy = boxes.transpose(1, 2)  # [B, A, 4]
            else:
                xy, wh = boxes[:, :2], boxes[:, 2:4]
                xyxy = torch.cat([xy - wh / 2, xy + wh / 2], dim=1).transpose(1, 2)
            cls_logits = logits.transpose(1, 2)  # [B, A, C]: class axis last, as the .pt export's
            out = self.detections(xyxy, self.probs(cls_logits), image_sizes, (self.size, self.size),
                                  None if coefs is None else coefs.transpose(1, 2), protos)
            return (*(out[k] for k in (*contract.OUTPUT_NAMES, contract.MASK_PROTOS) if k in out), cls_logits)

    return Post


def runtime_metadata(head: HeadTensors, score_thresh: float, nms_thresh: float, topk: int,
                     decoding: Decoding = Decoding()) -> dict[str, str]:
    """The runtime keys a .pt export of the same model records, plus where the graph came from."""
    meta = contract.letterbox_preprocessing(head.imgsz).metadata()
    meta[contract.NUM_CLASSES] = str(len(head.names))
    settings = {"family": "ultralytics", "task": head.task, "input_size": head.imgsz,
                "score_thresh_test": score_thresh, "nms_thresh_test": nms_thresh,
                "detections_per_image": topk, "multi_label": not decoding.best_class, **decoding.record(),
                "names": head.names,
                "source": "ultralytics-onnx" + (" (its NMS dropped)" if head.nms else
                                                " (end-to-end, its top-k replaced)" if head.end2end else "")}
    if head.end2end:  # as the .pt export of the same head records it
        from norcal.export.families.ultralytics.yolo_graph import OneToOneTopk

        del settings["nms_thresh_test"], settings["multi_label"]
        settings["selection"] = OneToOneTopk.name
    meta[contract.DETECTOR] = json.dumps(settings)
    meta.update(contract.class_names_metadata(head.names))
    meta.update(contract.classifier_metadata(sigmoid_classifier()))  # the .pt export's classifier
    if head.coefs:
        meta.update({contract.MASK_HEAD_ROIS: "static", contract.MASK_PASTE: "ultralytics"})
        if decoding.best_class:  # as Ultralytics' predictor, whose decoding this is
            meta[contract.DROP_EMPTY_MASKS] = "true"
    return meta


def ingest_ultralytics(model: onnx.ModelProto, where: str = "model", *, score_thresh: float | None = None,
                       nms_thresh: float | None = None, detections_per_image: int | None = None,
                       decoding: Decoding | None = None) -> tuple[onnx.ModelProto, HeadTensors | RtdetrHead]:
    """Ultralytics' ONNX -> our contract's plain graph (no NorCal node yet). An RT-DETR goes to
    :func:`~norcal.export.families.ultralytics.onnx_rtdetr.ingest_rtdetr` (its own outputs
    and stretch input; ``nms_thresh`` plays no part). A YOLO: ``images`` RGB 0-255 letterboxed
    to imgsz, ``image_sizes`` -> num_detections, boxes, scores, classes(, masks), with
    ``cls_logits`` recorded as the classifier. Thresholds default to the .pt export's
    (Ultralytics' validation settings). ``decoding``: how scores become detections, as the .pt
    export takes it (best-class: Ultralytics' predictor NMS; an RT-DETR's best class per query),
    recorded in the metadata. Returns the graph and what was found."""
    from norcal.export.families.ultralytics.onnx_rtdetr import ingest_rtdetr, is_rtdetr

    if is_rtdetr(model):  # RT-DETR's own structure and post-processing
        return ingest_rtdetr(model, where, score_thresh=score_thresh, detections_per_image=detections_per_image,
                             decoding=decoding)
    head = find_head(model, where)
    if head.end2end and nms_thresh is not None:
        raise NorcalError(f"{where}: an end-to-end Ultralytics head (one-to-one, no NMS): nms_thresh does not apply",
                          param="nms_thresh")
    decoding = decoding or Decoding()
    if head.end2end and decoding.best_class:
        raise NorcalError(f"{where}: an end-to-end Ultralytics head decodes as Ultralytics' one-to-one top-k; "
                          "the best-class decoding does not apply", param="decoding")
    if decoding.host_nms:
        raise NorcalError(f"{where}: the NMS of Ultralytics' own ONNX export stays in the graph; export the .pt "
                          "checkpoint for nms='host'", param="nms")
    score_thresh = decoding.score_thresh(score_thresh)
    score = SCORE_THRESH if score_thresh is None else float(score_thresh)
    iou = NMS_THRESH if nms_thresh is None else float(nms_thresh)
    topk = int(detections_per_image or DETECTIONS)
    model, opset = at_least_opset(model, where)
    static = static_input(model, head.imgsz, where)
    body = cut_network(static, [t for t in (head.boxes, head.logits, head.coefs, head.protos) if t])
    post = _post_graph(head, opset, score, iou, topk, decoding)
    io_map = {"ul_boxes": head.boxes, "ul_logits": head.logits}
    if head.coefs:
        io_map.update(ul_coefs=head.coefs, ul_protos=head.protos)
    merged = assemble(static, body, post, io_map, topk, opset)
    onnx.helper.set_model_props(merged, runtime_metadata(head, score, iou, topk, decoding))
    return merged, head


def summary(head: HeadTensors | RtdetrHead) -> str:
    """One line saying what the ingest did."""
    if not isinstance(head, HeadTensors):
        from norcal.export.families.ultralytics.onnx_rtdetr import summary as rtdetr_summary

        return rtdetr_summary(head)
    return (f"Ultralytics {head.task} ONNX ({len(head.names)} classes, imgsz {head.imgsz}"
            f"{', its NMS dropped' if head.nms else ''}"
            f"{', end-to-end: its top-k replaced by ours' if head.end2end else ''}) converted to our outputs; NorCal on "
            f"{contract.CLS_LOGITS_TENSOR} (its class logits, transposed from {head.logits!r})")
