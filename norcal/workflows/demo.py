"""The bundled example, end to end: tune gamma on training data, deploy, measure on validation.

Uses the d2_synth_trained example (a Mask R-CNN detectron2 trained on a synthetic long-tailed
dataset, 60 classes; package data in norcal/examples): builds the calibration table from its
training annotations, picks gamma as the paper does, on training images (the 120-image
``train_subset``, with the code of ``norcal tune``: one network pass, cached re-scoring per
gamma, LVIS box AP), exports the checkpoint once and inserts NorCal at that gamma (graph
surgery only), runs the baseline and NorCal models through ONNX Runtime on the validation
images, and evaluates bbox and segm AP / AP_r / AP_c / AP_f and AP^Fixed with Boundary IoU
(the paper's LVIS Challenge 2021 metric). For reference it also sweeps
the same grid on the validation images and reports the best validation gamma (the transfer
gap: what choosing on the test images would have gained). Every number is measured on the
spot; a few validation images are drawn, baseline and NorCal side by side.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from norcal.core.errors import NorcalError
from norcal.runtime.draw import DrawOptions

FIXTURE_NAME = "d2_synth_trained"
DEFAULT_GAMMAS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2)  # the tuning grid
NEEDED = ("model_final.pth", "config.yaml", "train_annotations.json", "val.json", "val",
          "train_subset.json", "train_subset")
METRICS = ("AP", "APr", "APc", "APf")
PICTURES = 4  # validation images drawn, baseline beside NorCal
DRAW = DrawOptions()


def default_data_dir(progress: Callable[[str, int, int], None] | None = None) -> Path:
    """The bundled example: package data ``norcal/examples/d2_synth_trained``, its images drawn
    from the dataset's seed the first time (``progress`` stage "example images")."""
    from norcal.examples import ExampleError, example_dir

    done = [0]

    def step(n: int, total: int) -> None:
        progress("example images", n - done[0], total)
        done[0] = n

    try:
        return example_dir(step if progress is not None else None)
    except ExampleError as e:
        raise NorcalError(str(e)) from None


def check_data_dir(data: os.PathLike | None, progress: Callable[[str, int, int], None] | None = None) -> Path:
    """The data folder, with every file the demo needs; a NorcalError says what is missing."""
    d = default_data_dir(progress) if data is None else Path(data)
    missing = [n for n in NEEDED if not (d / n).exists()]
    if data is None and missing:
        raise NorcalError(
            f"the bundled example is incomplete ({d} lacks {', '.join(missing)}): reinstall "
            f"norcal-deploy, or get norcal/examples/{FIXTURE_NAME}/ from its source repository "
            "and pass its folder as data", param="data")
    if not d.is_dir():
        raise NorcalError(f"data {d}: no such folder", param="data")
    if missing:
        raise NorcalError(f"data {d}: missing {', '.join(missing)} (needs {', '.join(NEEDED)})",
                          param="data")
    return d


@dataclass
class Setting:
    """One deployed model evaluated on the validation images: the baseline (gamma None: plain
    softmax) or NorCal at gamma."""

    label: str
    gamma: float | None
    model_path: Path
    results_path: Path
    bbox: dict[str, float]
    segm: dict[str, float]
    num_detections: int
    infer_seconds: float
    boundary_fixed: dict[str, float] = field(default_factory=dict)  # AP^Fixed, Boundary IoU

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "gamma": self.gamma, "model": str(self.model_path),
                "results": str(self.results_path), "num_detections": self.num_detections,
                "infer_seconds": self.infer_seconds,
                "bbox": {k: float(v) for k, v in self.bbox.items()},
                "segm": {k: float(v) for k, v in self.segm.items()},
                "boundary_fixed": {k: float(v) for k, v in self.boundary_fixed.items()}}


@dataclass
class DemoResult:
    """baseline, tuned (gamma chosen on the training subset) and best_val (the gamma the same
    sweep on the validation images prefers; the same object as ``tuned`` when they agree),
    each measured on the validation images; ``tuning`` / ``validation``: the two sweeps."""

    baseline: Setting
    tuned: Setting
    best_val: Setting
    tuning: Any  # norcal.workflows.tune.TuneResult
    validation: Any
    num_images: int
    table_name: str
    output_dir: Path
    plot_path: Path
    pictures: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def settings(self) -> list[Setting]:
        """The distinct models run: baseline, tuned, then best_val if it differs."""
        out: list[Setting] = []
        for s in (self.baseline, self.tuned, self.best_val):
            if all(s is not o for o in out):
                out.append(s)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"num_images": self.num_images, "table": self.table_name,
                "tuned_gamma": self.tuned.gamma or 0.0, "best_val_gamma": self.best_val.gamma or 0.0,
                "seconds": self.seconds, "plot": str(self.plot_path),
                "pictures": [str(p) for p in self.pictures],
                "settings": [s.to_json() for s in self.settings],
                "tuning": self.tuning.to_json(), "validation_sweep": self.validation.to_json()}


def _name(gamma: float | None) -> str:
    return "baseline" if not gamma else f"norcal_g{gamma:g}"


def run_demo(data: os.PathLike | None = None, output_dir: os.PathLike = "norcal-demo",
             gammas: Sequence[float] = DEFAULT_GAMMAS, batch_size: int = 8,
             pictures: int = PICTURES, progress: Callable[[str, int, int], None] | None = None,
             log: Callable[[str], None] | None = None) -> DemoResult:
    """Tune gamma on the training subset over ``gammas``, export, calibrate, run and evaluate
    on the validation images; write models, results, plot, pictures and summary.json into
    ``output_dir``. progress: called as ``progress(stage, n, total)`` when n more units of a
    stage are done (the tuning sweeps' stages, then one per model run on the validation images).

    The folder is built next to ``output_dir`` and replaces it whole only when everything
    succeeded: a failed run leaves an earlier demo's folder as it was, never a mix. It may not
    be, hold or lie inside ``data``.
    """
    from norcal.core.files.fileio import write_json
    from norcal.core.files.outputs import check_apart, check_output_dir, staged_dir

    dest = Path(output_dir)
    from norcal.examples import example_places

    # the bundled example is drawn later, with progress: here only where it is or will be
    check_apart(example_places() if data is None else [data], folders={"output_dir": dest})
    check_output_dir(dest, "output folder")
    with staged_dir(dest) as out:
        result = _relocated(_run_demo(data, out, gammas, batch_size, pictures, progress, log), out, dest)
        write_json(out / "summary.json", result.to_json())
    return result


def _relocated(result: DemoResult, built: Path, dest: Path) -> DemoResult:
    """``result`` with its paths in ``built`` (the staged folder) moved to ``dest``."""
    def move(path: Path) -> Path:
        return dest / Path(path).relative_to(built)

    moved = {id(s): replace(s, model_path=move(s.model_path), results_path=move(s.results_path))
             for s in result.settings}
    return replace(result, baseline=moved[id(result.baseline)], tuned=moved[id(result.tuned)],
                   best_val=moved[id(result.best_val)], output_dir=dest,
                   plot_path=move(result.plot_path), pictures=[move(p) for p in result.pictures])


def _stages(progress, prefix: str):
    """``progress`` with its stage names prefixed (the demo runs two sweeps)."""
    if progress is None:
        return None
    return lambda stage, n, total: progress(f"{prefix}: {stage}", n, total)


def _demo_grid(gammas, batch_size: int, pictures: int) -> list[float]:
    """The gammas to tune over, the arguments checked."""
    from norcal.core.calibration.formula import check_gamma

    grid = sorted({check_gamma(g) for g in gammas})
    if not any(grid):
        raise NorcalError("give at least one NorCal gamma > 0 to tune over (the baseline is always run)")
    if batch_size < 1:
        raise NorcalError(f"batch size must be >= 1, got {batch_size}")
    if pictures < 0:
        raise NorcalError(f"the number of pictures must be >= 0, got {pictures}")
    return grid


def _validation_gt(d: Path, table):
    """The validation GT as read and as prepared (every mask checked), and its (id, path) pairs."""
    from norcal.core.files.fileio import read_json
    from norcal.evaluation import prepare_gt
    from norcal.workflows.tune import images_from_gt

    gt_data = read_json(d / "val.json", "GT")
    gt = prepare_gt(gt_data, table, where=str(d / "val.json"))
    gt.rles()  # segm and boundary AP need every GT mask: one missing is named now, not after tuning
    pairs = images_from_gt(gt_data, d / "val", str(d / "val.json"))
    return gt_data, gt, pairs


def _sweeps(d: Path, grid: list[float], table, progress, seconds: dict[str, float], say):
    """The tuning sweep on the training subset and the same sweep on the validation images,
    each timed into ``seconds``."""
    from norcal.workflows.tune import tune

    weights, config = d / "model_final.pth", d / "config.yaml"
    # gamma is chosen on training images, exactly as `norcal tune` chooses it
    t0 = time.perf_counter()
    tuning = tune(weights, d / "train_subset.json", d / "train_subset", grid, table, config=config,
                  progress=_stages(progress, "train"))
    seconds["tune"] = time.perf_counter() - t0
    say(f"tuned on {tuning.num_images} training images: gamma {tuning.best.gamma:g} "
        f"(train box AP {100 * tuning.best.stats['AP']:.2f}) in {seconds['tune']:.1f} s")
    # the same sweep on the validation images, only to show what tuning there would pick
    t0 = time.perf_counter()
    validation = tune(weights, d / "val.json", d / "val", grid, table, config=config,
                      progress=_stages(progress, "val"))
    seconds["validation_sweep"] = time.perf_counter() - t0
    return tuning, validation


def _deployed(d: Path, wanted: list, table, pairs, gt, batch_size: int, out: Path, progress,
              seconds: dict[str, float], say):
    """Every wanted setting exported, run and evaluated on the validation images (timed into
    ``seconds``): the settings, and their detections per image id (for the pictures)."""
    t0 = time.perf_counter()
    detector, paths = _export_models(d / "model_final.pth", d / "config.yaml", wanted, table, out)
    seconds["export"] = time.perf_counter() - t0
    say(f"exported the {detector.num_classes}-class Mask R-CNN and inserted NorCal at gamma "
        f"{', '.join(f'{g:g}' for g in wanted[1:])} in {seconds['export']:.1f} s")

    t0 = time.perf_counter()
    settings: dict[float | None, Setting] = {}
    kept: dict[float | None, dict] = {}  # detections per image id, for the pictures
    for g in wanted:
        settings[g], kept[g] = _infer_and_eval(g, paths[g], pairs, gt, table, detector.topk, batch_size, out,
                                               progress)
    seconds["infer_and_eval"] = time.perf_counter() - t0
    return settings, kept


def _run_demo(data, out: Path, gammas, batch_size, pictures, progress, log) -> DemoResult:
    """The demo's work in the staged folder ``out``: table, sweeps, models, runs, plot, pictures."""
    from norcal.core.calibration.tables import build_table
    from norcal.workflows.tune import write_sweep_plot

    say = log or (lambda msg: None)
    grid = _demo_grid(gammas, batch_size, pictures)
    d = check_data_dir(data, progress)
    t_start = time.perf_counter()
    seconds: dict[str, float] = {}
    table = build_table(d / "train_annotations.json", name=f"{FIXTURE_NAME}_train")
    table.save(out / "table.json")
    # the validation GT is checked before the long work that comes before its use
    gt_data, gt, pairs = _validation_gt(d, table)
    tuning, validation = _sweeps(d, grid, table, progress, seconds, say)
    wanted = [None] + sorted({g for g in (tuning.best.gamma, validation.best.gamma) if g})
    settings, kept = _deployed(d, wanted, table, pairs, gt, batch_size, out, progress, seconds, say)

    tuned_g = tuning.best.gamma or None
    result = DemoResult(settings[None], settings[tuned_g], settings[validation.best.gamma or None],
                        tuning, validation, len(pairs), table.name, out, out / "ap_vs_gamma.png")
    write_sweep_plot(result.plot_path,
                     {"train": [(p.gamma, p.stats) for p in tuning.points],
                      "val": [(p.gamma, p.stats) for p in validation.points]},
                     best=tuning.best.gamma,
                     title=f"{FIXTURE_NAME} box AP ({tuning.num_images} / {len(pairs)} images)")
    if pictures and tuned_g is not None:
        t0 = time.perf_counter()
        result.pictures = _draw_pictures(gt_data, table, pairs, kept[None], kept[tuned_g], tuned_g, pictures,
                                         out / "pictures")
        seconds["pictures"] = time.perf_counter() - t0
    seconds["total"] = time.perf_counter() - t_start
    result.seconds = seconds
    return result


def _export_models(weights: Path, config: Path, wanted: list, table, out: Path):
    """The detector and one ONNX per setting (None: no NorCal), as out/model_<setting>.onnx."""
    from norcal.core.files.onnx_io import save_onnx
    from norcal.export.families import load_detector
    from norcal.export.graph.calibrate import calibrate_graph

    detector = load_detector(weights, config)
    plain = detector.export(None)  # the family's default graph (dynamic batch, checked)
    paths = {}
    for g in wanted:
        paths[g] = out / f"model_{_name(g)}.onnx"
        save_onnx(plain if g is None else calibrate_graph(plain, g, table), paths[g])
    return detector, paths


def _infer_and_eval(g, model: Path, pairs, gt, table, topk: int, batch_size: int, out: Path, progress):
    """One setting's model run over the validation images (results written), scored for box,
    mask and boundary AP; with its detections per image id."""
    from norcal.core.files.fileio import write_json
    from norcal.evaluation import evaluate, evaluate_fixed
    from norcal.runtime.backends import ONNXRUNTIME
    from norcal.runtime.inference import run_images
    from norcal.runtime.results import detections_to_results

    label = "baseline" if g is None else f"NorCal γ={g:g}"
    ids = {str(p): i for i, p in pairs}
    t1 = time.perf_counter()
    runner = ONNXRUNTIME.open(model)
    step = (lambda n: progress(label, n, len(pairs))) if progress is not None else None
    results, kept = [], {}
    for img_path, det in run_images(runner, [p for _, p in pairs], batch_size, on_done=step):
        kept[ids[str(img_path)]] = det
        results.extend(detections_to_results(ids[str(img_path)], det, table.category_ids))
    infer_s = time.perf_counter() - t1
    res_path = out / f"results_{_name(g)}.json"
    write_json(res_path, results, indent=None)
    if not results:
        raise NorcalError(f"{label}: no detections on any image")
    bbox = evaluate(gt, results, "bbox", topk)
    segm = evaluate(gt, results, "segm", topk)
    boundary = evaluate_fixed(gt, results, "boundary")
    return Setting(label, g, model, res_path, dict(bbox.stats), dict(segm.stats), len(results), infer_s,
                   dict(boundary.stats)), kept


def _draw_pictures(gt_data, table, pairs, baseline: dict, tuned: dict, gamma: float, count: int, folder: Path):
    """Side-by-side pictures (baseline, NorCal at ``gamma``) of the images that show the change best."""
    from norcal.runtime.images import read_rgb
    from norcal.workflows.pictures import gt_caption, gt_objects, pick_images, write_pictures

    objects = gt_objects(gt_data, table)
    chosen = pick_images(objects, table, baseline, tuned, count, DRAW)
    path_of = {i: p for i, p in pairs}
    return write_pictures(folder, [(str(i), read_rgb(path_of[i])) for i in chosen],
                          [[("baseline", baseline[i]), (f"NorCal γ={gamma:g}", tuned[i])] for i in chosen],
                          table, DRAW, [gt_caption(objects[i], table) for i in chosen])

