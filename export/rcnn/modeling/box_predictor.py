"""detectron2's ``FastRCNNOutputLayers`` and ``fast_rcnn_inference``, batched.

Scores: softmax over C+1 (background last) or sigmoid, optionally NorCal-calibrated with a
``log_prior`` [C+1]. Inference: drop background, keep score > thresh, class-wise NMS, top-K;
outputs are fixed-size and zero-padded like TensorRT's EfficientNMS.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.calibration.formula import calibrate, check_variant
from norcal.core.errors import NorcalError

from .box_coder import BoxCoder, clip_boxes
from norcal.export.pytorch.ops import non_max_suppression


class FastRCNNOutputLayers(nn.Module):
    """Box features [M, D] -> cls logits [M, C+1] and box deltas [M, C*4] (or [M, 4] agnostic)."""

    def __init__(self, input_size: int, num_classes: int, *, cls_agnostic_bbox_reg: bool = False,
                 box_weights=(10.0, 10.0, 5.0, 5.0), use_sigmoid: bool = False,
                 score_thresh: float = 1e-4, nms_thresh: float = 0.5, topk: int = 300,
                 background: str = "last", min_box_size: float = 0.0):
        """``background`` "first" (torchvision's ``FastRCNNPredictor``): the background logit
        and box come first, boxes regressed for the background too; ``min_box_size`` > 0
        drops decoded boxes narrower or lower than it (torchvision's remove_small_boxes)."""
        super().__init__()
        if background not in ("last", "first"):
            raise NorcalError(f"box predictor background must be 'last' or 'first', got {background!r}")
        self.num_classes = int(num_classes)
        self.background = background
        self.min_box_size = float(min_box_size)
        self.cls_score = nn.Linear(input_size, num_classes + 1)
        self.num_reg_classes = 1 if cls_agnostic_bbox_reg else num_classes
        # torchvision regresses a box for the background too (dropped at inference)
        self.bg_box = background == "first" and not cls_agnostic_bbox_reg
        self.bbox_pred = nn.Linear(input_size, (self.num_reg_classes + self.bg_box) * 4)
        self.box_coder = BoxCoder(box_weights)
        self.use_sigmoid = use_sigmoid
        self.score_thresh = float(score_thresh)
        self.nms_thresh = float(nms_thresh)
        self.topk = int(topk)
        self.log_prior: torch.Tensor | None = None
        self.mechanism, self.renormalize = "exp", not use_sigmoid

    def set_log_prior(self, log_prior, mechanism: str = "exp", renormalize: bool | None = None) -> None:
        """Calibrate scores with NorCal: ``log_prior`` [C+1] from ``norcal.core.calibration.formula.log_prior``
        (background at ``self.background``) and the variant (see ``norcal.core.calibration.formula.calibrate``; renormalize
        None: the head's own form); None restores the plain scores."""
        act = "sigmoid" if self.use_sigmoid else "softmax"
        self.mechanism, self.renormalize = mechanism, check_variant(mechanism, renormalize, act)
        if log_prior is None:
            self.log_prior = None
            return
        lp = torch.as_tensor(np.asarray(log_prior, dtype=np.float64), dtype=torch.float32)
        if lp.shape != (self.num_classes + 1,):
            raise NorcalError(f"log prior has shape {tuple(lp.shape)}, the classifier needs "
                              f"({self.num_classes + 1},) (C classes + background)")
        self.log_prior = lp

    def forward(self, x: torch.Tensor):
        return self.cls_score(x), self.bbox_pred(x)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Class probabilities [..., C+1] from logits [..., C+1]."""
        lp = self.log_prior
        act = "sigmoid" if self.use_sigmoid else "softmax"
        if lp is None:
            return torch.sigmoid(logits) if self.use_sigmoid else F.softmax(logits, dim=-1)
        if torch.onnx.is_in_onnx_export():
            # the graph gets NorCal from one place only: the surgery's node (norcal_node.py)
            raise NorcalError("export the plain model (no log prior set); the NorCal node is "
                              "inserted into the ONNX graph afterwards (norcal.export.graph.surgery)")
        return calibrate(logits, lp.to(logits.device), mechanism=self.mechanism,
                         renormalize=self.renormalize, activation=act, background=self.background)

    def inference(self, logits, deltas, proposals, valid, image_sizes):
        """logits [B, R, C+1], deltas [B, R, K*4], proposals [B, R, 4], valid bool [B, R]
        -> num_detections int64 [B], boxes [B, N, 4], scores [B, N], classes int64 [B, N]."""
        return self.inference_from_probs(self.probs(logits), deltas, proposals, valid, image_sizes)

    def inference_from_probs(self, probs, deltas, proposals, valid, image_sizes):
        """:meth:`inference` from class probabilities [B, R, C+1] (e.g. averaged over cascade
        stages) instead of logits."""
        b, r = proposals.shape[0], proposals.shape[1]
        c = self.num_classes
        if self.background == "first":
            probs = probs[..., 1:] * valid[..., None].to(probs.dtype)
            if self.bg_box:
                deltas = deltas[..., 4:]
        else:
            probs = probs[..., :c] * valid[..., None].to(probs.dtype)
        boxes = clip_boxes(self.box_coder.decode(deltas, proposals), image_sizes)  # [B,R,K,4]
        if self.min_box_size > 0:
            w = boxes[..., 2] - boxes[..., 0]
            h = boxes[..., 3] - boxes[..., 1]
            big = ((w >= self.min_box_size) & (h >= self.min_box_size)).to(probs.dtype)  # [B,R,K]
            probs = probs * big  # K is 1 (agnostic) or C: broadcasts either way
        scores = probs.permute(0, 2, 1)  # [B, C, R]
        if self.num_reg_classes == 1:
            nms_boxes, nms_scores = boxes[:, :, 0, :], scores
        else:
            # detectron2 regresses a box per class: fold the class into NMS's batch axis
            nms_boxes = boxes.permute(0, 2, 1, 3).reshape(-1, r, 4)
            nms_scores = scores.reshape(-1, 1, r)
        sel = non_max_suppression(nms_boxes, nms_scores, self.topk, self.nms_thresh,
                                  self.score_thresh)
        # both layouts index the same [B, C, R] grid
        flat = (sel[:, 0] * nms_scores.shape[1] + sel[:, 1]) * r + sel[:, 2]
        dense = torch.zeros_like(scores).reshape(-1)
        dense = dense.scatter(0, flat, scores.reshape(-1)[flat]).reshape(b, -1)  # [B, C*R]
        n = min(self.topk, c * r) if isinstance(r, int) else self.topk
        top, idx = dense.topk(n, dim=1)
        classes = torch.div(idx, r, rounding_mode="trunc")  # idx >= 0
        if self.num_reg_classes == 1:
            box_idx = idx - classes * r
            det = torch.gather(boxes[:, :, 0, :], 1, box_idx[:, :, None].expand(-1, -1, 4))
        else:
            det = torch.gather(boxes.permute(0, 2, 1, 3).reshape(b, -1, 4), 1,
                               idx[:, :, None].expand(-1, -1, 4))
        keep = top > 0  # kept scores are > score_thresh >= 0; the rest are the zero padding
        num = keep.sum(dim=1)
        keep_f = keep.to(top.dtype)
        return num, det * keep_f[..., None], top * keep_f, classes * keep.to(classes.dtype)
