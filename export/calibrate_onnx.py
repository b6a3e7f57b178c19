"""Put NorCal into an ONNX detector: choose the table, compute the log prior, run the surgery."""

from __future__ import annotations

import json

import onnx

from norcal.core import contract
from norcal.core.calibration import check_gamma, log_prior
from norcal.core.errors import NorcalError
from norcal.core.tables import CalibrationTable, builtin_names, load_table
from norcal.export.norcal_node import NorCalSettings
from norcal.export.surgery import classifier_candidates, insert_norcal


def default_table(num_classes: int) -> CalibrationTable:
    """The built-in table with exactly ``num_classes`` classes (LVIS v1: 1203, v0.5: 1230)."""
    for name in builtin_names():
        t = load_table(name)
        if t.num_classes == num_classes:
            return t
    raise NorcalError(f"none of the built-in class counts (LVIS v1: 1203, v0.5: 1230) is for "
                      f"{num_classes} classes; pass table (the training annotations, or a JSON of "
                      "counts built from them)", param="table")


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


def recorded_background(meta: dict[str, str]) -> str | None:
    """Where a checkpoint export's classifier has its background slot (None: not our export,
    the caller must say)."""
    if not meta.get(contract.CLASSIFIER_LOGITS):
        return None
    return meta.get(contract.CLASSIFIER_BACKGROUND, "last")


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


def calibrate_onnx(model: onnx.ModelProto, gamma: float, table: str | CalibrationTable | None = None,
                   *, factor: str = "cdt", mechanism: str = "exp", renormalize: bool | None = None,
                   background: str | None = None, background_scale: float = 1.0,
                   count_type: str | None = None, logits: str | None = None,
                   inline: bool = False, min_count: float | None = None) -> onnx.ModelProto:
    """Return a copy of ``model`` whose box classifier is NorCal-calibrated with ``table``'s counts.

    background None: the model's ``norcal.classifier_background``, else "last".
    renormalize None: the classifier's own form (softmax renormalised, sigmoid not). min_count:
    counts below it are raised to it; the metadata records it and how many classes it raised.
    """
    gamma = check_gamma(gamma, factor)
    meta = {p.key: p.value for p in model.metadata_props}
    recorded = recorded_background(meta)
    if background is None:  # what the export recorded (a RetinaNet: none), else detectron2's last
        background = recorded or "last"
    else:
        check_background(background, recorded)
    if table is None:
        n = classifier_classes(model, background)
        if n is None:
            raise NorcalError("cannot tell the model's class count; pass table", param="table")
        table = default_table(n)
    elif not isinstance(table, CalibrationTable):
        table = load_table(table)
    kind = count_type or table.count_type
    counts, clamped = table.clamped_counts(kind, min_count)
    prior = log_prior(counts, gamma, factor, background, background_scale, table.names)
    settings = NorCalSettings(gamma=gamma, factor=factor, mechanism=mechanism,
                              renormalize=renormalize, background=background,
                              background_scale=background_scale, count_type=kind,
                              table=table.name, table_sha256=table.sha256,
                              num_classes=table.num_classes, min_count=min_count,
                              min_count_clamped=None if min_count is None else clamped)
    out = insert_norcal(model, prior, settings, logits=logits, inline=inline)
    check_background_scale(background_scale, {p.key: p.value for p in out.metadata_props}[contract.ACTIVATION],
                           background)
    # runtime keys: the table fixes the class order, so runners map class index -> category id
    # with it; stripping NorCal keeps them
    props = {p.key: p.value for p in out.metadata_props}
    props[contract.TABLE] = table.name
    props[contract.NUM_CLASSES] = str(table.num_classes)
    props[contract.CATEGORY_IDS] = json.dumps(table.category_ids)
    onnx.helper.set_model_props(out, props)
    return out
