"""Evaluation output: the metrics JSON, per-class CSV and PNG plots (the printed table is the CLI's)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from norcal.evaluation.lvis_eval import EvalResult
from norcal.core.files.fileio import atomic_path, write_json, write_text

GROUP_LABELS = {"r": "rare", "c": "common", "f": "frequent"}


def percent(v: float) -> str:
    """A metric fraction as a percentage with two decimals; "-" where undefined (< 0)."""
    return "-" if v < 0 else f"{100 * v:.2f}"


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure as PNG atomically (temp file + rename), then close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def metrics_json(result: EvalResult, fixed: EvalResult | None = None, deployment=None) -> dict:
    """The --json document: ``result.to_json()`` plus ``fixed`` (AP^Fixed) and ``deployment``
    (:class:`norcal.evaluation.deployment.DeploymentMetrics`) when computed."""
    doc = result.to_json()
    if fixed is not None:
        doc["fixed"] = {"per_class_cap": fixed.per_class, "num_detections": fixed.num_detections,
                        "stats": {k: float(fixed.stats[k]) for k in fixed.stat_keys()},
                        "per_class_AP": [float(a) for a in fixed.class_ap()]}
    if deployment is not None:
        doc["deployment"] = deployment.to_json()
    return doc


def write_metrics(path: str | Path, result: EvalResult, fixed: EvalResult | None = None,
                  deployment=None) -> None:
    write_json(path, metrics_json(result, fixed, deployment))


def write_per_class_csv(path: str | Path, result: EvalResult, fixed: EvalResult | None = None) -> None:
    """One row per category: id, name, frequency, N_c (blank when unknown), GT count, AP
    (and AP_fixed); AP is a fraction, -1 where the category has no GT."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["category_id", "name", "frequency", "image_count", "num_gt", "AP"]
               + (["AP_fixed"] if fixed is not None else []))
    ap = result.class_ap()
    apf = fixed.class_ap() if fixed is not None else None
    for i, cid in enumerate(result.cat_ids):
        nc = result.image_count[i]
        row = [int(cid), result.cat_names[i], result.frequency[i] or "",
               "" if not np.isfinite(nc) else f"{nc:g}", int(result.num_gt[i, 0]), f"{ap[i]:.6f}"]
        if apf is not None:
            row.append(f"{apf[i]:.6f}")
        w.writerow(row)
    write_text(path, buf.getvalue())


def write_plots(folder: str | Path, result: EvalResult, fixed: EvalResult | None = None) -> list[Path]:
    """ap_by_frequency.png (AP per group, bars) and ap_vs_count.png (per-class AP vs N_c)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)  # created with its first file, and only if the run succeeds
    written = []
    keys = ["AP", "APr", "APc", "APf"]
    fig, ax = plt.subplots(figsize=(6, 4))
    series = [("LVIS AP", result)] + ([("AP^Fixed", fixed)] if fixed is not None else [])
    width = 0.8 / len(series)
    for j, (name, r) in enumerate(series):
        vals = [max(r.stats[k], 0) * 100 for k in keys]
        ax.bar(np.arange(len(keys)) + (j - (len(series) - 1) / 2) * width, vals, width, label=name)
    ax.set_xticks(np.arange(len(keys)), ["all", "rare", "common", "frequent"])
    ax.set_ylabel("AP (%)")
    ax.set_title(f"{result.iou_type} AP by frequency group")
    ax.legend()
    save_figure(fig, folder / "ap_by_frequency.png")
    written.append(folder / "ap_by_frequency.png")

    ap = result.class_ap()
    have_nc = np.isfinite(result.image_count)
    x = np.where(have_nc, result.image_count, result.num_gt[:, 0]).astype(float)
    ok = (ap > -1) & (x > 0)
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = {"r": "tab:red", "c": "tab:orange", "f": "tab:blue"}
    for g, label in GROUP_LABELS.items():
        sel = ok & np.array([f == g for f in result.frequency])
        if sel.any():
            ax.scatter(x[sel], ap[sel] * 100, s=10, c=colors[g], label=label, alpha=0.7)
    other = ok & np.array([f not in GROUP_LABELS for f in result.frequency])
    if other.any():
        ax.scatter(x[other], ap[other] * 100, s=10, c="gray", alpha=0.7, label="no frequency group")
    ax.set_xscale("log")
    ax.set_xlabel("N_c: training images of the class" if have_nc.all() else
                  "GT instances of the class in this set (N_c unknown)")
    ax.set_ylabel("AP (%)")
    ax.set_title("per-class AP")
    if ok.any():
        ax.legend()
    save_figure(fig, folder / "ap_vs_count.png")
    written.append(folder / "ap_vs_count.png")
    return written
