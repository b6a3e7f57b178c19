"""The bundled example, end to end: checkpoint -> ONNX with NorCal -> ONNX Runtime -> LVIS AP.

Uses the d2_synth_trained fixture (a Mask R-CNN detectron2 trained on a synthetic long-tailed
dataset, 60 classes): builds the calibration table from its training annotations, exports
the checkpoint once, inserts NorCal per gamma (graph surgery only), runs every model through
ONNX Runtime on the validation images in padded batches, pastes masks, writes LVIS results,
and evaluates bbox and segm AP / AP_r / AP_c / AP_f. Every number is measured on the spot.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from norcal.core.errors import NorcalError

FIXTURE_NAME = "d2_synth_trained"
DEFAULT_GAMMAS = (0.5, 1.0, 1.5)
NEEDED = ("model_final.pth", "config.yaml", "train_annotations.json", "val.json", "val")
METRICS = ("AP", "APr", "APc", "APf")


def default_data_dir() -> Path:
    """The bundled example: package data ``norcal/examples/d2_synth_trained``."""
    from norcal.examples import ROOT

    return ROOT / FIXTURE_NAME


def check_data_dir(data: os.PathLike | None) -> Path:
    """The data folder, with every file the demo needs; a NorcalError says what is missing."""
    d = default_data_dir() if data is None else Path(data)
    missing = [n for n in NEEDED if not (d / n).exists()]
    if data is None and missing:
        raise NorcalError(
            f"the bundled example is incomplete ({d} lacks {', '.join(missing)}): reinstall "
            f"norcal-deploy, or get norcal/examples/{FIXTURE_NAME}/ from its source repository "
            "and pass --data DIR")
    if not d.is_dir():
        raise NorcalError(f"--data {d}: no such folder")
    if missing:
        raise NorcalError(f"--data {d}: missing {', '.join(missing)} (needs {', '.join(NEEDED)})")
    return d


@dataclass
class Setting:
    """One evaluated model: the baseline (gamma None: plain softmax) or NorCal at gamma."""

    label: str
    gamma: float | None
    model_path: Path
    results_path: Path
    bbox: dict[str, float]
    segm: dict[str, float]
    num_detections: int
    infer_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "gamma": self.gamma, "model": str(self.model_path),
                "results": str(self.results_path), "num_detections": self.num_detections,
                "infer_seconds": self.infer_seconds,
                "bbox": {k: float(v) for k, v in self.bbox.items()},
                "segm": {k: float(v) for k, v in self.segm.items()}}


@dataclass
class DemoResult:
    settings: list[Setting]
    num_images: int
    table_name: str
    output_dir: Path
    plot_path: Path
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def baseline(self) -> Setting:
        return self.settings[0]

    @property
    def best(self) -> Setting:
        """The NorCal setting with the highest bbox AP."""
        return max(self.settings[1:], key=lambda s: (s.bbox["AP"], -(s.gamma or 0)))

    def to_json(self) -> dict[str, Any]:
        return {"num_images": self.num_images, "table": self.table_name,
                "best_gamma": self.best.gamma if len(self.settings) > 1 else None,
                "seconds": self.seconds, "plot": str(self.plot_path),
                "settings": [s.to_json() for s in self.settings]}


def run_demo(data: os.PathLike | None = None, output_dir: os.PathLike = "norcal-demo",
             gammas: Sequence[float] = DEFAULT_GAMMAS, batch_size: int = 8,
             progress=None, log: Callable[[str], None] | None = None) -> DemoResult:
    """Export, calibrate, run and evaluate the bundled model; write models, results, plot and
    summary.json into ``output_dir``. progress: an optional ``rich.progress.Progress``."""
    from norcal.core.calibration import check_gamma
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.export.calibrate_onnx import calibrate_onnx
    from norcal.export.detector import load_detector, export_detector
    from norcal.core.onnx_io import save_onnx
    from norcal.core.fileio import write_json
    from norcal.runtime.onnxruntime_runner import OnnxRuntimeRunner
    from norcal.runtime.inference import run_images
    from norcal.runtime.results import detections_to_results
    from norcal.core.tables import build_table
    from norcal.workflows.tune import images_from_gt, write_sweep_plot

    say = log or (lambda msg: None)
    gammas = sorted({check_gamma(g) for g in gammas} - {0.0})
    if not gammas:
        raise NorcalError("give at least one NorCal gamma > 0 (the baseline is always run)")
    if batch_size < 1:
        raise NorcalError(f"batch size must be >= 1, got {batch_size}")
    d = check_data_dir(data)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    table = build_table(d / "train_annotations.json", name=f"{FIXTURE_NAME}_train")
    table.save(out / "table.json")
    gt = prepare_gt(d / "val.json", table)
    pairs = images_from_gt(d / "val.json", d / "val")
    spec, model = load_detector(d / "model_final.pth", d / "config.yaml")
    plain = export_detector(model, spec)
    seconds["export"] = time.perf_counter() - t0
    say(f"exported {spec.num_classes}-class Mask R-CNN in {seconds['export']:.1f} s; table "
        f"{table.name} (N_c from {d / 'train_annotations.json'})")

    # the plain graph is the baseline; NorCal is one surgery per gamma on that same export
    models: list[tuple[str, float | None, Path]] = []
    t0 = time.perf_counter()
    base_path = out / "model_baseline.onnx"
    save_onnx(plain, base_path)
    models.append(("baseline", None, base_path))
    for g in gammas:
        path = out / f"model_norcal_g{g:g}.onnx"
        save_onnx(calibrate_onnx(plain, g, table), path)
        models.append((f"NorCal γ={g:g}", g, path))
    seconds["surgery"] = time.perf_counter() - t0

    settings = []
    ids = {str(p): i for i, p in pairs}
    for label, g, path in models:
        t0 = time.perf_counter()
        runner = OnnxRuntimeRunner(path)
        task = progress.add_task(f"{label:>14}", total=len(pairs)) if progress is not None else None
        step = (lambda n, task=task: progress.advance(task, n)) if progress is not None else None
        results = []
        for img_path, det in run_images(runner, [p for _, p in pairs], batch_size, on_done=step):
            results.extend(detections_to_results(ids[str(img_path)], det, table.category_ids))
        infer_s = time.perf_counter() - t0
        res_path = out / f"results_{'baseline' if g is None else f'norcal_g{g:g}'}.json"
        write_json(res_path, results, indent=None)
        if not results:
            raise NorcalError(f"{label}: no detections on any image")
        bbox = evaluate(gt, results, "bbox", spec.detections_per_image)
        segm = evaluate(gt, results, "segm", spec.detections_per_image)
        settings.append(Setting(label, g, path, res_path, dict(bbox.stats), dict(segm.stats),
                                len(results), infer_s))
    seconds["infer_and_eval"] = time.perf_counter() - t_start - seconds["export"] - seconds["surgery"]

    result = DemoResult(settings, len(pairs), table.name, out, out / "ap_vs_gamma.png", seconds)
    series = [(0.0 if s.gamma is None else s.gamma, s) for s in settings]
    write_sweep_plot(result.plot_path, {"bbox": [(g, s.bbox) for g, s in series],
                                        "segm": [(g, s.segm) for g, s in series]},
                     best=result.best.gamma if len(settings) > 1 else None,
                     title=f"{FIXTURE_NAME}, {len(pairs)} val images")
    seconds["total"] = time.perf_counter() - t_start
    write_json(out / "summary.json", result.to_json())
    return result


def comparison_table(result: DemoResult):
    """A rich Table, settings side by side: one row per metric (bbox and segm AP, AP_r, AP_c,
    AP_f in %, then the detection count), one column per model, and the change of the best
    NorCal model (highest bbox AP) over the baseline."""
    from rich.table import Table

    from norcal.evaluation.report import percent

    t = Table(title=f"baseline vs NorCal: {result.num_images} validation images, LVIS AP (%)")
    best = result.best if len(result.settings) > 1 else None
    t.add_column("metric")
    for s in result.settings:
        name = "baseline" if s.gamma is None else f"γ={s.gamma:g}"
        t.add_column(name + (" *" if s is best else ""), justify="right")
    if best is not None:
        t.add_column(f"Δ γ={best.gamma:g}", justify="right", style="bold")
    for kind in ("bbox", "segm"):
        for k in METRICS:
            vals = [getattr(s, kind)[k] for s in result.settings]
            row = [f"{kind} {k}", *(percent(v) for v in vals)]
            if best is not None:
                row.append(f"{100 * (getattr(best, kind)[k] - vals[0]):+.2f}")
            t.add_row(*row, end_section=(k == METRICS[-1]))
    t.add_row("detections", *(str(s.num_detections) for s in result.settings),
              *([""] if best is not None else []))
    return t
