"""The sweep's recommendation on ties, and the rules it records."""

from __future__ import annotations

from norcal.workflows.tune_sweep import SweepPoint, TuneResult


def _result(gammas, aps) -> TuneResult:
    points = [SweepPoint(g, {"AP": ap}, 10, 0.0) for g, ap in zip(gammas, aps)]
    return TuneResult(points, "cdt", "exp", "t", 4, 0.0, 0, rules="coco", rules_reason="why")


def test_ties_go_to_the_smallest_gamma():
    # float noise (1e-16, two ulps at 0.3) is no reason to move gamma; every gamma 0 or -1 either
    assert _result([0.0, 0.25, 0.5], [0.3, 0.3 + 1e-16, 0.3 - 1e-17]).best.gamma == 0.0
    assert _result([0.25, 0.5, 0.0], [0.0, 0.0, 0.0]).best.gamma == 0.0
    assert _result([0.5, 0.25], [-1.0, -1.0]).best.gamma == 0.25
    # a real difference (one detection moves AP by 1e-5 and more) still wins
    assert _result([0.0, 0.25, 0.5], [0.3, 0.3 + 1e-6, 0.3]).best.gamma == 0.25


def test_the_sweep_json_records_the_rules():
    doc = _result([0.0], [0.1]).to_json()
    assert doc["rules"] == "coco" and doc["rules_reason"] == "why"
