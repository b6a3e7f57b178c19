"""How a detector's (box, class) scores become its detections: the export option, its record in
``norcal.detector``, and its reading back (parity, tune, infer and eval read the same record).

Two label rules (``labels``):

- ``multi-label``: every (box, class) pair above the threshold is a candidate, so one box can be
  kept with several classes (Ultralytics' validator, ``non_max_suppression(multi_label=True)``;
  RT-DETR's top K over queries x classes). A per-class monotone shift (NorCal) reorders no
  class's candidates, so AP over it cannot move with gamma.
- ``best-class``: one label per box, its best class after NorCal, kept when that score is above
  the threshold (Ultralytics' predictor, ``multi_label=False``; for RT-DETR the best class of
  each query). The winning class changes with gamma.

``agnostic_nms``: NMS across classes (Ultralytics' ``agnostic_nms``; best-class only). ``conf``:
the score threshold (None: the family's default, Ultralytics' validation 0.001; its predictor's
default is 0.25). ``nms``: where the NMS runs: ``graph`` (default, ONNX NonMaxSuppression) or
``host`` (the graph ends at the calibrated candidates, :mod:`norcal.runtime.host_nms` selects
them exactly as the graph would: for builders without data-dependent layers, TensorRT for RTX).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from norcal.core.errors import NorcalError

MULTI_LABEL, BEST_CLASS = "multi-label", "best-class"
LABEL_RULES = (MULTI_LABEL, BEST_CLASS)  # the first is every family's default

NMS_GRAPH, NMS_HOST = "graph", "host"
NMS_PLACES = (NMS_GRAPH, NMS_HOST)  # the first is the default

# keys of the norcal.detector JSON (contract.DETECTOR) that record it
DECODING_KEY, AGNOSTIC_KEY, CONF_KEY, NMS_KEY = "decoding", "agnostic_nms", "score_thresh_test", "nms"


@dataclass(frozen=True)
class Decoding:
    """labels: ``multi-label`` or ``best-class`` (module docstring); agnostic_nms: class-agnostic
    NMS (best-class only); conf: the score threshold in [0, 1) (None: the family's default);
    nms: ``graph`` or ``host`` (module docstring)."""

    labels: str = MULTI_LABEL
    agnostic_nms: bool = False
    conf: float | None = None
    nms: str = NMS_GRAPH

    def __post_init__(self):
        if self.labels not in LABEL_RULES:
            raise NorcalError(f"decoding must be {' or '.join(LABEL_RULES)}, got {self.labels!r}", param="decoding")
        if self.agnostic_nms and self.labels != BEST_CLASS:
            raise NorcalError("agnostic_nms needs the best-class decoding (one label per box)",
                              param="agnostic_nms")
        if self.conf is not None and not (isinstance(self.conf, (int, float)) and not isinstance(self.conf, bool)
                                          and math.isfinite(self.conf) and 0 <= self.conf < 1):
            raise NorcalError(f"conf must be a number in [0, 1), got {self.conf!r}", param="conf")
        if self.nms not in NMS_PLACES:
            raise NorcalError(f"nms must be {' or '.join(NMS_PLACES)}, got {self.nms!r}", param="nms")

    @property
    def best_class(self) -> bool:
        return self.labels == BEST_CLASS

    @property
    def host_nms(self) -> bool:
        return self.nms == NMS_HOST

    def score_thresh(self, given: float | None) -> float | None:
        """The score threshold to decode with: ``conf`` when set (a ``given`` other one is refused),
        else ``given`` (None: the family's default)."""
        if self.conf is None:
            return given
        if given is not None and float(given) != self.conf:
            raise NorcalError(f"score_thresh {given} and the decoding's conf {self.conf} disagree", param="conf")
        return self.conf

    def record(self) -> dict:
        """The keys it adds to ``norcal.detector`` (none for the default rule: old files read alike)."""
        out = {DECODING_KEY: self.labels, AGNOSTIC_KEY: self.agnostic_nms} if self.best_class else {}
        return out | ({NMS_KEY: self.nms} if self.host_nms else {})


def recorded_decoding(meta: dict[str, str]) -> Decoding:
    """The decoding an exported model's metadata records (``norcal.detector``): the default
    multi-label rule when it names none, ``conf`` its score_thresh_test."""
    from norcal.core.contract import DETECTOR

    try:
        settings = json.loads(meta.get(DETECTOR) or "{}")
    except ValueError:
        raise NorcalError(f"metadata {DETECTOR} is not JSON") from None
    if not isinstance(settings, dict):
        raise NorcalError(f"metadata {DETECTOR} is not a JSON object")
    conf = settings.get(CONF_KEY)
    try:
        return Decoding(settings.get(DECODING_KEY, MULTI_LABEL), bool(settings.get(AGNOSTIC_KEY, False)),
                        None if conf is None else float(conf), settings.get(NMS_KEY, NMS_GRAPH))
    except (NorcalError, TypeError, ValueError) as e:
        raise NorcalError(f"metadata {DETECTOR}: {e}") from None
