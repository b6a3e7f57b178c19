"""Parity: do two backends give the same detections? A comparator in Polygraphy's spirit.

``compare(reference, candidate, tolerances)`` judges one runner's outputs against another's,
both as returned by ``Runner.infer`` (the ONNX contract: ``num_detections [B]``, ``boxes
[B,K,4]``, ``scores [B,K]``, ``classes [B,K]``, optional ``masks [B,K,M,M]``).

Element by element in output order is the wrong test for detections: scores of different
detections can tie to 1e-6, so two correct backends list them in different orders, and the
top-K cut or the score threshold can take or leave a detection whose score sits on the
boundary. So detections are matched as sets per image (same class, box IoU >= a threshold,
greedily by reference score) and the per-output differences are measured on matched pairs.
A detection without a partner is excused only when its score lies within the score tolerance
of the other side's boundary (its lowest kept score when full, else the score threshold).
Outputs outside the contract are compared element-wise, as Polygraphy does.

Tolerances come per precision: ``fp32`` is tight and element-level (every matched pair's
box, score and mask within atol; at most 1% of detections unpaired, since a near-tie inside
the graph, e.g. at the RPN's per-level top-k, swaps a proposal and so a detection); ``tf32`` (TensorRT's default for fp32 engines on Ampere and
later) and ``fp16`` are judged at the detection level only: matched fraction, box IoU, score
difference, and AP on given annotations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.runner import Runner

DETECTION_KEYS = ("num_detections", "boxes", "scores", "classes")


@dataclass(frozen=True)
class Tolerances:
    """What counts as the same output for one precision.

    atol: per-output absolute tolerance on matched detections (boxes in input pixels);
    rtol: relative tolerance added to atol (|d| <= atol + rtol * |ref|), as numpy.isclose;
    elementwise: whether those per-output checks decide the verdict (else they are shown only);
    match_iou: the least box IoU for two same-class detections to be one detection;
    score_atol: the most a matched pair's scores may differ, and the boundary slack;
    min_matched: the least fraction of detections (either side) matched or excused;
    ap_atol: the most AP (0-1 scale, each LVIS stat) may differ when annotations are given.
    """

    precision: str
    atol: dict[str, float]
    rtol: float
    elementwise: bool
    match_iou: float
    score_atol: float
    min_matched: float
    ap_atol: float
    default_atol: float = 1e-4


# fp32 numbers: two fp32 implementations of the same graph agree to ~1e-6 relative per op;
# boxes are decoded with exp() and scaled by up to ~1000 px, masks go through 5 convs.
# min_matched < 1 even for fp32: discrete choices inside the graph flip on near-ties. Measured
# on d2_lvis_tiny img3: RPN level p2's 1000th and 1001st objectness logits differ by 1.2e-7,
# so ONNX Runtime keeps the other anchor, and one of 300 detections (score 0.91) differs from
# PyTorch (which equals detectron2 there). Paired detections must still agree tightly.
PRESETS: dict[str, Tolerances] = {
    "fp32": Tolerances("fp32", atol={"boxes": 1e-2, "scores": 1e-4, "masks": 1e-3}, rtol=1e-4,
                       elementwise=True, match_iou=0.99, score_atol=1e-4, min_matched=0.99,
                       ap_atol=1e-3),
    "tf32": Tolerances("tf32", atol={"boxes": 1.0, "scores": 1e-2, "masks": 5e-2}, rtol=1e-2,
                       elementwise=False, match_iou=0.9, score_atol=1e-2, min_matched=0.95,
                       ap_atol=5e-3),
    "fp16": Tolerances("fp16", atol={"boxes": 2.0, "scores": 2e-2, "masks": 1e-1}, rtol=2e-2,
                       elementwise=False, match_iou=0.8, score_atol=2e-2, min_matched=0.9,
                       ap_atol=1e-2),
}


def tolerances_for(precision: str, **overrides) -> Tolerances:
    """The preset for ``precision`` ('fp32', 'tf32', 'fp16'), with fields overridden."""
    if precision not in PRESETS:
        raise NorcalError(f"unknown precision {precision!r}; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[precision], **{k: v for k, v in overrides.items() if v is not None})


def runner_precision(runner: Runner) -> str:
    """The preset a runner's outputs are judged with: its ``precision`` attribute, else from its
    name ('...fp16' -> fp16; TensorRT fp32 engines -> tf32, TensorRT's default on Ampere+)."""
    explicit = getattr(runner, "precision", None)
    if explicit in PRESETS:
        return explicit
    name = getattr(runner, "name", "")
    if "fp16" in name or "int8" in name:
        return "fp16"
    if name.startswith("tensorrt") or "tensorrt" in name:
        return "tf32"
    return "fp32"


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class TensorDiff:
    """One output's differences. For detection outputs they are over matched pairs
    (``aligned``); ``raw_max_abs`` is the plain element-wise max in output order."""

    name: str
    shape: tuple
    max_abs: float
    mean_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool
    gating: bool
    aligned: bool = False
    raw_max_abs: float | None = None
    count: int = 0  # elements compared


@dataclass
class DetectionDiff:
    """Detection-level agreement over all images (reference vs candidate)."""

    images: int
    reference_count: int
    candidate_count: int
    matched: int
    excused: int  # unmatched, but on the top-K / score-threshold boundary
    unmatched_reference: int
    unmatched_candidate: int
    reordered: int  # matched pairs listed at different positions (score ties)
    min_iou: float
    mean_iou: float
    max_score_diff: float
    mean_score_diff: float
    max_box_diff: float

    @property
    def matched_fraction(self) -> float:
        """The share of detections paired or excused: 1 - unpaired / count (the larger side of each)."""
        total = max(self.reference_count, self.candidate_count)
        lone = max(self.unmatched_reference, self.unmatched_candidate)
        return 1.0 if total == 0 else 1.0 - lone / total


@dataclass
class ParityReport:
    """One candidate judged against the reference."""

    reference: str
    candidate: str
    tolerances: Tolerances
    tensors: list[TensorDiff]
    detections: DetectionDiff | None
    ap: dict[str, tuple[float, float]] = field(default_factory=dict)  # stat -> (reference, candidate)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def precision(self) -> str:
        return self.tolerances.precision


# ---------------------------------------------------------------------------------------------
# detection matching


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU [N, M] of boxes a [N, 4] and b [M, 4] (x0, y0, x1, y1)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    # two identical empty boxes (a degenerate detection clipped to the border) are the same box
    same = (union <= 0) & np.all(a[:, None, :] == b[None, :, :], axis=-1)
    return np.where(same, 1.0, iou)


def match_detections(ref_boxes, ref_scores, ref_classes, cand_boxes, cand_scores, cand_classes,
                     iou_threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pair one image's detections as sets: greedily in descending reference score, each
    reference detection takes the unpaired candidate of the same class with the highest
    IoU >= ``iou_threshold`` (equal IoU: the closer score).

    Returns (ref_index [P], cand_index [P], iou [P]).
    """
    nr, nc = len(ref_scores), len(cand_scores)
    if nr == 0 or nc == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0)
    iou = box_iou(ref_boxes, cand_boxes)
    iou[np.asarray(ref_classes)[:, None] != np.asarray(cand_classes)[None, :]] = -1.0
    sdiff = np.abs(np.asarray(ref_scores, np.float64)[:, None] - np.asarray(cand_scores, np.float64)[None, :])
    taken = np.zeros(nc, bool)
    ri, ci, ious = [], [], []
    for r in np.argsort(-np.asarray(ref_scores, np.float64), kind="stable"):
        row = np.where(taken | (iou[r] < iou_threshold), -np.inf, iou[r])
        best = row.max()
        if not np.isfinite(best):
            continue
        ties = np.flatnonzero(row == best)
        c = int(ties[np.argmin(sdiff[r, ties])])
        taken[c] = True
        ri.append(int(r))
        ci.append(c)
        ious.append(float(best))
    return np.array(ri, np.int64), np.array(ci, np.int64), np.array(ious)


def _boundary(scores: np.ndarray, n: int, capacity: int, score_thresh: float) -> float:
    """The score below which a detection may be missing: the lowest kept score when the
    image's K slots are full (the top-K cut), else the score threshold."""
    return float(scores[:n].min()) if n >= capacity and n > 0 else float(score_thresh)


def _diff_stats(ref: np.ndarray, cand: np.ndarray) -> tuple[float, float, float]:
    """(max |d|, mean |d|, max |d| / |ref|) of two equal-shape arrays (0s when empty)."""
    if ref.size == 0:
        return 0.0, 0.0, 0.0
    r = np.asarray(ref, np.float64)
    d = np.abs(np.asarray(cand, np.float64) - r)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(np.abs(r) > 0, d / np.abs(r), np.where(d > 0, np.inf, 0.0))
    return float(d.max()), float(d.mean()), float(rel.max())


def _within(ref: np.ndarray, cand: np.ndarray, atol: float, rtol: float) -> bool:
    """|cand - ref| <= atol + rtol * |ref| everywhere (NaN only where the reference has NaN)."""
    return bool(np.all(np.isclose(np.asarray(cand, np.float64), np.asarray(ref, np.float64),
                                  rtol=rtol, atol=atol, equal_nan=True)))


def _elementwise(name: str, ref: np.ndarray, cand: np.ndarray, tol: Tolerances,
                 gating: bool) -> TensorDiff:
    atol = tol.atol.get(name, tol.default_atol)
    if ref.shape != cand.shape:
        return TensorDiff(name, tuple(ref.shape), np.inf, np.inf, np.inf, atol, tol.rtol, False, gating,
                          count=0)
    mx, mean, rel = _diff_stats(ref, cand)
    return TensorDiff(name, tuple(ref.shape), mx, mean, rel, atol, tol.rtol,
                      _within(ref, cand, atol, tol.rtol), gating, raw_max_abs=mx, count=int(ref.size))


def _is_detection_output(out: dict) -> bool:
    return all(k in out for k in DETECTION_KEYS)


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
            tolerances: Tolerances | str = "fp32", *, reference_name: str = "reference",
            candidate_name: str = "candidate", score_thresh: float = 0.0) -> ParityReport:
    """Judge ``candidate``'s outputs against ``reference``'s (both ``Runner.infer`` dicts).

    Detection outputs (the ONNX contract) are matched per image as sets and compared on the
    matched pairs; other outputs element-wise. ``score_thresh`` is the model's test score
    threshold (a detection scoring within ``score_atol`` of it may be missing on one side).
    """
    tol = tolerances_for(tolerances) if isinstance(tolerances, str) else tolerances
    failures: list[str] = []
    missing = sorted(set(reference) ^ set(candidate))
    if missing:
        failures.append(f"outputs present on one side only: {', '.join(missing)}")
    names = [k for k in reference if k in candidate]
    tensors: list[TensorDiff] = []
    dets = None
    if _is_detection_output(reference) and _is_detection_output(candidate):
        dets, det_tensors, det_failures = _compare_detections(reference, candidate, tol, score_thresh)
        tensors.extend(det_tensors)
        failures.extend(det_failures)
        names = [k for k in names if k not in DETECTION_KEYS and k != "masks"]
    for k in names:
        d = _elementwise(k, np.asarray(reference[k]), np.asarray(candidate[k]), tol, gating=True)
        tensors.append(d)
        if not d.passed:
            failures.append(_tensor_failure(d))
    return ParityReport(reference_name, candidate_name, tol, tensors, dets, failures=failures)


def _tensor_failure(d: TensorDiff) -> str:
    if d.count == 0 and not np.isfinite(d.max_abs):
        return f"{d.name}: shapes differ"
    where = " (matched detections)" if d.aligned else ""
    return (f"{d.name}{where}: max |diff| {d.max_abs:.3g} > atol {d.atol:g} + rtol {d.rtol:g}"
            f" (mean {d.mean_abs:.3g})")


def _compare_detections(ref: dict, cand: dict, tol: Tolerances, score_thresh: float):
    failures: list[str] = []
    rn = np.asarray(ref["num_detections"]).reshape(-1).astype(np.int64)
    cn = np.asarray(cand["num_detections"]).reshape(-1).astype(np.int64)
    if rn.shape != cn.shape:
        return None, [], [f"batch sizes differ: {rn.size} vs {cn.size} images"]
    for side, out, counts in (("reference", ref, rn), ("candidate", cand, cn)):
        bad = sum(int(np.sum(~np.isfinite(np.asarray(out[k][b, :counts[b]], np.float64))))
                  for k in ("boxes", "scores") for b in range(counts.size))
        if bad:  # NaN pairs with nothing and hides from max(): say so outright
            failures.append(f"{side}: {bad} non-finite box/score values among its detections")
    cap_r, cap_c = ref["scores"].shape[1], cand["scores"].shape[1]
    has_masks = "masks" in ref and "masks" in cand
    pairs = {k: ([], []) for k in ("boxes", "scores", "masks")}
    totals = dict(matched=0, unm_r=0, unm_c=0, reordered=0)
    ious: list[np.ndarray] = []
    bad_images: list[int] = []
    excused = np.zeros(rn.size, np.int64)
    for b in range(rn.size):
        nr, nc = int(rn[b]), int(cn[b])
        rb, rs, rc = ref["boxes"][b, :nr], ref["scores"][b, :nr], ref["classes"][b, :nr]
        cb, cs, cc = cand["boxes"][b, :nc], cand["scores"][b, :nc], cand["classes"][b, :nc]
        ri, ci, iou = match_detections(rb, rs, rc, cb, cs, cc, tol.match_iou)
        ious.append(iou)
        totals["matched"] += len(ri)
        totals["reordered"] += int(np.sum(ri != ci))
        # a detection missing on the other side is excused when it sits on that side's boundary
        lone_r = np.setdiff1d(np.arange(nr), ri)
        lone_c = np.setdiff1d(np.arange(nc), ci)
        edge_c = _boundary(cand["scores"][b], nc, cap_c, score_thresh)
        edge_r = _boundary(ref["scores"][b], nr, cap_r, score_thresh)
        ok_r = rs[lone_r] <= edge_c + tol.score_atol
        ok_c = cs[lone_c] <= edge_r + tol.score_atol
        # one boundary detection usually swaps for another: count the pair once
        excused[b] = max(int(ok_r.sum()), int(ok_c.sum()))
        totals["unm_r"] += int((~ok_r).sum())
        totals["unm_c"] += int((~ok_c).sum())
        if (~ok_r).any() or (~ok_c).any():
            bad_images.append(b)
        pairs["boxes"][0].append(rb[ri])
        pairs["boxes"][1].append(cb[ci])
        pairs["scores"][0].append(rs[ri])
        pairs["scores"][1].append(cs[ci])
        if has_masks:
            pairs["masks"][0].append(ref["masks"][b, ri])
            pairs["masks"][1].append(cand["masks"][b, ci])
    cat = {k: (np.concatenate(v[0]) if v[0] else np.zeros(0), np.concatenate(v[1]) if v[1] else np.zeros(0))
           for k, v in pairs.items()}
    all_iou = np.concatenate(ious) if ious else np.zeros(0)
    score_d = np.abs(cat["scores"][0].astype(np.float64) - cat["scores"][1])
    box_d = np.abs(cat["boxes"][0].astype(np.float64) - cat["boxes"][1])
    dd = DetectionDiff(
        images=int(rn.size), reference_count=int(rn.sum()), candidate_count=int(cn.sum()),
        matched=totals["matched"], excused=int(excused.sum()), unmatched_reference=totals["unm_r"],
        unmatched_candidate=totals["unm_c"], reordered=totals["reordered"],
        min_iou=float(all_iou.min()) if all_iou.size else 1.0,
        mean_iou=float(all_iou.mean()) if all_iou.size else 1.0,
        max_score_diff=float(score_d.max()) if score_d.size else 0.0,
        mean_score_diff=float(score_d.mean()) if score_d.size else 0.0,
        max_box_diff=float(box_d.max()) if box_d.size else 0.0,
    )
    if dd.matched_fraction < tol.min_matched:
        failures.append(f"detections: {dd.matched_fraction:.1%} matched (IoU >= {tol.match_iou:g}, same class), "
                        f"need {tol.min_matched:.0%}: {dd.unmatched_reference} reference and "
                        f"{dd.unmatched_candidate} candidate detections unpaired"
                        + (f" in images {', '.join(map(str, bad_images[:8]))}" if bad_images else ""))
    if dd.max_score_diff > tol.score_atol and not tol.elementwise:  # else the scores row says it
        failures.append(f"detections: matched scores differ by up to {dd.max_score_diff:.3g} "
                        f"> {tol.score_atol:g}")
    # per-output rows on the matched pairs (the element-level view, robust to reordering)
    tensors = []
    count_diff = np.abs(rn - cn)
    # shown, not judged: a count differs exactly by the unpaired detections, which the matched
    # fraction above already judges ("ok" when boundary detections explain the difference)
    explained = count_diff <= excused
    tensors.append(TensorDiff("num_detections", tuple(np.shape(ref["num_detections"])),
                              float(count_diff.max(initial=0)), float(count_diff.mean()), 0.0, 0.0, 0.0,
                              bool(explained.all()), False,
                              raw_max_abs=float(count_diff.max(initial=0)), count=int(rn.size)))
    names = ["boxes", "scores", "classes"] + (["masks"] if has_masks else [])
    for name in names:
        raw = None
        if ref[name].shape == cand[name].shape:
            raw = float(np.abs(np.asarray(ref[name], np.float64) - cand[name]).max(initial=0))
        if name == "classes":  # equal by construction of the matching; unmatched are counted above
            tensors.append(TensorDiff(name, tuple(ref[name].shape), 0.0, 0.0, 0.0, 0.0, 0.0, True,
                                      False, aligned=True, raw_max_abs=raw, count=dd.matched))
            continue
        r, c = cat[name]
        atol = tol.atol.get(name, tol.default_atol)
        mx, mean, rel = _diff_stats(r, c)
        tensors.append(TensorDiff(name, tuple(ref[name].shape), mx, mean, rel, atol, tol.rtol,
                                  _within(r, c, atol, tol.rtol), tol.elementwise, aligned=True,
                                  raw_max_abs=raw, count=int(r.size)))
    for d in tensors:
        if d.gating and not d.passed:
            failures.append(_tensor_failure(d))
    return dd, tensors, failures


# ---------------------------------------------------------------------------------------------
# running runners side by side


@dataclass
class ParityRun:
    """What :func:`run_parity` gives: every runner's concatenated outputs, its time, the
    reports (reference vs each other runner), and AP per runner when annotations were given."""

    names: list[str]
    outputs: dict[str, dict[str, np.ndarray]]
    seconds: dict[str, float]
    reports: list[ParityReport]
    images: int
    ap: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.reports)


def _concat(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not chunks:
        return {}
    out = {}
    for k in chunks[0]:
        try:
            out[k] = np.concatenate([c[k] for c in chunks], axis=0)
        except ValueError:
            raise NorcalError(f"output {k!r} changes shape between batches; cannot compare it") from None
    return out


def _only_images(gt, image_ids):
    """An annotation file or dict cut down to ``image_ids``: AP over the images that were run,
    not over a whole validation set most of which was never seen (a prepared LvisGT is kept)."""
    from pathlib import Path

    from norcal.core.fileio import read_json

    if isinstance(gt, (str, Path)):
        gt = read_json(gt, "annotations")
    if not isinstance(gt, dict) or "images" not in gt:
        return gt
    keep = set(image_ids)
    out = dict(gt)
    out["images"] = [im for im in gt["images"] if im.get("id") in keep]
    out["annotations"] = [a for a in gt.get("annotations", []) if a.get("image_id") in keep]
    return out


def _ap(outputs, batches, gt, image_ids, category_ids) -> dict[str, float]:
    """LVIS box AP of one runner's outputs (norcal.evaluation)."""
    from norcal.evaluation import evaluate
    from norcal.runtime.postprocess import split_outputs
    from norcal.runtime.results import detections_to_results

    results = []
    start = 0
    for sizes, originals in batches:
        n = len(sizes)
        part = {k: v[start:start + n] for k, v in outputs.items()}
        for i, det in enumerate(split_outputs(part, sizes, originals)):
            results.extend(detections_to_results(image_ids[start + i], det, category_ids, with_masks=False))
        start += n
    if not results:
        return {}
    return dict(evaluate(gt, results, iou_type="bbox").stats)


def _fit_shape(feeds: dict[str, np.ndarray], fixed) -> dict[str, np.ndarray]:
    """Feeds grown to a fixed (B, H, W): repeat the last image, zero-pad H and W."""
    if not fixed:
        return feeds
    b, h, w = fixed
    images, sizes = feeds["images"], feeds["image_sizes"]
    if b and len(images) < b:
        extra = b - len(images)
        images = np.concatenate([images, np.repeat(images[-1:], extra, 0)])
        sizes = np.concatenate([sizes, np.repeat(sizes[-1:], extra, 0)])
    H, W = images.shape[2], images.shape[3]
    if (h and H > h) or (w and W > w):
        raise NorcalError(f"a resized image ({H}x{W} padded) does not fit the model's fixed input "
                          f"{h or H}x{w or W}")
    if (h and H < h) or (w and W < w):
        grown = np.zeros(images.shape[:2] + (h or H, w or W), images.dtype)
        grown[:, :, :H, :W] = images
        images = grown
    return {"images": images, "image_sizes": sizes}


def run_parity(runners: Sequence[Runner], images_rgb: Sequence[np.ndarray], *, min_size: int, max_size: int,
               input_format: str = "BGR", divisibility: int = 32, batch_size: int = 1,
               tolerances: dict[str, Tolerances] | None = None, score_thresh: float = 0.0,
               gt=None, image_ids: Sequence | None = None, category_ids: list[int] | None = None,
               fixed_shape: tuple[int | None, int | None, int | None] | None = None,
               on_batch: Callable[[str, int], None] | None = None) -> ParityRun:
    """Feed the same prepared batches to every runner; compare runners[0] with each other one.

    images_rgb: RGB uint8 [H,W,3] arrays. tolerances: runner name -> Tolerances (default: the
    preset :func:`runner_precision` picks). gt (an LVIS/COCO annotation path or a prepared
    LvisGT) with ``image_ids`` (one per image) adds box AP per runner, judged by ``ap_atol``.
    fixed_shape: (B, H, W) of a model exported with fixed dimensions (None where dynamic):
    a short last batch is filled by repeating its last image (those outputs are dropped) and
    images are zero-padded to H x W, for every runner alike.
    ``on_batch(runner_name, images_done)`` is called after each batch (progress bars).
    """
    from norcal.runtime.preprocess import prepare_batch

    if len(runners) < 2:
        raise NorcalError("parity needs at least two runners")
    names = [r.name for r in runners]
    if len(set(names)) != len(names):
        raise NorcalError(f"runner names must differ to tell them apart: {', '.join(names)}")
    if batch_size < 1:
        raise NorcalError(f"batch size must be >= 1, got {batch_size}")
    if not images_rgb:
        raise NorcalError("parity needs at least one image")
    if gt is not None and (image_ids is None or len(image_ids) != len(images_rgb)):
        raise NorcalError("AP needs one image id per image")
    chunks: dict[str, list] = {n: [] for n in names}
    seconds = {n: 0.0 for n in names}
    batches = []
    if fixed_shape and fixed_shape[0]:
        batch_size = int(fixed_shape[0])
    for s in range(0, len(images_rgb), batch_size):
        part = list(images_rgb[s:s + batch_size])
        n = len(part)
        batch = prepare_batch(part, min_size, max_size, input_format, divisibility)
        batches.append((batch.image_sizes, batch.original_sizes))
        feeds = _fit_shape(batch.feeds(), fixed_shape)
        for r in runners:
            t0 = time.perf_counter()
            # copies: a runner must not see another's in-place changes to the feeds
            out = r.infer({k: v.copy() for k, v in feeds.items()})
            seconds[r.name] += time.perf_counter() - t0
            chunks[r.name].append({k: np.asarray(v)[:n] for k, v in out.items()})
            if on_batch:
                on_batch(r.name, s + len(batch))
    outputs = {n: _concat(c) for n, c in chunks.items()}
    ref = names[0]
    ap = {}
    if gt is not None:
        from norcal.evaluation import prepare_gt

        gt = prepare_gt(_only_images(gt, image_ids))
        ap = {n: _ap(outputs[n], batches, gt, list(image_ids), category_ids) for n in names}
    reports = []
    for r in runners[1:]:
        tol = (tolerances or {}).get(r.name) or PRESETS[runner_precision(r)]
        rep = compare(outputs[ref], outputs[r.name], tol, reference_name=ref, candidate_name=r.name,
                      score_thresh=score_thresh)
        if ap:
            for k in ("AP", "APr", "APc", "APf"):
                a, b = ap[ref].get(k, -1.0), ap[r.name].get(k, -1.0)
                rep.ap[k] = (a, b)
                if a >= 0 and b >= 0 and abs(a - b) > tol.ap_atol:
                    rep.failures.append(f"{k}: {a:.4f} vs {b:.4f}, differs by {abs(a - b):.4f} > {tol.ap_atol:g}")
        reports.append(rep)
    return ParityRun(names, outputs, seconds, reports, len(images_rgb), ap)


# ---------------------------------------------------------------------------------------------
# inputs and presentation


def synthetic_images(n: int = 3, seed: int = 0) -> list[np.ndarray]:
    """``n`` RGB uint8 test images of varied sizes: a smooth background with a few solid
    rectangles and discs, so a detector fires on object-like shapes. Deterministic per seed."""
    rng = np.random.default_rng(seed)
    sizes = [(480, 640), (600, 400), (512, 512), (375, 500), (427, 640)]
    out = []
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = rng.uniform(40, 215, 3).astype(np.float32)
        img = base + 30 * np.stack([np.sin(xx / (40 + 10 * c) + c) * np.cos(yy / 57.0) for c in range(3)], -1)
        for _ in range(int(rng.integers(3, 7))):
            color = rng.uniform(0, 255, 3)
            y0, x0 = int(rng.integers(0, h - 40)), int(rng.integers(0, w - 40))
            bh, bw = int(rng.integers(30, max(31, h // 2))), int(rng.integers(30, max(31, w // 2)))
            if rng.random() < 0.5:
                img[y0:y0 + bh, x0:x0 + bw] = color
            else:
                cy, cx, r = y0 + bh / 2, x0 + bw / 2, min(bh, bw) / 2
                img[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = color
        img += rng.normal(0, 4, img.shape)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out


def _g(v: float | None) -> str:
    return "-" if v is None else ("inf" if not np.isfinite(v) else f"{v:.2g}")


def render_tables(run: ParityRun) -> list:
    """Rich tables for a :class:`ParityRun`: per comparison, one row per output (differences
    over matched detections, and the naive in-order max), then the detection-level agreement,
    then AP when annotations were given."""
    from rich import box
    from rich.table import Table

    tables = []
    times = ", ".join(f"{n} {run.seconds[n]:.2f} s" for n in run.names)
    for rep in run.reports:
        tol = rep.tolerances
        level = "element + detection level" if tol.elementwise else "detection level only"
        t = Table(title=f"{rep.candidate} vs {rep.reference}: {tol.precision}, {level}",
                  caption=f"{run.images} images; |d| over paired detections, 'in order' the naive "
                          f"element-wise max; tolerance atol + {tol.rtol:g} x |ref|; ok/over: shown, "
                          f"not judged; {times}",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        for col, just in (("output", "left"), ("shape", "left"), ("max |d|", "right"),
                          ("mean |d|", "right"), ("in order", "right"), ("atol", "right"), ("result", "left")):
            t.add_column(col, justify=just, no_wrap=True, min_width=len(col))
        for d in rep.tensors:
            if d.name == "classes" and d.aligned:
                tolerance, result = "same", "pass"
            else:
                tolerance = "edge" if d.name == "num_detections" else f"{d.atol:g}"
                result = ("pass" if d.passed else "FAIL") if d.gating else ("ok" if d.passed else "over")
            colour = "green" if result.startswith(("pass", "ok")) else ("red" if result == "FAIL" else "yellow")
            t.add_row(d.name, "x".join(map(str, d.shape)), _g(d.max_abs), _g(d.mean_abs),
                      _g(d.raw_max_abs), tolerance, f"[{colour}]{result}[/{colour}]")
        tables.append(t)
        det = rep.detections
        if det is not None:
            dt = Table(title="detections paired as sets (same class, box IoU)",
                       caption=f"need >= {tol.min_matched:.0%} paired or on the boundary, IoU >= "
                               f"{tol.match_iou:g}, score |d| <= {tol.score_atol:g}",
                       box=box.SIMPLE_HEAD, pad_edge=False)
            for col in ("ref", "cand", "paired", "boundary", "lone r/c", "reordered", "IoU min",
                        "score |d| max"):
                dt.add_column(col, justify="right")
            dt.add_row(str(det.reference_count), str(det.candidate_count),
                       f"{det.matched} ({det.matched_fraction:.1%})", str(det.excused),
                       f"{det.unmatched_reference}/{det.unmatched_candidate}", str(det.reordered),
                       f"{det.min_iou:.4f}", _g(det.max_score_diff))
            tables.append(dt)
        if rep.ap:
            at = Table(title="box AP on the given annotations", caption=f"tolerance {tol.ap_atol:g}",
                       box=box.SIMPLE_HEAD, pad_edge=False)
            for col in ("metric", rep.reference, rep.candidate, "|d|"):
                at.add_column(col, justify="right")
            for k, (a, b) in rep.ap.items():
                at.add_row(k, f"{a:.4f}", f"{b:.4f}", f"{abs(a - b):.4f}" if a >= 0 and b >= 0 else "-")
            tables.append(at)
    return tables


def verdict_lines(run: ParityRun) -> list[str]:
    """One line per comparison: PASS, or FAIL with each failed check and its numbers."""
    lines = []
    for rep in run.reports:
        head = f"{rep.candidate} vs {rep.reference} ({rep.precision})"
        if rep.passed:
            lines.append(f"PASS  {head}")
        else:
            lines.append(f"FAIL  {head}: " + "; ".join(rep.failures))
    return lines


def report_json(run: ParityRun) -> dict:
    """The comparison results as plain JSON-able data (no outputs)."""
    from dataclasses import asdict

    def clean(v):
        if isinstance(v, float) and not np.isfinite(v):
            return str(v)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return clean({
        "images": run.images, "runners": run.names, "seconds": run.seconds, "passed": run.passed,
        "ap": run.ap,
        "comparisons": [{"reference": r.reference, "candidate": r.candidate, "passed": r.passed,
                         "tolerances": asdict(r.tolerances), "failures": r.failures,
                         "outputs": [asdict(d) for d in r.tensors],
                         "detections": asdict(r.detections) if r.detections else None,
                         "ap": {k: list(v) for k, v in r.ap.items()}} for r in run.reports],
    })


def fixed_input_shape(runner: Runner) -> tuple[int | None, int | None, int | None] | None:
    """(B, H, W) of an ONNX Runtime runner's ``images`` input where fixed (None where dynamic);
    None when all are dynamic or the runner does not say."""
    session = getattr(runner, "session", None)
    if session is None:
        return None
    dims = next((i.shape for i in session.get_inputs() if i.name == "images"), None)
    if not dims or len(dims) != 4:
        return None
    fixed = tuple(d if isinstance(d, int) and d > 0 else None for d in (dims[0], dims[2], dims[3]))
    return fixed if any(fixed) else None
