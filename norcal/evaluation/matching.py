"""IoU and LVIS's greedy detection-to-GT matching, vectorised over (image, category) groups.

lvis-api matches each (image, category, area range, IoU threshold) with Python loops. The
rule it implements: detections in descending score take, among GTs not yet matched with
IoU >= threshold, the one with the highest IoU, preferring GTs that are not ignored in
this area range; ties go to the later GT in file order. Here one numpy step handles the
r-th detection of every group at once, for all area ranges and thresholds together.
"""

from __future__ import annotations

import numpy as np

from norcal.core.boxes import box_iou_paired

IOU_THRS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)
REC_THRS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)
# area ranges, in order: all, small, medium, large
AREA_RNGS = np.array([[0.0, 1e5 ** 2], [0.0, 32.0 ** 2], [32.0 ** 2, 96.0 ** 2], [96.0 ** 2, 1e5 ** 2]])


def pair_ious(ng: np.ndarray, gstart: np.ndarray, dt_boxes, gt_boxes, dt_rles=None, gt_rles=None,
              group_start=None, group_len=None, gt_crowd=None):
    """IoUs of each detection with every GT of its group, flat, detection-major.

    ng / gstart: [N] per detection, its group's GT count and first GT index (GT sorted by
    group). gt_crowd: [G] bool or None; a crowd GT's IoU is the intersection over the
    detection's area (pycocotools' iscrowd). Returns (iou [P], pair_offset [N]) with
    P = sum(ng); detection i's IoUs are iou[pair_offset[i] : pair_offset[i] + ng[i]].
    """
    off = np.zeros(len(ng), dtype=np.int64)
    np.cumsum(ng[:-1], out=off[1:])
    total = int(ng.sum())
    if dt_rles is None:
        dt_of = np.repeat(np.arange(len(ng)), ng)
        gt_of = np.repeat(gstart - off, ng) + np.arange(total)
        iou = box_iou_paired(dt_boxes[dt_of], gt_boxes[gt_of], "xywh")
        if gt_crowd is not None and gt_crowd[gt_of].any():
            c = np.flatnonzero(gt_crowd[gt_of])
            iou[c] = _over_detection(dt_boxes[dt_of[c]], gt_boxes[gt_of[c]])
        return iou, off
    import pycocotools.mask as mask_utils

    iou = np.zeros(total, dtype=np.float64)
    for s, n in zip(group_start, group_len):  # one C call per (image, category) group
        m = int(ng[s])
        if m == 0:
            continue
        g0 = int(gstart[s])
        crowd = [0] * m if gt_crowd is None else [int(c) for c in gt_crowd[g0:g0 + m]]
        block = mask_utils.iou(dt_rles[s:s + n], gt_rles[g0:g0 + m], crowd)
        iou[off[s]:off[s] + n * m] = np.asarray(block, dtype=np.float64).reshape(-1)
    return iou, off


def _over_detection(dt: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Intersection over the detection's area of paired xywh boxes, as pycocotools' bbIou
    computes a crowd GT's IoU (the same float operations)."""
    wh = np.minimum(dt[:, 2:] + dt[:, :2], gt[:, 2:] + gt[:, :2]) - np.maximum(dt[:, :2], gt[:, :2])
    inter = np.where((wh > 0).all(axis=1), wh[:, 0] * wh[:, 1], 0.0)
    area = dt[:, 2] * dt[:, 3]
    return np.where(inter > 0, inter / np.where(area > 0, area, 1.0), 0.0)


def greedy_match(iou, off, ng, gstart, group_start, group_len, gt_ignore, gt_reusable=None):
    """LVIS / COCO matching for all groups, area ranges and IoU thresholds.

    gt_ignore: [A, G] bool, GT ignored in area range a. gt_reusable: [G] bool or None, GTs
    that stay free after a match (pycocotools' crowd GTs). Detections are sorted by group,
    then descending score. Returns (matched [A, T, N], matched_ignored [A, T, N]): the
    detection matched a GT / matched a GT that is ignored in that area range.
    """
    n = len(ng)
    a_n, t_n = gt_ignore.shape[0], len(IOU_THRS)
    matched = np.zeros((a_n, t_n, n), dtype=bool)
    matched_ign = np.zeros((a_n, t_n, n), dtype=bool)
    group_ng = ng[group_start]

    # one GT: the first detection (by score) over each threshold takes it
    one = group_ng == 1
    if one.any():
        sel = np.repeat(one, group_len)
        idx = np.flatnonzero(sel)
        hit = iou[off[idx]][None, :] >= IOU_THRS[:, None]  # [T, n1]
        csum = np.cumsum(hit, axis=1)
        starts = group_start[one]
        first_pos = np.searchsorted(idx, starts)
        # hits before each group's first detection, to make the running count per group
        base = np.where(first_pos > 0, csum[:, np.maximum(first_pos - 1, 0)], 0)
        base_per = np.repeat(base, group_len[one], axis=1)
        take = hit & (csum - base_per == 1)
        if gt_reusable is not None:  # a crowd GT matches every detection over the threshold
            take |= hit & gt_reusable[gstart[idx]][None, :]
        g_ign = gt_ignore[:, gstart[idx]]  # [A, n1]
        matched[:, :, idx] = take[None]
        matched_ign[:, :, idx] = take[None] & g_ign[:, None, :]

    # several GTs: sequential in score order, vectorised across groups of similar GT count
    many = np.flatnonzero(group_ng >= 2)
    if many.size:
        buckets = np.ceil(np.log2(group_ng[many])).astype(np.int64)
        for b in np.unique(buckets):
            gsel = many[buckets == b]
            gsel = gsel[np.argsort(-group_len[gsel], kind="stable")]
            _match_bucket(iou, off, gstart, group_start[gsel], group_len[gsel], group_ng[gsel],
                          1 << int(b), gt_ignore, matched, matched_ign, gt_reusable)
    return matched, matched_ign


def _match_bucket(iou, off, gstart, dstart, nd, ngr, gmax, gt_ignore, matched, matched_ign, gt_reusable):
    cols = np.arange(gmax)
    valid = cols[None, :] < ngr[:, None]  # [B, gmax]
    gi = np.minimum(gstart[dstart][:, None] + cols[None, :], gt_ignore.shape[1] - 1)
    reusable = None if gt_reusable is None else (gt_reusable[gi] & valid)[:, None, None, :]
    gign = np.transpose(gt_ignore[:, gi], (1, 0, 2)) & valid[:, None, :]  # [B, A, gmax]
    bonus = 2.0 * (~gign & valid[:, None, :])  # prefer GTs not ignored in this area range
    taken = np.zeros((len(nd), gt_ignore.shape[0], len(IOU_THRS), gmax), dtype=bool)
    thr = IOU_THRS[None, None, :, None]
    active = len(nd)
    for r in range(int(nd[0])):
        while nd[active - 1] <= r:
            active -= 1
        dpos = dstart[:active] + r
        rows = iou[np.minimum(off[dpos][:, None] + cols[None, :], len(iou) - 1)]
        rows = np.where(valid[:active], rows, -1.0)[:, None, None, :]  # [k, 1, 1, gmax]
        cand = (rows >= thr) & ~taken[:active]
        key = np.where(cand, rows + bonus[:active, :, None, :], -1.0)  # [k, A, T, gmax]
        j = gmax - 1 - np.argmax(key[..., ::-1], axis=-1)  # ties: the later GT, as lvis-api
        best = np.take_along_axis(key, j[..., None], axis=-1)[..., 0]
        hit = best > -0.5
        k_idx, a_idx, t_idx = np.nonzero(hit)
        taken[k_idx, a_idx, t_idx, j[k_idx, a_idx, t_idx]] = True
        if reusable is not None:
            taken[:active] &= ~reusable[:active]
        ign = np.take_along_axis(np.broadcast_to(gign[:active, :, None, :], key.shape),
                                 j[..., None], axis=-1)[..., 0]
        matched[:, :, dpos] = np.transpose(hit, (1, 2, 0))
        matched_ign[:, :, dpos] = np.transpose(hit & ign, (1, 2, 0))
