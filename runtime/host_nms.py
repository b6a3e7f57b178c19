"""The NMS of a graph exported with ``nms="host"`` (:mod:`norcal.core.decoding`), run on the host.

The graph ends at the calibrated candidates: a YOLO's every anchor (``candidate_boxes`` [B, A, 4]
in letterboxed-input pixels, ``candidate_scores`` [B, A, C], for segment models ``candidate_coefs``
and ``mask_protos``), a RetinaNet's levels' top (anchor, class) pairs (boxes [B, R, 4], scores
[B, R], ``candidate_classes`` [B, R]). :func:`select` makes the contract's outputs from them exactly
as the in-graph selection does (``export/families/ultralytics/yolo_graph.py``,
``export/rcnn/modeling/retinanet.py``), so the two give the same kept boxes, order, scores and
classes:

- the rows NMS runs over: every (class, anchor) (multi-label), each anchor's best class
  (best-class: the first of equal maxima, as ArgMax) or each RetinaNet candidate's class placed
  in its class row, or one row of best scores (best-class, ``agnostic_nms``);
- per row, ONNX Runtime's NonMaxSuppression: candidates with score > threshold, taken by
  score, ties by lower anchor, one suppressed when its IoU with a kept one is > the IoU
  threshold (IoU in float32 as ONNX Runtime computes it; boxes of no area suppress nothing),
  at most K kept per row;
- the kept scores laid out [rows x anchors] and the top K taken (ties by lower index, as ONNX
  TopK); slots with no detection are zeros; boxes less the letterbox's centring offset (a
  letterboxed input's only).

:class:`HostNmsRunner` wraps a runner of such a graph so that it gives the contract's outputs;
:func:`with_host_nms` applies it where the model's metadata says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from norcal.core import contract
from norcal.core.decoding import recorded_decoding
from norcal.core.errors import NorcalError


@dataclass(frozen=True)
class HostSelection:
    """What the in-graph selection was exported with (``norcal.detector``): the label rule,
    class-agnostic NMS, the score and IoU thresholds, K; the class count and whether the input
    is letterboxed (its offset then removed)."""

    best_class: bool
    agnostic: bool
    score_thresh: float
    iou: float
    topk: int
    num_classes: int
    letterbox: bool  # the image centred in a padded square (the rule's ``pads``): boxes less its offset

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> "HostSelection":
        decoding = recorded_decoding(meta)
        settings = json.loads(meta[contract.DETECTOR])
        try:
            return cls(decoding.best_class, decoding.agnostic_nms, float(settings["score_thresh_test"]),
                       float(settings["nms_thresh_test"]), int(settings["detections_per_image"]),
                       int(meta[contract.NUM_CLASSES]), contract.resize_rule(meta.get(contract.RESIZE)).pads)
        except (KeyError, TypeError, ValueError) as e:
            raise NorcalError(f"metadata {contract.DETECTOR}: a host-NMS model must record score_thresh_test, "
                              f"nms_thresh_test and detections_per_image ({e})") from None


def _suppressed_by(box: np.ndarray, others: np.ndarray, iou: np.float32) -> np.ndarray:
    """Which of ``others`` [N, 4] have IoU > ``iou`` with ``box``, in float32 and in ONNX
    Runtime's order of operations (SuppressByIOU); no-area boxes suppress nothing."""
    lo0, hi0 = np.minimum(box[0], box[2]), np.maximum(box[0], box[2])
    lo1, hi1 = np.minimum(box[1], box[3]), np.maximum(box[1], box[3])
    olo0, ohi0 = np.minimum(others[:, 0], others[:, 2]), np.maximum(others[:, 0], others[:, 2])
    olo1, ohi1 = np.minimum(others[:, 1], others[:, 3]), np.maximum(others[:, 1], others[:, 3])
    zero = np.float32(0)
    inter = (np.maximum(np.minimum(hi1, ohi1) - np.maximum(lo1, olo1), zero)
             * np.maximum(np.minimum(hi0, ohi0) - np.maximum(lo0, olo0), zero))
    area = (hi1 - lo1) * (hi0 - lo0)
    other_area = (ohi1 - olo1) * (ohi0 - olo0)
    union = area + other_area - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        over = inter / union > iou
    return over & (inter > zero) & (area > zero) & (other_area > zero) & (union > zero)


def nms_row(boxes: np.ndarray, scores: np.ndarray, score_thresh: float, iou: float, limit: int) -> np.ndarray:
    """ONNX Runtime's NonMaxSuppression for one (batch, class) row: the kept anchors, in the
    order it emits them (by score, ties by lower anchor)."""
    cand = np.flatnonzero(scores > np.float32(score_thresh))
    order = cand[np.argsort(-scores[cand], kind="stable")]
    kept: list[int] = []
    alive = np.ones(len(order), dtype=bool)
    thr = np.float32(iou)
    for i in range(len(order)):
        if not alive[i]:
            continue
        kept.append(int(order[i]))
        if len(kept) == limit:
            break
        rest = order[i + 1:]
        alive[i + 1:] &= ~_suppressed_by(boxes[order[i]], boxes[rest], thr)
    return np.asarray(kept, dtype=np.int64)


def _rows(scores: np.ndarray, rule: HostSelection, classes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(dense [R, A] the scores NMS runs over per row, label [A] each anchor's class) of one image;
    ``classes``: a RetinaNet's candidate classes (``scores`` then [A])."""
    if classes is not None:
        dense = np.zeros((rule.num_classes, scores.shape[0]), dtype=scores.dtype)
        dense[classes, np.arange(scores.shape[0])] = scores
        return dense, classes
    if not rule.best_class:
        return scores.T, np.zeros(scores.shape[0], dtype=np.int64)
    conf, label = scores.max(axis=1), scores.argmax(axis=1)
    if rule.agnostic:
        return conf[None, :], label
    dense = np.zeros(scores.shape[::-1], dtype=scores.dtype)
    dense[label, np.arange(scores.shape[0])] = conf
    return dense, label


def select_image(boxes: np.ndarray, scores: np.ndarray, rule: HostSelection, classes: np.ndarray | None = None):
    """(scores [K], classes [K], anchors [K]) of one image, zeros in the unused slots."""
    dense, label = _rows(scores, rule, classes)
    r, a = dense.shape
    kept = np.zeros(r * a, dtype=dense.dtype)
    for row in range(r):
        anchors = nms_row(boxes, dense[row], rule.score_thresh, rule.iou, rule.topk)
        kept[row * a + anchors] = dense[row, anchors]
    k = min(rule.topk, r * a)
    idx = np.argsort(-kept, kind="stable")[:k]  # ONNX TopK: ties by lower index
    top, row, anchor = kept[idx], idx // a, idx % a
    cls = label[anchor] if rule.agnostic else row
    pad = rule.topk - k
    return tuple(np.pad(x, (0, pad)) for x in (top, cls.astype(np.int64), anchor.astype(np.int64)))


def select(outputs: dict[str, np.ndarray], image_sizes: np.ndarray, input_hw: tuple[int, int],
           rule: HostSelection) -> dict[str, np.ndarray]:
    """The contract's outputs (num_detections, boxes, scores, classes; masks and mask_protos for
    segment models) from a host-NMS graph's ``outputs`` for a batch of ``image_sizes`` [B, 2]
    letterboxed into the ``input_hw`` square."""
    boxes, scores = outputs[contract.CANDIDATE_BOXES], outputs[contract.CANDIDATE_SCORES]
    classes = outputs.get(contract.CANDIDATE_CLASSES)
    b = boxes.shape[0]
    picks = [select_image(boxes[i], scores[i], rule, None if classes is None else classes[i]) for i in range(b)]
    top = np.stack([p[0] for p in picks]).astype(np.float32)
    cls, anchor = np.stack([p[1] for p in picks]), np.stack([p[2] for p in picks])
    keep = top > 0
    keep_f = keep.astype(np.float32)
    det = np.take_along_axis(boxes, anchor[:, :, None], axis=1)
    if rule.letterbox:
        det = det - _letterbox_offset(image_sizes, input_hw)
    out = {"num_detections": keep.sum(axis=1).astype(np.int64), "boxes": det * keep_f[..., None],
           "scores": top * keep_f, "classes": cls * keep.astype(np.int64)}
    if contract.CANDIDATE_COEFS in outputs:
        coefs = outputs[contract.CANDIDATE_COEFS]
        co = np.take_along_axis(coefs, anchor[:, :, None], axis=1)
        out |= {"masks": co * keep_f[..., None], contract.MASK_PROTOS: outputs[contract.MASK_PROTOS]}
    return out


def _letterbox_offset(image_sizes: np.ndarray, input_hw: tuple[int, int]) -> np.ndarray:
    """[B, 1, 4] the centring offset of each image in the letterboxed square, in float32 as the graph."""
    sizes = np.asarray(image_sizes).astype(np.float32)
    h, w = (np.float32(s) for s in input_hw)
    top_pad, left_pad = np.floor((h - sizes[:, 0]) / 2), np.floor((w - sizes[:, 1]) / 2)
    return np.stack([left_pad, top_pad, left_pad, top_pad], axis=1)[:, None, :].astype(np.float32)


class HostNmsRunner:
    """A runner of a host-NMS graph that gives the contract's outputs: the wrapped runner's
    candidates through :func:`select`. Everything else is the wrapped runner's."""

    def __init__(self, runner):
        self.runner = runner
        self.rule = HostSelection.from_metadata(runner.metadata)
        self.input_names = list(contract.INPUT_NAMES)
        has_masks = contract.CANDIDATE_COEFS in runner.output_names
        self.output_names = [n for n in contract.OUTPUT_NAMES if n != "masks" or has_masks] + (
            [contract.MASK_PROTOS] if has_masks else [])

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise NorcalError(f"missing inputs {', '.join(missing)}")
        return select(self.runner.infer(feeds), feeds["image_sizes"], tuple(np.shape(feeds["images"])[2:]), self.rule)


def with_host_nms(runner):
    """``runner`` wrapped in :class:`HostNmsRunner` when its model records ``nms: host``."""
    meta = getattr(runner, "metadata", None) or {}
    return HostNmsRunner(runner) if recorded_decoding(meta).host_nms else runner
