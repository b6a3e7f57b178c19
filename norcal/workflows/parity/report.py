"""A parity run as data for the user: verdict lines and JSON (the CLI renders tables)."""

from __future__ import annotations

import numpy as np

from norcal.workflows.parity.run import ParityRun


def verdict_lines(run: ParityRun) -> list[str]:
    """One line per comparison: PASS, or FAIL with each failed check and its numbers."""
    lines = []
    for rep in run.reports:
        head = f"{rep.candidate} vs {rep.reference} ({rep.precision})"
        if rep.passed:
            lines.append(f"PASS  {head}{_floor_note(rep)}")
        else:
            lines.append(f"FAIL  {head}: " + "; ".join(rep.failures) + _floor_note(rep))
    return lines


def _floor_note(rep) -> str:
    """The tolerances an fp32 comparison used: the preset's alone where it passed at the preset
    (the floor then not measured), else the preset's and the measured floor's, each the larger of
    the preset and floor_factor x the reference's own noise ("" where no floor applied)."""
    if rep.preset is None:
        return ""
    if rep.floor is None:
        return "; within the preset (floor not measured)"
    used, preset, f = rep.tolerances.atol, rep.preset.atol, rep.floor
    return (f"; tolerances scores {used['scores']:.2g} / boxes {used['boxes']:.2g} px: the larger of the preset's "
            f"{preset['scores']:g} / {preset['boxes']:g} px and {rep.preset.floor_factor:g} x the reference's "
            f"noise floor {f.scores:.2g} / {f.boxes:.2g} px")


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
                         "preset_tolerances": asdict(r.preset) if r.preset else None,
                         "noise_floor": asdict(r.floor) if r.floor else None,
                         "outputs": [asdict(d) for d in r.tensors],
                         "detections": asdict(r.detections) if r.detections else None,
                         "ap": {k: list(v) for k, v in r.ap.items()}} for r in run.reports],
    })

