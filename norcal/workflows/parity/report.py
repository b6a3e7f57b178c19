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

