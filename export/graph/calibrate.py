"""Put NorCal into an ONNX detector: choose the table, compute the log prior, run the surgery."""

from __future__ import annotations

import onnx

from norcal.core import contract
from norcal.core.calibration.spec import DEFAULT_BACKGROUND, Calibration, ResolvedCalibration, default_table
from norcal.core.contract import recorded_background
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable
from norcal.export.graph.classifier_search import classifier_candidates
from norcal.export.graph.surgery import insert_norcal

__all__ = ["calibrate_graph", "classifier_classes", "default_table", "recorded_background",
           "check_background", "check_background_scale"]


def classifier_classes(model: onnx.ModelProto, background: str) -> int | None:
    """Foreground class count of the model's classifier (the recorded one, or the single
    heuristic candidate), when known."""
    found = classifier_candidates(model)
    if len(found) == 1 and found[0].width:
        return found[0].width - (0 if background == "none" else 1)
    meta = {p.key: p.value for p in model.metadata_props}
    n = meta.get(contract.NUM_CLASSES, "")
    if recorded_background(meta) is not None and n.isdigit():  # a dynamic class axis (RetinaNet)
        return int(n)
    return None


_SLOT = {"none": "has one logit per class and no other slot",
         "last": "has that slot last, after the classes' logits (detectron2)",
         "first": "has that slot first, before the classes' logits"}


def check_background(background: str, recorded: str | None) -> None:
    """Refuse a background slot other than the one the model's classifier has (``recorded``;
    None: unknown, the caller's word stands): the prior would calibrate the wrong logits."""
    if recorded is not None and background != recorded:
        raise NorcalError(f"background {background!r} does not fit the model: its classifier "
                          f"{_SLOT[recorded]}", param="background")


def check_background_scale(background_scale: float, activation: str, background: str) -> None:
    """Refuse a background scale that cannot change any score: sigmoid heads score each class
    alone, and a classifier without a background slot has nothing for b to scale."""
    if background_scale != 1 and (activation == "sigmoid" or background == "none"):
        raise NorcalError(f"background_scale {background_scale:g} has no effect on a {activation} "
                          f"classifier with background {background!r} (no class score depends on "
                          "that slot); leave it at 1", param="background_scale")


def check_class_order(meta: dict[str, str], calibration: Calibration) -> None:
    """Refuse a table whose classes are not the ones the model records (``norcal.class_names``,
    else the ``norcal.detector`` names older Ultralytics exports wrote), in the model's order:
    each prior would land on another class. The rule :func:`norcal.core.contract.check_class_names`
    applies to infer's table and annotation ids."""
    import json

    names = contract.metadata_class_names(meta)
    if names is None:
        try:
            names = json.loads(meta.get(contract.DETECTOR) or "{}").get("names")
        except (ValueError, AttributeError):
            return
    table = calibration.resolved_table
    if not isinstance(names, list) or not contract.class_names_metadata(names):
        return  # unknown, or Ultralytics' placeholders "0", "1", ...: they name no category
    contract.check_class_names(names, table.names, table.category_ids, f"table {table.name!r}", "table",
                               harm="each class's prior would go to another class")


def calibrate_graph(model: onnx.ModelProto, calibration: Calibration | float | None,
                    table: str | CalibrationTable | None = None, *, count_type: str | None = None,
                    **options) -> onnx.ModelProto:
    """Return a copy of ``model`` whose box classifier is NorCal-calibrated.

    calibration: a :class:`Calibration`, or its gamma with ``table``, ``count_type`` and the
    other fields as keywords (factor, mechanism, renormalize, background, background_scale,
    logits, inline, min_count). An unresolved one is resolved here, once (table None: the
    built-in one for the classifier's class count; background None: the model's
    ``norcal.classifier_background``, else "last"); a :class:`ResolvedCalibration` is used as
    it is, its background and scale checked by whoever resolved it for this model.
    renormalize None: the classifier's own form (softmax renormalised, sigmoid not).
    min_count: counts below it are raised to it; the metadata records it and how many classes
    it raised.
    """
    if isinstance(calibration, Calibration):
        if table is not None or count_type is not None or options:
            raise TypeError("calibrate_graph takes a Calibration or its fields, not both")
        cal = calibration
    else:
        cal = Calibration(gamma=calibration, table=table, count=count_type, **options)
    meta = {p.key: p.value for p in model.metadata_props}
    resolved = isinstance(cal, ResolvedCalibration)
    if not resolved:
        cal = _resolve_for(model, meta, cal)
    check_class_order(meta, cal)
    out = insert_norcal(model, cal)
    if not resolved:
        check_background_scale(cal.background_scale, {p.key: p.value for p in out.metadata_props}[contract.ACTIVATION],
                               cal.background)
    return out


def _resolve_for(model: onnx.ModelProto, meta: dict[str, str], cal: Calibration) -> ResolvedCalibration:
    """``cal`` resolved for the model: its background the one the export recorded (a RetinaNet:
    none; else "last") or checked against it, its table the built-in one for the class count."""
    recorded = recorded_background(meta)
    if cal.background is None:
        cal = cal.with_background(recorded or DEFAULT_BACKGROUND)
    else:
        check_background(cal.background, recorded)
    num_classes = None
    if cal.table is None and cal.gamma is not None:
        num_classes = classifier_classes(model, cal.background)
    return cal.resolve(num_classes)
