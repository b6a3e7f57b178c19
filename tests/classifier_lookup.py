"""Tests' view of the classifier heuristic (norcal.export.graph.classifier_search)."""

from __future__ import annotations

from norcal.export.graph.classifier_search import ClassifierView


def find_classifiers(model, num_classes: int | None = None, background: str = "last") -> list:
    """The Softmax / Sigmoid nodes the heuristic takes for a foreign model's box classifier, those
    without a problem; given ``num_classes``, of the calibration's width (classes, +1 unless
    ``background`` is none)."""
    want = None if num_classes is None else num_classes + (0 if background == "none" else 1)
    return [c for c in ClassifierView(model).search(want) if not c.problem]
