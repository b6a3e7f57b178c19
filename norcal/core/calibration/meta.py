"""A calibration in a graph's metadata: written once (:func:`calibration_metadata`) and read back
(:func:`calibration_from_metadata`) with the node keys of :mod:`norcal.core.contract`."""

from __future__ import annotations

import json

from norcal.core.calibration.spec import DEFAULT_BACKGROUND, Calibration
from norcal.core.contract import (ACTIVATION, BACKGROUND, BACKGROUND_SCALE, CATEGORY_IDS, COUNT_TYPE, FACTOR,
                                  GAMMA, INLINE, MECHANISM, MIN_COUNT, MIN_COUNT_CLAMPED, NUM_CLASSES,
                                  RENORMALIZE, TABLE, TABLE_SHA256, class_names_metadata)
from norcal.core.errors import NorcalError


def calibration_metadata(cal: Calibration) -> dict[str, str]:
    """A resolved calibration's metadata: its node keys (what the node computes, renormalize as
    resolved for the activation; unused options left out) and the runtime keys its table fixes
    (table name, class count, category ids: runners map class index -> category id with them)."""
    table = cal.resolved_table
    out = {GAMMA: str(float(cal.gamma)), FACTOR: cal.factor, MECHANISM: cal.mechanism,
           RENORMALIZE: str(cal.renormalized).lower(), ACTIVATION: cal.activation or "softmax",
           BACKGROUND: cal.background or DEFAULT_BACKGROUND, BACKGROUND_SCALE: str(float(cal.background_scale)),
           COUNT_TYPE: cal.count or table.count_type, TABLE_SHA256: table.sha256,
           TABLE: table.name, NUM_CLASSES: str(table.num_classes),
           CATEGORY_IDS: json.dumps(table.category_ids), **class_names_metadata(table.names)}
    if cal.min_count is not None:
        out[MIN_COUNT] = f"{cal.min_count:g}"  # "2", not "2.0": counts are usually whole numbers
        out[MIN_COUNT_CLAMPED] = str(cal.min_count_clamped)
    return out


def calibration_from_metadata(meta: dict[str, str], prior=None) -> Calibration:
    """The calibration a graph's metadata records (``prior``: its ``norcal.log_prior`` values,
    kept as stored); the table is known by name and digest only."""
    def number(key: str, kind=float, default=None):
        raw = meta.get(key)
        if raw is None:
            return default
        try:
            return kind(float(raw)) if kind is int else kind(raw)
        except ValueError:
            raise NorcalError(f"model metadata {key}={raw!r} is not a number") from None

    return Calibration(
        gamma=number(GAMMA), table=meta.get(TABLE) or None, factor=meta.get(FACTOR, "cdt"),
        mechanism=meta.get(MECHANISM, "exp"),
        renormalize=meta.get(RENORMALIZE, "true").lower() != "false",
        background_scale=number(BACKGROUND_SCALE, default=1.0), count=meta.get(COUNT_TYPE),
        background=meta.get(BACKGROUND), min_count=number(MIN_COUNT),
        inline=meta.get(INLINE, "false") == "true", activation=meta.get(ACTIVATION, "softmax"),
        stored_prior=prior, table_sha256=meta.get(TABLE_SHA256),
        num_classes=number(NUM_CLASSES, int), min_count_clamped=number(MIN_COUNT_CLAMPED, int))
