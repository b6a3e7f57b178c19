"""The two detection ops that need an explicit ONNX form: multi-class NMS and ROIAlign.

Each is a ``torch.autograd.Function`` whose eager forward computes exactly what the ONNX
operator defines (with torchvision, as detectron2 does) and whose ``symbolic`` writes that
operator, so the eager model and the exported graph share every other line.
"""

from __future__ import annotations

import torch
import torchvision

FLOAT_LOWEST = float(torch.finfo(torch.float32).min)


def _first_kept(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, limit: int) -> torch.Tensor:
    """``torchvision.ops.nms(boxes, scores, iou_threshold)[:limit]``, without running the greedy
    pass over every box: a box's fate depends only on the higher-scored kept boxes, so NMS of the
    candidates scoring at least the m-th best score (ties included, in their index order, as the
    full call's stable sort orders them) keeps the same first boxes; m grows until ``limit`` are
    kept or every box is in. Thousands of candidates per class (a YOLO head at a 0.001
    threshold) otherwise cost O(n^2) IoUs per class where a few hundred are kept."""
    n = int(scores.numel())
    m = 4 * max(int(limit), 1)
    while m < n:
        cut = scores.topk(m).values[-1]
        idx = torch.nonzero(scores >= cut, as_tuple=True)[0]  # ascending: the original order of ties
        if idx.numel() >= n:
            break
        k = torchvision.ops.nms(boxes[idx], scores[idx], iou_threshold)
        if k.numel() >= limit:
            return idx[k[:limit]]
        m *= 4
    return torchvision.ops.nms(boxes, scores, iou_threshold)[:limit]


class _NonMaxSuppression(torch.autograd.Function):
    @staticmethod
    def forward(ctx, boxes, scores, max_per_class: int, iou_threshold: float,
                score_threshold: float):
        n, c, r = scores.shape
        if torch.onnx.is_in_onnx_export():
            # the trace records the NonMaxSuppression node whatever this returns, and nothing
            # downstream turns the selection's values or count into constants: a stand-in (the
            # first candidate) spares the export the real NMS, seconds for 1.2M candidates,
            # and the mask head on hundreds of detections
            return torch.zeros((1, 3), dtype=torch.int64, device=scores.device)
        # nonzero is row-major, so candidates come grouped by (n, c) with r ascending
        ni, ci, ri = torch.nonzero(scores > score_threshold, as_tuple=True)
        if ni.numel() == 0:
            return torch.zeros((0, 3), dtype=torch.int64, device=scores.device)
        cand_boxes = boxes[ni, ri]
        cand_scores = scores[ni, ci, ri]
        _, counts = torch.unique_consecutive(ni * c + ci, return_counts=True)
        keep, start = [], 0
        # one torchvision nms per (n, c), like batched_nms' per-class path in detectron2, but
        # on contiguous slices: no O(classes x candidates) scan
        for cnt in counts.tolist():
            k = _first_kept(cand_boxes[start:start + cnt], cand_scores[start:start + cnt], iou_threshold,
                            max_per_class)
            keep.append(k + start)
            start += cnt
        keep = torch.cat(keep)
        return torch.stack((ni[keep], ci[keep], ri[keep]), dim=1)

    @staticmethod
    def symbolic(g, boxes, scores, max_per_class, iou_threshold, score_threshold):
        # scalars as 0-d constants: TensorRT's importer wants them 0-D, and a constant
        # max_output_boxes_per_class bounds the output allocation
        return g.op(
            "NonMaxSuppression", boxes, scores,
            g.op("Constant", value_t=torch.tensor(int(max_per_class), dtype=torch.int64)),
            g.op("Constant", value_t=torch.tensor(float(iou_threshold), dtype=torch.float32)),
            g.op("Constant", value_t=torch.tensor(float(score_threshold), dtype=torch.float32)),
            center_point_box_i=0,
        )


def non_max_suppression(boxes: torch.Tensor, scores: torch.Tensor, max_per_class: int,
                        iou_threshold: float, score_threshold: float) -> torch.Tensor:
    """ONNX ``NonMaxSuppression``: boxes [N, R, 4] XYXY shared by the classes of scores [N, C, R].

    Keeps candidates with score > ``score_threshold``, suppresses within each (n, c) those with
    IoU > ``iou_threshold`` to a higher-scored kept box, at most ``max_per_class`` per (n, c).
    Returns selected indices int64 [S, 3] as (n, c, r), in no guaranteed order.
    """
    return _NonMaxSuppression.apply(boxes, scores, int(max_per_class), float(iou_threshold),
                                    float(score_threshold))


class _RoiAlign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, boxes, batch_indices, output_size: int, spatial_scale: float,
                sampling_ratio: int, aligned: bool):
        rois = torch.cat([batch_indices.to(boxes.dtype)[:, None], boxes], dim=1)
        return torchvision.ops.roi_align(features, rois, (output_size, output_size),
                                         spatial_scale, sampling_ratio, aligned)

    @staticmethod
    def symbolic(g, features, boxes, batch_indices, output_size, spatial_scale, sampling_ratio,
                 aligned):
        # sampling_ratio is always written: TensorRT's importer defaults a missing one to 1
        return g.op(
            "RoiAlign", features, boxes, batch_indices,
            coordinate_transformation_mode_s="half_pixel" if aligned else "output_half_pixel",
            mode_s="avg", output_height_i=int(output_size), output_width_i=int(output_size),
            sampling_ratio_i=int(sampling_ratio), spatial_scale_f=float(spatial_scale),
        )


def roi_align(features: torch.Tensor, boxes: torch.Tensor, batch_indices: torch.Tensor,
              output_size: int, spatial_scale: float, sampling_ratio: int = 0,
              aligned: bool = True) -> torch.Tensor:
    """features [B, C, H, W], boxes [M, 4] XYXY image coords, batch_indices int64 [M]
    -> [M, C, output_size, output_size] (ONNX RoiAlign-16 / torchvision roi_align)."""
    return _RoiAlign.apply(features, boxes, batch_indices, int(output_size), float(spatial_scale),
                           int(sampling_ratio), bool(aligned))
