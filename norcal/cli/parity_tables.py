"""Parity results for the terminal: rich tables of a parity run, and the ``--verify`` report."""

from __future__ import annotations

import io

import numpy as np

from norcal.workflows.parity import ParityRun, verdict_lines


def _g(v: float | None) -> str:
    return "-" if v is None else ("inf" if not np.isfinite(v) else f"{v:.2g}")


def _score_rule(tol) -> str:
    """The paired scores' rule: quantile bounds where the preset has them, else the max."""
    from norcal.workflows.parity.compare import quantile_name

    if tol.score_quantiles:
        return ", ".join(f"score |d| {quantile_name(q)} <= {b:g}" for q, b in sorted(tol.score_quantiles.items()))
    return f"score |d| <= {tol.score_atol:g}"


def render_tables(run: ParityRun) -> list:
    """Rich tables for a :class:`ParityRun`: per comparison, one row per output (differences
    over matched detections, and the naive in-order max), then the detection-level agreement,
    then AP when annotations were given."""
    from rich import box
    from rich.table import Table

    tables = []
    times = ", ".join(f"{n} {run.seconds[n]:.2f} s" for n in run.names)
    for rep in run.reports:
        tol = rep.tolerances
        level = "element + detection level" if tol.elementwise else "detection level only"
        t = Table(title=f"{rep.candidate} vs {rep.reference}: {tol.precision}, {level}",
                  caption=f"{run.images} images; |d| over paired detections, 'in order' the naive "
                          f"element-wise max; tolerance atol + {tol.rtol:g} x |ref|; ok/over: shown, "
                          f"not judged; {times}" + (f"\n{rep.floor.line()}" if rep.floor else ""),
                  box=box.SIMPLE_HEAD, pad_edge=False)
        for col, just in (("output", "left"), ("shape", "left"), ("max |d|", "right"),
                          ("mean |d|", "right"), ("in order", "right"), ("atol", "right"), ("result", "left")):
            t.add_column(col, justify=just, no_wrap=True, min_width=len(col))
        for d in rep.tensors:
            if d.name == "classes" and d.aligned:
                tolerance, result = "same", "pass"
            else:
                tolerance = "edge" if d.name == "num_detections" else f"{d.atol:.3g}"
                result = ("pass" if d.passed else "FAIL") if d.gating else ("ok" if d.passed else "over")
            colour = "green" if result.startswith(("pass", "ok")) else ("red" if result == "FAIL" else "yellow")
            t.add_row(d.name, "x".join(map(str, d.shape)), _g(d.max_abs), _g(d.mean_abs),
                      _g(d.raw_max_abs), tolerance, f"[{colour}]{result}[/{colour}]")
        tables.append(t)
        det = rep.detections
        if det is not None:
            dt = Table(title="detections paired as sets (same class, box IoU)",
                       caption=f"need >= {tol.min_matched:.0%} paired or on the boundary, IoU >= "
                               f"{tol.match_iou:g}, " + _score_rule(tol),
                       box=box.SIMPLE_HEAD, pad_edge=False)
            for col in ("ref", "cand", "paired", "boundary", "lone r/c", "reordered", "IoU min",
                        "score |d| p50", "p99", "max"):
                dt.add_column(col, justify="right")
            dt.add_row(str(det.reference_count), str(det.candidate_count),
                       f"{det.matched} ({det.matched_fraction:.1%})", str(det.excused),
                       f"{det.unmatched_reference}/{det.unmatched_candidate}", str(det.reordered),
                       f"{det.min_iou:.4f}", _g(det.median_score_diff), _g(det.p99_score_diff),
                       _g(det.max_score_diff))
            tables.append(dt)
        if rep.ap:
            at = Table(title="box AP on the given annotations", caption=f"tolerance {tol.ap_atol:g}",
                       box=box.SIMPLE_HEAD, pad_edge=False)
            for col in ("metric", rep.reference, rep.candidate, "|d|"):
                at.add_column(col, justify="right")
            for k, (a, b) in rep.ap.items():
                at.add_row(k, f"{a:.4f}", f"{b:.4f}", f"{abs(a - b):.4f}" if a >= 0 and b >= 0 else "-")
            tables.append(at)
    return tables



def verify_text(result) -> str:
    """The ``--verify`` report (a :class:`norcal.workflows.verify.VerifyResult`) as plain text:
    a heading, the parity tables, the verdict, and a warning when only fp16 tolerances held."""
    from norcal.cli.terminal import SafeConsole as Console

    buf = io.StringIO()
    console = Console(file=buf, width=100, color_system=None, force_terminal=False, soft_wrap=False)
    console.print(f"verify: ONNX Runtime vs PyTorch on {result.images} image(s), {result.calibration}")
    if result.skipped:
        console.print(f"verify: {len(result.skipped)} unreadable file(s) skipped, e.g. "
                      f"{result.skipped[0][0]}: {result.skipped[0][1]}", markup=False, highlight=False)
    for table in render_tables(result.run):
        console.print(table)
    for line in verdict_lines(result.run):
        console.print(line, markup=False, highlight=False)
    text = buf.getvalue().rstrip()
    if result.within_fp16_only:
        text += "\nwarning: outside fp32 tolerances but within fp16 ones; see the rows marked FAIL"
    return text
