"""The gamma sweep on cached detections: each gamma's prior, its detections gathered chunk by
chunk, and their LVIS AP (:class:`SweepPoint`; the whole sweep a :class:`TuneResult`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from norcal.core.calibration.formula import check_gamma, log_prior
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable
from norcal.workflows.tune_cache import rescore_gamma

if TYPE_CHECKING:
    from norcal.export.families import Detector, TuneCache

MASK_IOU_TYPES = ("segm", "boundary")
AP_TIE = 1e-12  # APs this close are equal: summation order moves AP by ~1e-16, one detection by 1e-5


@dataclass
class SweepPoint:
    """One gamma of the sweep: its LVIS stats, how many detections, and the seconds spent on it."""

    gamma: float
    stats: dict[str, float]
    num_detections: int
    seconds: float


@dataclass
class TuneResult:
    """The sweep as data: one :class:`SweepPoint` per gamma, in gamma order."""

    points: list[SweepPoint]
    factor: str
    mechanism: str
    table: str
    num_images: int
    network_seconds: float
    cache_bytes: int  # the largest chunk's cache
    min_count: float | None = None  # counts below it were raised to it
    min_count_clamped: int = 0  # how many classes that raised
    iou_type: str = "bbox"  # what the sweep's AP is measured with
    gt_images: int | None = None  # images the GT lists; those not found were left out
    rules: str = "lvis"  # the evaluation rules (norcal.evaluation.rules) and why
    rules_reason: str = ""

    @property
    def best(self) -> SweepPoint:
        """The gamma with the highest AP; on a tie (APs within :data:`AP_TIE` of the best,
        e.g. every gamma 0 or -1) the smallest such gamma, so no gamma is recommended for
        float noise."""
        top = max(p.stats["AP"] for p in self.points)
        return min((p for p in self.points if p.stats["AP"] >= top - AP_TIE), key=lambda p: p.gamma)

    def to_json(self) -> dict[str, Any]:
        return {
            "rules": self.rules, "rules_reason": self.rules_reason,
            "factor": self.factor, "mechanism": self.mechanism, "table": self.table,
            "iou_type": self.iou_type, "num_images": self.num_images, "network_seconds": self.network_seconds,
            "cache_bytes": self.cache_bytes,
            "best": {"gamma": self.best.gamma, "AP": self.best.stats["AP"]},
            "sweep": [{"gamma": p.gamma, "num_detections": p.num_detections, "seconds": p.seconds,
                       "stats": {k: float(v) for k, v in p.stats.items()}} for p in self.points],
        }


def _priors(table: CalibrationTable, gammas: Sequence[float], factor: str,
            min_count: float | None = None, background: str = "last") -> tuple[list, int]:
    counts, clamped = table.clamped_counts(None, min_count)
    return [None if g == 0 else log_prior(counts, check_gamma(g, factor), factor, background,
                                          names=table.names) for g in gammas], clamped


def _concat(parts: list):
    """Concatenate :class:`norcal.evaluation.Detections` chunks (boxes, and masks if they have them)."""
    from norcal.evaluation import Detections

    rles = None if parts[0].rles is None else [r for d in parts for r in d.rles]
    return Detections(*(np.concatenate([getattr(d, k) for d in parts])
                        for k in ("image_ids", "category_ids", "scores", "boxes")), rles)


def evaluate_gamma(gt, parts: list, gamma: float, topk: int, seconds: float = 0.0,
                   iou_type: str = "bbox", rules="auto") -> SweepPoint:
    """One gamma's detections (chunks of :class:`norcal.evaluation.Detections`) -> its
    :class:`SweepPoint` (AP with ``iou_type`` under ``rules``, as :func:`norcal.evaluation.evaluate`
    takes them); ``seconds`` already spent on it are added."""
    from norcal.evaluation import evaluate

    t0 = time.perf_counter()
    ev = _concat(parts)
    if len(ev) == 0:
        raise NorcalError(f"gamma {gamma:g}: no detections on any image")
    res = evaluate(gt, ev, iou_type, topk, rules=rules)
    return SweepPoint(gamma, dict(res.stats), len(ev), seconds + time.perf_counter() - t0)


class SweepAccumulator:
    """Per-gamma detections gathered chunk by chunk, then evaluated; seconds per gamma."""

    def __init__(self, detector: Detector, table: CalibrationTable, gammas: Sequence[float], factor: str,
                 mechanism: str, batch_size: int, min_count: float | None = None,
                 iou_type: str = "bbox", rules="auto"):
        if detector.num_classes != table.num_classes:
            raise NorcalError(f"the model has {detector.num_classes} classes but table "
                              f"{table.name!r} has {table.num_classes}")
        self.detector, self.table, self.mechanism = detector, table, mechanism
        self.gammas = [float(g) for g in gammas]
        # the prior's layout is the classifier's: [C+1] with a background slot, [C] without
        self.priors, self.clamped = _priors(table, gammas, factor, min_count, detector.classifier.background)
        self.batch_size = batch_size
        self.iou_type = iou_type
        self.rules = rules  # "auto", "lvis", "coco" or a RuleChoice
        self.parts: list[list] = [[] for _ in self.gammas]
        self.seconds = [0.0] * len(self.gammas)

    @property
    def with_masks(self) -> bool:
        return self.iou_type in MASK_IOU_TYPES

    def add(self, cache: TuneCache, on_step: Callable[[int], None] | None = None) -> None:
        memo: dict = {}  # the cache's masks as RLE, shared by its gammas
        for k, prior in enumerate(self.priors):
            t0 = time.perf_counter()
            self.parts[k].append(rescore_gamma(self.detector, cache, k, prior, self.mechanism,
                                               self.batch_size, self.table.category_ids, self.with_masks,
                                               memo))
            self.seconds[k] += time.perf_counter() - t0
            if on_step:
                on_step(len(cache))

    @property
    def topk(self) -> int:
        return self.detector.topk

    def evaluate(self, gt, on_gamma: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
        points = []
        for k, g in enumerate(self.gammas):
            point = evaluate_gamma(gt, self.parts[k], g, self.topk, self.seconds[k], self.iou_type,
                                   self.rules)
            self.parts[k] = []  # free as we go
            points.append(point)
            if on_gamma:
                on_gamma(point)
        return points


def sweep(detector: Detector, cache: TuneCache, gt, table: CalibrationTable, gammas: Sequence[float],
          factor: str = "cdt", mechanism: str = "exp", batch_size: int = 16,
          on_gamma: Callable[[SweepPoint], None] | None = None,
          min_count: float | None = None) -> list[SweepPoint]:
    """Evaluate (LVIS bbox AP, top K per image) NorCal at each gamma on cached images.

    gt: a prepared GT (:func:`norcal.evaluation.prepare_gt`) or its path; table: N_c and the
    class -> category id map (the model's class order); cache: the detector's, made for these
    gammas' priors (:func:`norcal.workflows.tune_cache.cache_images`)."""
    from norcal.evaluation import prepare_gt

    acc = SweepAccumulator(detector, table, gammas, factor, mechanism, batch_size, min_count)
    acc.add(cache)
    return acc.evaluate(prepare_gt(gt, table), on_gamma)
