"""detectron2's RetinaNet (``meta_arch/retinanet.py``), batched: ResNet + FPN P3-P5 with
P6/P7 from res5 (``LastLevelP6P7``), a class and a box tower shared over levels, sigmoid
scores with no background.

Inference per image as detectron2's ``_decode_per_level_predictions`` and
``inference_single_image``: per level the scores > thresh, their top ``topk_candidates``
(over anchors x classes), decoded with (1,1,1,1) weights, unclipped; then class-wise NMS over
all levels and the top ``detections_per_image``. The levels' logits are concatenated into one
tensor [B, sum(H*W*A), C] before the one Sigmoid, so the NorCal node sits there once.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.contract import OUTPUT_NAMES

from .anchors import AnchorGenerator
from .box_coder import BoxCoder, clip_boxes
from .fpn import FPN
from .layers import PaddingMasks
from norcal.export.pytorch.ops import non_max_suppression
from .rpn import topk_in_steps
from norcal.export.pytorch.sigmoid_norcal import SigmoidNorCal


class RetinaFPN(FPN):
    """FPN over res3-res5 plus ``top_block``: P6 = conv3x3/2(res5), P7 = conv3x3/2(relu(P6))."""

    def __init__(self, bottom_up: nn.Module, out_channels: int, norm: str = "", p6_from_p5: bool = False):
        """``p6_from_p5``: P6 = conv3x3/2(P5) (torchvision's LastLevelP6P7 with 256 inputs)."""
        super().__init__(bottom_up, out_channels, norm, in_features=["res3", "res4", "res5"])
        c5 = out_channels if p6_from_p5 else bottom_up.out_channels["res5"]
        self.p6_from_p5 = p6_from_p5
        self.top_block = nn.Module()
        self.top_block.p6 = nn.Conv2d(c5, out_channels, 3, stride=2, padding=1)
        self.top_block.p7 = nn.Conv2d(out_channels, out_channels, 3, stride=2, padding=1)
        self.strides = self.in_strides + [self.in_strides[-1] * 2, self.in_strides[-1] * 4]

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> list[torch.Tensor]:
        feats = self.bottom_up(x, masks)
        results = self.top_down(feats, masks)
        s5 = self.in_strides[-1]
        p6 = self.top_block.p6(masks.apply(results[-1] if self.p6_from_p5 else feats["res5"], s5))
        p7 = self.top_block.p7(masks.apply(F.relu(p6), 2 * s5))
        return results + [p6, p7]


class RetinaNetHead(nn.Module):
    """detectron2's ``RetinaNetHead`` (no norm): towers ``cls_subnet`` / ``bbox_subnet`` of
    conv3x3 + ReLU, then ``cls_score`` [A*C] and ``bbox_pred`` [A*4], shared over levels."""

    def __init__(self, channels: int, num_anchors: int, num_classes: int, num_convs: int):
        super().__init__()
        for name in ("cls_subnet", "bbox_subnet"):
            layers = []
            for _ in range(num_convs):
                layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()]
            self.add_module(name, nn.Sequential(*layers))
        self.cls_score = nn.Conv2d(channels, num_anchors * num_classes, 3, padding=1)
        self.bbox_pred = nn.Conv2d(channels, num_anchors * 4, 3, padding=1)

    @staticmethod
    def _tower(layers: nn.Sequential, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # every 3x3 conv sees zeros past the image's own extent, as in detectron2 alone
        for layer in layers:
            x = layer(x * mask) if isinstance(layer, nn.Conv2d) else layer(x)
        return x * mask

    def forward(self, x: torch.Tensor, mask: torch.Tensor):
        """x [B, ch, H, W] -> logits [B, H*W*A, C], deltas [B, H*W*A, 4] (detectron2's order)."""
        b = x.shape[0]
        logits = self.cls_score(self._tower(self.cls_subnet, x, mask))
        deltas = self.bbox_pred(self._tower(self.bbox_subnet, x, mask))
        k = self.cls_score.out_channels // (deltas.shape[1] // 4)
        return _per_anchor(logits, b, k), _per_anchor(deltas, b, 4)


def _per_anchor(x: torch.Tensor, b: int, k: int) -> torch.Tensor:
    """detectron2's ``permute_to_N_HWA_K``: [B, A*K, H, W] -> [B, H*W*A, K]."""
    h, w = x.shape[-2], x.shape[-1]
    return x.reshape(b, -1, k, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, k)


class RetinaNet(SigmoidNorCal, nn.Module):
    """Same graph contract as ``GeneralizedRCNN``: images, image_sizes -> num_detections,
    boxes, scores, classes (no masks)."""

    head_name = "the RetinaNet head"

    def __init__(self, backbone: RetinaFPN, head: RetinaNetHead, anchors: AnchorGenerator, *,
                 num_classes: int, pixel_mean, pixel_std, box_weights, score_thresh: float,
                 topk_candidates: int, nms_thresh: float, detections_per_image: int,
                 size_divisibility: int, clip_boxes: bool = False):
        """``clip_boxes``: clip each candidate to its image before NMS (torchvision does;
        detectron2 clips only after, in the original image)."""
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.anchor_generator = anchors
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(1, -1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(1, -1, 1, 1), False)
        self.num_classes = int(num_classes)
        self.box_coder = BoxCoder(box_weights)
        self.score_thresh = float(score_thresh)
        self.topk_candidates = int(topk_candidates)
        self.nms_thresh = float(nms_thresh)
        self.topk = int(detections_per_image)
        self.size_divisibility = int(size_divisibility)
        self.clip_boxes = bool(clip_boxes)
        # NorCal state, named like FastRCNNOutputLayers' so the PyTorch runner treats both alike
        self.init_norcal()

    def head_outputs(self, images: torch.Tensor, image_sizes: torch.Tensor) -> list[tuple]:
        """Backbone and head: per level (logits [B, n, C], deltas [B, n, 4], anchors [n, 4],
        inside [B, n]) with n = H*W*A; ``inside`` is 0 for anchors on another image's padding."""
        masks = PaddingMasks(image_sizes, self.size_divisibility)
        x = masks.apply_image((images - self.pixel_mean) / self.pixel_std)
        features = self.backbone(x, masks)
        anchors = self.anchor_generator(features, masks.padded)
        a = self.anchor_generator.num_anchors
        levels = []
        for f, stride, anc in zip(features, self.anchor_generator.strides, anchors):
            m = masks.mask(stride, f)
            lg, dl = self.head(f, m)
            # anchors on another image's padding do not exist for this image in detectron2
            inside = m[:, 0, :, :, None].expand(-1, -1, -1, a).reshape(lg.shape[0], -1)
            levels.append((lg, dl, anc, inside))
        return levels

    def candidates(self, levels: list[tuple], scores: torch.Tensor, image_sizes: torch.Tensor):
        """Every level's top candidates from ``scores`` [B, sum(n), C] (the levels' logits'
        activations): boxes [B, R, 4], scores [B, R], classes [B, R], R = levels x top-k;
        ``image_sizes`` int64 [B, 2] for the clip (``clip_boxes``)."""
        boxes, top_scores, classes = [], [], []
        start = 0
        for lg, dl, anc, ins in levels:
            n = lg.shape[1]
            s = scores[:, start:start + n] * ins[:, :, None]
            start = start + n
            bx, sc, cl = self._candidates(s, dl, anc)
            boxes.append(bx)
            top_scores.append(sc)
            classes.append(cl)
        boxes = torch.cat(boxes, 1)
        if self.clip_boxes:
            boxes = clip_boxes(boxes, image_sizes)
        return boxes, torch.cat(top_scores, 1), torch.cat(classes, 1)

    def inference(self, images: torch.Tensor, image_sizes: torch.Tensor,
                  intermediates: bool = False) -> dict[str, torch.Tensor]:
        """Detections by name; with ``intermediates`` also ``cls_logits`` [B, N, C] and
        ``box_deltas`` [B, N, 4] over all levels' anchors (N = sum of H*W*A)."""
        levels = self.head_outputs(images, image_sizes)
        cls_logits = torch.cat([lv[0] for lv in levels], dim=1)
        out = self.nms(*self.candidates(levels, self.probs(cls_logits), image_sizes))
        if intermediates:
            out.update(cls_logits=cls_logits, box_deltas=torch.cat([lv[1] for lv in levels], dim=1))
        return out

    def _candidates(self, scores: torch.Tensor, deltas: torch.Tensor, anchors: torch.Tensor):
        """One level: scores [B, n, C] -> the top k (anchor, class) pairs with score > thresh:
        boxes [B, k, 4], scores [B, k] (0 where none), classes int64 [B, k]."""
        b, c, k = scores.shape[0], self.num_classes, self.topk_candidates
        flat = scores.reshape(b, -1)
        # k dummies so the TopK needs no min(k, n*C) and works for any map size
        flat = torch.cat([flat, flat.new_zeros((b, k))], dim=1)
        deltas = torch.cat([deltas, deltas.new_zeros((b, k, 4))], dim=1)
        top, idx = topk_in_steps(flat, k)  # TensorRT's TopK takes K < 3840
        anchor_idx = torch.div(idx, c, rounding_mode="trunc")
        cls = idx - anchor_idx * c
        d = torch.gather(deltas, 1, anchor_idx[:, :, None].expand(-1, -1, 4))
        if anchors.dim() == 3:  # per-image anchors (torchvision's strides)
            anchors = torch.cat([anchors, anchors.new_zeros((b, k, 4))], dim=1)
            anchors = torch.gather(anchors, 1, anchor_idx[:, :, None].expand(-1, -1, 4))
        else:
            anchors = torch.cat([anchors, anchors.new_zeros((k, 4))], dim=0)[anchor_idx]
        boxes = self.box_coder.decode(d, anchors)[:, :, 0, :]
        top = torch.where(top > self.score_thresh, top, torch.zeros_like(top))
        return boxes, top, cls

    def nms(self, boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor) -> dict:
        """Class-wise NMS over the candidates [B, R, ...] of all levels, then the top K."""
        b, r = boxes.shape[0], boxes.shape[1]
        dense = scores.new_zeros((b, self.num_classes, r))
        dense = dense.scatter(1, classes[:, None, :], scores[:, None, :])  # [B, C, R]
        sel = non_max_suppression(boxes, dense, self.topk, self.nms_thresh, self.score_thresh)
        flat = (sel[:, 0] * self.num_classes + sel[:, 1]) * r + sel[:, 2]
        kept = torch.zeros_like(dense).reshape(-1)
        kept = kept.scatter(0, flat, dense.reshape(-1)[flat]).reshape(b, -1)  # [B, C*R]
        top, idx = kept.topk(self.topk, dim=1)
        cls = torch.div(idx, r, rounding_mode="trunc")
        det = torch.gather(boxes, 1, (idx - cls * r)[:, :, None].expand(-1, -1, 4))
        keep = top > 0  # kept scores are > score_thresh >= 0; the rest are the zero padding
        keep_f = keep.to(top.dtype)
        return {"num_detections": keep.sum(dim=1), "boxes": det * keep_f[..., None],
                "scores": top * keep_f, "classes": cls * keep.to(cls.dtype)}

    def forward(self, images: torch.Tensor, image_sizes: torch.Tensor, with_cls_logits: bool = False,
                candidates: bool = False):
        """The outputs in OUTPUT_NAMES order, or with ``candidates`` the levels' top candidates
        (boxes, scores, classes: the NMS left to the host); ``with_cls_logits`` appends the
        concatenated class logits (the ONNX export names that tensor)."""
        if candidates:
            levels = self.head_outputs(images, image_sizes)
            cls_logits = torch.cat([lv[0] for lv in levels], dim=1)
            found = self.candidates(levels, self.probs(cls_logits), image_sizes)
            return (*found, cls_logits) if with_cls_logits else found
        out = self.inference(images, image_sizes, intermediates=with_cls_logits)
        outputs = tuple(out[k] for k in OUTPUT_NAMES if k in out)
        return (*outputs, out["cls_logits"]) if with_cls_logits else outputs
