"""One candidate's outputs judged against the reference's: detections matched as sets per
image and compared on the matched pairs, other outputs element-wise (see the package doc)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from norcal.workflows.parity.matching import match_detections
from norcal.workflows.parity.tolerances import Tolerances, tolerances_for

DETECTION_KEYS = ("num_detections", "boxes", "scores", "classes")


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
    median_score_diff: float = 0.0
    p99_score_diff: float = 0.0

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
    # where the floor applied: the precision's preset, which ``tolerances`` widened to ``floor`` (the
    # reference's measured noise, norcal.workflows.parity.floor.NoiseFloor), or None where the
    # candidate passed at the preset and the floor was not measured
    preset: Tolerances | None = None
    floor: Any = None

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def precision(self) -> str:
        return self.tolerances.precision



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


def quantile_name(q: float) -> str:
    """'median' for 0.5, else 'p99' style."""
    return "median" if q == 0.5 else f"p{100 * q:g}"


def _quantile_failures(score_d: np.ndarray, bounds: dict[float, float]) -> list[str]:
    """One line per quantile of the paired score differences past its bound."""
    out = []
    for q, bound in sorted(bounds.items()):
        v = float(np.quantile(score_d, q)) if score_d.size else 0.0
        if v > bound:
            out.append(f"detections: matched scores' {quantile_name(q)} difference {v:.3g} > {bound:g}")
    return out


def _compare_detections(ref: dict, cand: dict, tol: Tolerances, score_thresh: float):
    rn = np.asarray(ref["num_detections"]).reshape(-1).astype(np.int64)
    cn = np.asarray(cand["num_detections"]).reshape(-1).astype(np.int64)
    if rn.shape != cn.shape:
        return None, [], [f"batch sizes differ: {rn.size} vs {cn.size} images"]
    failures, has_masks = _input_failures(ref, cand, rn, cn)
    m = _match_images(ref, cand, rn, cn, tol, score_thresh, has_masks)
    score_d = np.abs(m.pairs["scores"][0].astype(np.float64) - m.pairs["scores"][1])
    box_d = np.abs(m.pairs["boxes"][0].astype(np.float64) - m.pairs["boxes"][1])
    dd = DetectionDiff(
        images=int(rn.size), reference_count=int(rn.sum()), candidate_count=int(cn.sum()),
        matched=m.matched, excused=int(m.excused.sum()), unmatched_reference=m.unmatched_reference,
        unmatched_candidate=m.unmatched_candidate, reordered=m.reordered,
        min_iou=float(m.ious.min()) if m.ious.size else 1.0,
        mean_iou=float(m.ious.mean()) if m.ious.size else 1.0,
        max_score_diff=float(score_d.max()) if score_d.size else 0.0,
        mean_score_diff=float(score_d.mean()) if score_d.size else 0.0,
        max_box_diff=float(box_d.max()) if box_d.size else 0.0,
        median_score_diff=float(np.quantile(score_d, 0.5)) if score_d.size else 0.0,
        p99_score_diff=float(np.quantile(score_d, 0.99)) if score_d.size else 0.0,
    )
    if dd.matched_fraction < tol.min_matched:
        failures.append(f"detections: {dd.matched_fraction:.1%} matched (IoU >= {tol.match_iou:g}, same class), "
                        f"need {tol.min_matched:.0%}: {dd.unmatched_reference} reference and "
                        f"{dd.unmatched_candidate} candidate detections unpaired"
                        + (f" in images {', '.join(map(str, m.bad_images[:8]))}" if m.bad_images else ""))
    if tol.score_quantiles and not tol.elementwise:
        failures.extend(_quantile_failures(score_d, tol.score_quantiles))
    elif dd.max_score_diff > tol.score_atol and not tol.elementwise:  # else the scores row says it
        failures.append(f"detections: matched scores differ by up to {dd.max_score_diff:.3g} "
                        f"> {tol.score_atol:g}")
    tensors = _tensor_rows(ref, cand, rn, cn, m, tol, dd.matched, has_masks)
    failures.extend(_tensor_failure(d) for d in tensors if d.gating and not d.passed)
    return dd, tensors, failures


def _input_failures(ref: dict, cand: dict, rn: np.ndarray, cn: np.ndarray) -> tuple[list[str], bool]:
    """What is wrong before any matching (non-finite values, mask heads of different sizes),
    and whether both sides' masks can be compared."""
    failures = []
    for side, out, counts in (("reference", ref, rn), ("candidate", cand, cn)):
        bad = sum(int(np.sum(~np.isfinite(np.asarray(out[k][b, :counts[b]], np.float64))))
                  for k in ("boxes", "scores") for b in range(counts.size))
        if bad:  # NaN pairs with nothing and hides from max(): say so outright
            failures.append(f"{side}: {bad} non-finite box/score values among its detections")
    has_masks = "masks" in ref and "masks" in cand
    if has_masks and ref["masks"].shape[2:] != cand["masks"].shape[2:]:  # e.g. another architecture's checkpoint
        size = {n: "x".join(map(str, o["masks"].shape[2:])) for n, o in (("ref", ref), ("cand", cand))}
        failures.append(f"masks: {size['ref']} per detection in reference, {size['cand']} in candidate: "
                        "not the same model's mask head")
        has_masks = False
    return failures, has_masks


@dataclass
class _Matching:
    """The detections of every image paired (:func:`match_detections`), the pairs' values
    concatenated over images (reference, candidate) per output."""

    pairs: dict[str, tuple[np.ndarray, np.ndarray]]
    ious: np.ndarray
    excused: np.ndarray  # per image: unpaired detections explained by the other side's boundary
    bad_images: list[int]
    matched: int = 0
    unmatched_reference: int = 0
    unmatched_candidate: int = 0
    reordered: int = 0


def _match_images(ref: dict, cand: dict, rn: np.ndarray, cn: np.ndarray, tol: Tolerances, score_thresh: float,
                  has_masks: bool) -> _Matching:
    cap_r, cap_c = ref["scores"].shape[1], cand["scores"].shape[1]
    pairs = {k: ([], []) for k in ("boxes", "scores", "masks")}
    ious: list[np.ndarray] = []
    m = _Matching({}, np.zeros(0), np.zeros(rn.size, np.int64), [])
    for b in range(rn.size):
        nr, nc = int(rn[b]), int(cn[b])
        rb, rs, rc = ref["boxes"][b, :nr], ref["scores"][b, :nr], ref["classes"][b, :nr]
        cb, cs, cc = cand["boxes"][b, :nc], cand["scores"][b, :nc], cand["classes"][b, :nc]
        ri, ci, iou = match_detections(rb, rs, rc, cb, cs, cc, tol.match_iou)
        ious.append(iou)
        m.matched += len(ri)
        m.reordered += int(np.sum(ri != ci))
        # a detection missing on the other side is excused when it sits on that side's boundary
        lone_r = np.setdiff1d(np.arange(nr), ri)
        lone_c = np.setdiff1d(np.arange(nc), ci)
        edge_c = _boundary(cand["scores"][b], nc, cap_c, score_thresh)
        edge_r = _boundary(ref["scores"][b], nr, cap_r, score_thresh)
        ok_r = rs[lone_r] <= edge_c + tol.score_atol
        ok_c = cs[lone_c] <= edge_r + tol.score_atol
        # one boundary detection usually swaps for another: count the pair once
        m.excused[b] = max(int(ok_r.sum()), int(ok_c.sum()))
        m.unmatched_reference += int((~ok_r).sum())
        m.unmatched_candidate += int((~ok_c).sum())
        if (~ok_r).any() or (~ok_c).any():
            m.bad_images.append(b)
        for name, r_value, c_value in (("boxes", rb[ri], cb[ci]), ("scores", rs[ri], cs[ci])):
            pairs[name][0].append(r_value)
            pairs[name][1].append(c_value)
        if has_masks:
            pairs["masks"][0].append(ref["masks"][b, ri])
            pairs["masks"][1].append(cand["masks"][b, ci])
    m.pairs = {k: (np.concatenate(v[0]) if v[0] else np.zeros(0), np.concatenate(v[1]) if v[1] else np.zeros(0))
               for k, v in pairs.items()}
    m.ious = np.concatenate(ious) if ious else np.zeros(0)
    return m


def _tensor_rows(ref: dict, cand: dict, rn: np.ndarray, cn: np.ndarray, m: _Matching, tol: Tolerances,
                 matched: int, has_masks: bool) -> list[TensorDiff]:
    """Per-output rows on the matched pairs (the element-level view, robust to reordering)."""
    count_diff = np.abs(rn - cn)
    # shown, not judged: a count differs exactly by the unpaired detections, which the matched
    # fraction already judges ("ok" when boundary detections explain the difference)
    explained = count_diff <= m.excused
    tensors = [TensorDiff("num_detections", tuple(np.shape(ref["num_detections"])),
                          float(count_diff.max(initial=0)), float(count_diff.mean()), 0.0, 0.0, 0.0,
                          bool(explained.all()), False,
                          raw_max_abs=float(count_diff.max(initial=0)), count=int(rn.size))]
    for name in ["boxes", "scores", "classes"] + (["masks"] if has_masks else []):
        raw = None
        if ref[name].shape == cand[name].shape:
            raw = float(np.abs(np.asarray(ref[name], np.float64) - cand[name]).max(initial=0))
        if name == "classes":  # equal by construction of the matching; unmatched are counted above
            tensors.append(TensorDiff(name, tuple(ref[name].shape), 0.0, 0.0, 0.0, 0.0, 0.0, True,
                                      False, aligned=True, raw_max_abs=raw, count=matched))
            continue
        r, c = m.pairs[name]
        atol = tol.atol.get(name, tol.default_atol)
        mx, mean, rel = _diff_stats(r, c)
        tensors.append(TensorDiff(name, tuple(ref[name].shape), mx, mean, rel, atol, tol.rtol,
                                  _within(r, c, atol, tol.rtol), tol.elementwise, aligned=True,
                                  raw_max_abs=raw, count=int(r.size)))
    return tensors

