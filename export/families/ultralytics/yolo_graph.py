"""Our export module around an Ultralytics YOLOv8 / YOLO11 / YOLO26 detect or segment model.

The Ultralytics model runs unchanged up to its head's raw outputs; everything after is ours and
written once for the eager model and the ONNX trace alike:

- input: the letterboxed square, RGB 0-255 (norcal.core.contract RESIZE = letterbox); the
  graph divides by 255 as Ultralytics' predictor does;
- the head's class logits [B, C, A] are transposed to ``cls_logits`` [B, A, C] (the tensor the
  NorCal node reads, class axis last, no background) and go through one Sigmoid;
- boxes decoded as Ultralytics does (DFL expectation, distances from the anchor points
  ``make_anchors(feats, stride, 0.5)``, times the level's stride), here straight to x0,y0,x1,y1;
- the detections are chosen by the head's selection (:class:`ClassWiseNms` or
  :class:`OneToOneTopk`, picked from the head's ``end2end``):
  - one-to-many heads (Ultralytics' default): NMS as its ``non_max_suppression(multi_label=True)``
    (its validation setting): every (anchor, class) pair with score > score_thresh is a
    candidate, class-wise NMS at nms_thresh (ONNX NonMaxSuppression), the top K kept; unlike
    Ultralytics there is no 30000-candidate cap before the NMS (it only changes anything when
    more candidates pass the threshold). With the best-class decoding (``Decoding``, the export's
    ``decoding`` option) it is its predictor's ``non_max_suppression(multi_label=False)`` instead
    (:class:`BestClassNms`): each anchor's best class after NorCal, a candidate when that score
    is > score_thresh, class-wise or (``agnostic_nms``) class-agnostic NMS, the top K;
  - end-to-end heads (YOLO26's one-to-one branch selected, ``end2end`` True): no NMS; the
    one-to-one branch's boxes and logits, Ultralytics' ``Detect.get_topk_index`` (the top
    min(K, A) anchors by their best class score, then the top min(K, A) of those anchors'
    (anchor, class) pairs) and its predictor's ``score > conf`` filter, padded to K;
- the letterbox's centring offset ((S - h) // 2, (S - w) // 2 from ``image_sizes``) is removed,
  so boxes are in resized-image coordinates like every export of ours;
- segment models: the masks output is each detection's mask coefficients [B, K, nm] and
  ``mask_protos`` the prototypes [B, nm, S/4, S/4] (MASK_PASTE "ultralytics"): the host makes each
  image mask from them as Ultralytics' predictor does (``norcal.runtime.proto_masks``). A
  box-relative M x M grid cannot carry that mask (at 28 x 28 its IoU with Ultralytics' is
  about 0.6); the prototypes, once per image, cost less than K full-resolution maps.
"""

from __future__ import annotations

import torch
from torch import nn

from norcal.core.contract import CANDIDATE_BOXES, CANDIDATE_COEFS, CANDIDATE_SCORES, MASK_PROTOS, OUTPUT_NAMES
from norcal.core.decoding import Decoding
from norcal.core.errors import NorcalError
from norcal.export.pytorch.ops import non_max_suppression
from norcal.export.pytorch.sigmoid_norcal import SigmoidNorCal

PROTO_STRIDE = 4  # the prototypes' stride over the input, as Ultralytics' mask code takes it


def output_names(has_masks: bool, host_nms: bool = False) -> list[str]:
    """The graph's outputs: the contract's, and for a segment model its masks and prototypes;
    with ``host_nms`` the candidates the host selects from instead (norcal.core.contract)."""
    if host_nms:
        return [CANDIDATE_BOXES, CANDIDATE_SCORES] + ([CANDIDATE_COEFS, MASK_PROTOS] if has_masks else [])
    return [n for n in OUTPUT_NAMES if n != "masks" or has_masks] + ([MASK_PROTOS] if has_masks else [])


class ClassWiseNms:
    """Ultralytics' multi-label NMS: every (anchor, class) above the threshold, class-wise NMS
    at ``iou``, the top K of what it keeps."""

    name = "nms"

    def __init__(self, iou: float):
        self.iou = float(iou)

    def least_anchors(self, topk: int, num_classes: int, anchors: int) -> int:
        """Anchors a re-scored subset needs so that the top-K cut sees K (anchor, class) pairs."""
        return -(-int(topk) // int(num_classes))

    def __call__(self, boxes: torch.Tensor, scores: torch.Tensor, topk: int, thresh: float):
        """(scores [B, K], classes [B, K], anchors [B, K]); scores 0 in the unused slots."""
        return _nms_top(boxes, scores.transpose(1, 2), topk, self.iou, thresh)  # [B, C, A]: NMS's layout


class BestClassNms:
    """Ultralytics' predictor NMS (``non_max_suppression(multi_label=False)``): one label per
    anchor, its best class (after NorCal), a candidate when that score is above the threshold;
    NMS class-wise (Ultralytics offsets each class's boxes by ``max_wh``: the same separation)
    or across classes (``agnostic``), the top K of what it keeps."""

    name = "best-class nms"

    def __init__(self, iou: float, agnostic: bool = False):
        self.iou, self.agnostic = float(iou), bool(agnostic)

    def least_anchors(self, topk: int, num_classes: int, anchors: int) -> int:
        """Anchors a re-scored subset needs so that the top-K cut sees as many slots as the
        whole image's anchors give (C x A class-wise, A agnostic)."""
        return min(int(topk), int(anchors)) if self.agnostic else -(-int(topk) // int(num_classes))

    def __call__(self, boxes: torch.Tensor, scores: torch.Tensor, topk: int, thresh: float):
        """(scores [B, K], classes [B, K], anchors [B, K]); scores 0 in the unused slots."""
        conf, label = scores.max(dim=-1)  # [B, A]: the first of equal maxima, as torch and ONNX ArgMax
        if self.agnostic:
            top, _, anchor = _nms_top(boxes, conf[:, None, :], topk, self.iou, thresh)
            return top, torch.gather(label, 1, anchor), anchor
        classes = torch.arange(scores.shape[2], device=scores.device)[None, :, None]
        dense = (classes == label[:, None, :]).to(conf.dtype) * conf[:, None, :]  # [B, C, A], one class per anchor
        return _nms_top(boxes, dense, topk, self.iou, thresh)


def _nms_top(boxes: torch.Tensor, dense: torch.Tensor, topk: int, iou: float, thresh: float):
    """NMS of ``dense`` [B, C, A] (per row c, boxes shared) at ``iou``, candidates above
    ``thresh``; the top K kept as (scores, rows c, anchors), padded with zeros when C x A < K."""
    b, c, a = dense.shape
    sel = non_max_suppression(boxes, dense, topk, iou, thresh)
    flat = (sel[:, 0] * c + sel[:, 1]) * a + sel[:, 2]
    kept = torch.zeros_like(dense).reshape(-1)
    kept = kept.scatter(0, flat, dense.reshape(-1)[flat]).reshape(b, -1)  # [B, C*A]
    k = min(int(topk), c * a)
    top, idx = kept.topk(k, dim=1)
    row = torch.div(idx, a, rounding_mode="trunc")
    out = (top, row, idx - row * a)
    if k < topk:  # fewer pairs than K slots: zero slots, as the unused ones
        out = tuple(torch.nn.functional.pad(t, (0, int(topk) - k)) for t in out)
    return out


class OneToOneTopk:
    """An end-to-end head's selection, as Ultralytics' ``Detect.get_topk_index`` (class-aware)
    and its predictor: the top k = min(K, A) anchors by best class score, the top k of their
    (anchor, class) pairs, the scores above the threshold kept (the rest zeroed), padded to K."""

    name = "one-to-one top-k"

    def least_anchors(self, topk: int, num_classes: int, anchors: int) -> int:
        """Ultralytics takes min(K, A) anchors and pairs: a re-scored subset needs as many rows."""
        return min(int(topk), int(anchors))

    def __call__(self, boxes: torch.Tensor, scores: torch.Tensor, topk: int, thresh: float):
        """(scores [B, K], classes [B, K], anchors [B, K]); scores 0 where not above ``thresh``."""
        a, c = int(scores.shape[1]), int(scores.shape[2])
        k = min(int(topk), a)
        first = scores.max(dim=-1).values.topk(k, dim=1).indices  # [B, k] anchors
        pairs = torch.gather(scores, 1, first[:, :, None].expand(-1, -1, c)).flatten(1)  # [B, k*C]
        top, idx = pairs.topk(k, dim=1)
        row = torch.div(idx, c, rounding_mode="trunc")
        cls = idx - row * c  # not Mod: older TensorRT parsers lack it
        anchor = torch.gather(first, 1, row)
        top = top * (top > thresh).to(top.dtype)
        if k < topk:  # fewer anchors than K slots: pad like the NMS path's unused slots
            pad = topk - k
            top = torch.nn.functional.pad(top, (0, pad))
            cls = torch.nn.functional.pad(cls, (0, pad))
            anchor = torch.nn.functional.pad(anchor, (0, pad))
        return top, cls, anchor


def head_selection(head: nn.Module, nms_thresh: float, decoding: Decoding = Decoding()):
    """The selection Ultralytics predicts ``head`` with: its one-to-one top-k when the head is
    end-to-end (``end2end`` True), else NMS at ``nms_thresh``: class-wise over every (anchor,
    class) (multi-label, its validator's), or over each anchor's best class (its predictor's)."""
    return selection_for(is_end2end(head), nms_thresh, decoding)


def selection_for(end2end: bool, nms_thresh: float, decoding: Decoding = Decoding()):
    """:func:`head_selection` from what the head is (``end2end``): the .pt export's and the ingest
    of Ultralytics' ONNX (:mod:`.onnx_yolo`) alike."""
    if end2end:
        return OneToOneTopk()
    return BestClassNms(nms_thresh, decoding.agnostic_nms) if decoding.best_class else ClassWiseNms(nms_thresh)


def is_end2end(head: nn.Module) -> bool:
    """Whether Ultralytics predicts with ``head``'s one-to-one branch (Detect.end2end)."""
    return bool(getattr(head, "end2end", False))


class YoloGraph(SigmoidNorCal, nn.Module):
    """images [B,3,S,S] (letterboxed RGB 0-255), image_sizes [B,2] -> our output contract."""

    head_name = "the YOLO head"

    def __init__(self, model: nn.Module, *, num_classes: int, score_thresh: float, nms_thresh: float,
                 detections_per_image: int, decoding: Decoding = Decoding()):
        super().__init__()
        self.model = model
        layers = list(model.model)
        self.head = layers[-1]
        self.end2end = is_end2end(self.head)
        self.branch = "one2one" if self.end2end else "one2many"
        parts = getattr(self.head, self.branch)
        if parts.get("box_head") is None or parts.get("cls_head") is None:
            raise NorcalError(f"the Ultralytics head has no {self.branch} branch (removed by fusion)")
        self.selection = head_selection(self.head, nms_thresh, decoding)
        self.has_masks = hasattr(self.head, "proto")
        self.num_classes = int(num_classes)
        self.score_thresh = float(score_thresh)
        self.nms_thresh = float(nms_thresh)
        self.topk = int(detections_per_image)
        # NorCal state, named like the R-CNN box predictor's so the PyTorch runner treats all alike
        self.init_norcal()

    # --- NorCal in eager PyTorch (the reference and the tuning sweep)
    # --- the network
    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The head's input maps: the Ultralytics layers' own loop (``_predict_once``) minus the head."""
        y: list = []
        save = self.model.save
        for m in list(self.model.model)[:-1]:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in save else None)
        f = self.head.f
        return [x if j == -1 else y[j] for j in (f if isinstance(f, (list, tuple)) else [f])]

    def head_outputs(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """boxes [B, A, 4] x0,y0,x1,y1 in letterboxed-input pixels, cls_logits [B, A, C], and for
        segment models coefs [B, A, nm] and protos [B, nm, S/4, S/4]."""
        from ultralytics.utils.tal import make_anchors

        head = self.head
        feats = self.features(images / 255.0)
        raw = head.forward_head(feats, **getattr(head, self.branch))
        anchors, strides = make_anchors(feats, head.stride, 0.5)  # [A, 2] grid units, [A, 1]
        # both branches share the DFL; an end-to-end head decodes to corners too (dist2bbox xyxy)
        dist = head.dfl(raw["boxes"]).transpose(1, 2)  # [B, A, 4] l, t, r, b in grid units
        boxes = torch.cat([anchors - dist[..., :2], anchors + dist[..., 2:]], dim=-1) * strides
        out = {"boxes": boxes, "cls_logits": raw["scores"].transpose(1, 2)}
        if self.has_masks:
            out["coefs"] = raw["mask_coefficient"].transpose(1, 2)
            # YOLO26's Proto26 fuses every level, the older Proto reads the finest one
            out["protos"] = head.proto(feats if type(head.proto).__name__ == "Proto26" else feats[0])
        return out

    def detections(self, boxes: torch.Tensor, scores: torch.Tensor, image_sizes: torch.Tensor,
                   input_hw: tuple, coefs: torch.Tensor | None = None,
                   protos: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The head's selection (class-wise NMS, or an end-to-end head's top-k) over every
        (anchor, class) of ``scores`` [B, A, C] to K slots, masks, and boxes moved from the
        letterboxed input to resized-image coordinates."""
        top, cls, anchor = self.selection(boxes, scores, self.topk, self.score_thresh)
        det = torch.gather(boxes, 1, anchor[:, :, None].expand(-1, -1, 4))
        keep = top > 0  # kept scores are > score_thresh >= 0; the rest are the zero padding
        keep_f = keep.to(top.dtype)
        h, w = input_hw
        sizes = image_sizes.to(boxes.dtype)
        top_pad = torch.div(h - sizes[:, 0], 2, rounding_mode="floor")
        left_pad = torch.div(w - sizes[:, 1], 2, rounding_mode="floor")
        offset = torch.stack([left_pad, top_pad, left_pad, top_pad], dim=1)[:, None, :]
        out = {"num_detections": keep.sum(dim=1), "boxes": (det - offset) * keep_f[..., None],
               "scores": top * keep_f, "classes": cls * keep.to(cls.dtype)}
        if coefs is not None and protos is not None:
            out.update(self.masks(anchor, keep_f, coefs, protos, h))
        return out

    def masks(self, anchor: torch.Tensor, keep: torch.Tensor, coefs: torch.Tensor, protos: torch.Tensor,
              input_h) -> dict[str, torch.Tensor]:
        """masks: each slot's coefficients [B, K, nm] (0 in unused slots); mask_protos: the
        prototypes [B, nm, S/4, S/4] as the head made them (the host's "ultralytics" paste)."""
        if int(protos.shape[2]) * PROTO_STRIDE != int(input_h):
            raise NorcalError(f"the YOLO prototypes are {int(protos.shape[2])} rows for a {int(input_h)}-pixel "
                              f"input, not stride {PROTO_STRIDE} as Ultralytics' masks take them; refused")
        nm = protos.shape[1]
        co = torch.gather(coefs, 1, anchor[:, :, None].expand(-1, -1, nm))  # [B, K, nm]
        return {"masks": co * keep[..., None], MASK_PROTOS: protos}

    def inference(self, images: torch.Tensor, image_sizes: torch.Tensor,
                  intermediates: bool = False) -> dict[str, torch.Tensor]:
        """Detections by name; with ``intermediates`` also ``cls_logits`` [B, A, C]."""
        head = self.head_outputs(images)
        scores = self.probs(head["cls_logits"])
        out = self.detections(head["boxes"], scores, image_sizes, images.shape[2:],
                              head.get("coefs"), head.get("protos"))
        if intermediates:
            out["cls_logits"] = head["cls_logits"]
        return out

    def candidates(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """What a host-NMS graph outputs: every anchor's box (letterboxed-input pixels, the
        offset still in: the host removes it as :meth:`detections` does), its calibrated class
        scores, and for segment models its coefficients and the prototypes; with ``cls_logits``."""
        head = self.head_outputs(images)
        out = {CANDIDATE_BOXES: head["boxes"], CANDIDATE_SCORES: self.probs(head["cls_logits"]),
               "cls_logits": head["cls_logits"]}
        if self.has_masks:
            out |= {CANDIDATE_COEFS: head["coefs"], MASK_PROTOS: head["protos"]}
        return out

    def forward(self, images: torch.Tensor, image_sizes: torch.Tensor, with_cls_logits: bool = False,
                candidates: bool = False):
        """The outputs in OUTPUT_NAMES order, or with ``candidates`` the candidates' (a host-NMS
        export; image_sizes then unused); ``with_cls_logits`` appends the class logits (the ONNX
        export names that tensor)."""
        if candidates:
            out = self.candidates(images)
            names = output_names(self.has_masks, host_nms=True)
            return (*(out[k] for k in names), *((out["cls_logits"],) if with_cls_logits else ()))
        out = self.inference(images, image_sizes, intermediates=with_cls_logits)
        outputs = tuple(out[k] for k in (*OUTPUT_NAMES, MASK_PROTOS) if k in out)
        return (*outputs, out["cls_logits"]) if with_cls_logits else outputs

