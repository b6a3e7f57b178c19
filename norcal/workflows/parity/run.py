"""Runners side by side: the same prepared batches to each, then the comparisons and AP."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.runner import Runner
from norcal.workflows.parity.compare import ParityReport, compare
from norcal.workflows.parity.floor import NoiseFloor, measure_floor, widened
from norcal.workflows.parity.tolerances import PRESETS, Tolerances, runner_precision


@dataclass
class ParityRun:
    """What :func:`run_parity` gives: every runner's concatenated outputs, its time, the
    reports (reference vs each other runner), and AP per runner when annotations were given."""

    names: list[str]
    outputs: dict[str, dict[str, np.ndarray]]
    seconds: dict[str, float]
    reports: list[ParityReport]
    images: int
    ap: dict[str, dict[str, float]] = field(default_factory=dict)
    floor: NoiseFloor | None = None  # the reference's own float noise, where a preset alone failed

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.reports)


def _concat(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not chunks:
        return {}
    out = {}
    for k in chunks[0]:
        try:
            out[k] = np.concatenate([c[k] for c in chunks], axis=0)
        except ValueError:
            raise NorcalError(f"output {k!r} changes shape between batches; cannot compare it") from None
    return out


def _only_images(gt, image_ids, split: str = "val"):
    """An annotation file or dict, validated (:data:`norcal.core.datasets.schemas.GROUND_TRUTH`), cut
    down to ``image_ids``: AP over the images that were run, not over a whole validation set
    most of which was never seen (a prepared LvisGT is kept; a data.yaml is read as its
    ``split``'s ground truth)."""
    from pathlib import Path

    from norcal.core.datasets.schemas import GROUND_TRUTH
    from norcal.core.datasets.yolo_ground_truth import read_annotations

    if isinstance(gt, (str, Path)):
        gt = read_annotations(gt, "annotations", GROUND_TRUTH, split)
    elif isinstance(gt, dict):
        gt = GROUND_TRUTH.validate(gt, "annotations")
    else:
        return gt
    keep = set(image_ids)
    out = dict(gt)
    out["images"] = [im for im in gt["images"] if im["id"] in keep]
    out["annotations"] = [a for a in gt["annotations"] if a["image_id"] in keep]
    return out


def _ap(outputs, batches, gt, image_ids, category_ids) -> dict[str, float]:
    """LVIS box AP of one runner's outputs (norcal.evaluation)."""
    from norcal.evaluation import evaluate
    from norcal.runtime.postprocess import split_outputs
    from norcal.runtime.results import detections_to_results

    results = []
    start = 0
    for sizes, originals, keep_empty, clip in batches:
        n = len(sizes)
        part = {k: v[start:start + n] for k, v in outputs.items()}
        for i, det in enumerate(split_outputs(part, sizes, originals, keep_empty, clip_boxes=clip)):
            results.extend(detections_to_results(image_ids[start + i], det, category_ids, with_masks=False))
        start += n
    if not results:
        return {}
    return dict(evaluate(gt, results, iou_type="bbox").stats)


def _fit_shape(feeds: dict[str, np.ndarray], fixed) -> dict[str, np.ndarray]:
    """Feeds grown to a fixed (B, H, W): repeat the last image, zero-pad H and W."""
    if not fixed:
        return feeds
    b, h, w = fixed
    images, sizes = feeds["images"], feeds["image_sizes"]
    if b and len(images) < b:
        extra = b - len(images)
        images = np.concatenate([images, np.repeat(images[-1:], extra, 0)])
        sizes = np.concatenate([sizes, np.repeat(sizes[-1:], extra, 0)])
    H, W = images.shape[2], images.shape[3]
    if (h and H > h) or (w and W > w):
        raise NorcalError(f"a resized image ({H}x{W} padded) does not fit the model's fixed input "
                          f"{h or H}x{w or W}")
    if (h and H < h) or (w and W < w):
        grown = np.zeros(images.shape[:2] + (h or H, w or W), images.dtype)
        grown[:, :, :H, :W] = images
        images = grown
    return {"images": images, "image_sizes": sizes}


def _run_batches(runners: Sequence[Runner], prepared, fixed_shape, on_batch, seconds: dict[str, float]):
    """Every runner over the prepared batches: (outputs by runner name, each batch's sizes),
    each runner's time added to ``seconds``."""
    chunks: dict[str, list] = {r.name: [] for r in runners}
    batches = []
    done = 0
    for batch in prepared:
        n = len(batch)
        done += n
        batches.append((batch.image_sizes, batch.original_sizes, batch.keep_empty_boxes, batch.clip_boxes))
        feeds = _fit_shape(batch.feeds(), fixed_shape)
        for r in runners:
            t0 = time.perf_counter()
            # copies: a runner must not see another's in-place changes to the feeds
            out = r.infer({k: v.copy() for k, v in feeds.items()})
            seconds[r.name] = seconds.get(r.name, 0.0) + time.perf_counter() - t0
            chunks[r.name].append({k: np.asarray(v)[:n] for k, v in out.items()})
            if on_batch:
                on_batch(r.name, done)
    return {n: _concat(c) for n, c in chunks.items()}, batches


def _judge(outputs, ref: str, name: str, tol: Tolerances, score_thresh: float, ap) -> ParityReport:
    """``name``'s outputs against the reference's at ``tol``, AP included where measured."""
    rep = compare(outputs[ref], outputs[name], tol, reference_name=ref, candidate_name=name,
                  score_thresh=score_thresh)
    for k in ("AP", "APr", "APc", "APf") if ap else ():
        a, b = ap[ref].get(k, -1.0), ap[name].get(k, -1.0)
        rep.ap[k] = (a, b)
        if a >= 0 and b >= 0 and abs(a - b) > tol.ap_atol:
            rep.failures.append(f"{k}: {a:.4f} vs {b:.4f}, differs by {abs(a - b):.4f} > {tol.ap_atol:g}")
    return rep


def _checked_setup(runners, images_rgb, spec, min_size, max_size, input_format, divisibility,
                   batch_size, fixed_shape, gt, image_ids, split):
    """The preprocessing and batch size a parity run uses, once its arguments pass; refused
    before any runner runs, in the order callers rely on (runners, sizes, batch size, images,
    AP inputs)."""
    from norcal.core.contract import Preprocessing
    from norcal.runtime.inference import prepared_batches

    if len(runners) < 2:
        raise NorcalError("parity needs at least two runners")
    names = [r.name for r in runners]
    if len(set(names)) != len(names):
        raise NorcalError(f"runner names must differ to tell them apart: {', '.join(names)}")
    if spec is None:
        if min_size is None or max_size is None:
            raise NorcalError("parity needs min_size and max_size, or spec", param=("min_size", "max_size"))
        spec = Preprocessing(min_size, max_size, input_format, divisibility)
    prepared_batches(images_rgb, spec, batch_size)  # refuses a bad batch_size now
    if fixed_shape and fixed_shape[0]:  # the model's fixed batch wins
        batch_size = int(fixed_shape[0])
    if not images_rgb:
        raise NorcalError("parity needs at least one image")
    if gt is not None and (image_ids is None or len(image_ids) != len(images_rgb)):
        raise NorcalError("AP needs one image id per image")
    if gt is not None:
        from norcal.core.datasets.yolo_ground_truth import check_split

        check_split(split)
    return spec, batch_size


def _ap_by_runner(names, outputs, batches, gt, image_ids, category_ids, split) -> dict[str, dict[str, float]]:
    """Box AP per runner over the images run ({} without annotations)."""
    if gt is None:
        return {}
    from norcal.evaluation import prepare_gt

    gt = prepare_gt(_only_images(gt, image_ids, split))
    return {n: _ap(outputs[n], batches, gt, list(image_ids), category_ids) for n in names}


def _noise_floor(noise_runner, reference: dict[str, np.ndarray], score_thresh: float,
                 rerun: Callable[[Runner], dict[str, dict[str, np.ndarray]]]) -> NoiseFloor | None:
    """How far the reference's outputs sit from its precise rerun; None where the noise
    runner's maker gives none. ``rerun(runner)``: that runner's outputs over the same batches."""
    if not hasattr(noise_runner, "infer"):
        noise_runner = noise_runner()
    if noise_runner is None:
        return None
    precise = rerun(noise_runner)
    return measure_floor(reference, precise[noise_runner.name], noise_runner.name, score_thresh)


def _judge_floored(reports: list[ParityReport], floored: list[int], outputs, names, presets,
                   floor: NoiseFloor | None, score_thresh: float, ap) -> None:
    """The floored candidates' reports, in place: with a floor, judged again against it;
    without, marked as passed within their preset where they did."""
    ref = names[0]
    for i in floored:
        preset = presets[names[i + 1]]
        if floor is not None:
            reports[i] = _judge(outputs, ref, names[i + 1], widened(preset, floor), score_thresh, ap)
        if floor is not None or reports[i].passed:
            reports[i].preset, reports[i].floor = preset, floor


def run_parity(runners: Sequence[Runner], images_rgb: Sequence[np.ndarray], *, min_size: int | None = None,
               max_size: int | None = None, input_format: str = "BGR", divisibility: int = 32,
               spec=None, batch_size: int = 1,
               tolerances: dict[str, Tolerances] | None = None, score_thresh: float = 0.0,
               gt=None, image_ids: Sequence | None = None, category_ids: list[int] | None = None,
               fixed_shape: tuple[int | None, int | None, int | None] | None = None,
               on_batch: Callable[[str, int], None] | None = None, split: str = "val",
               noise_runner: Runner | Callable[[], Runner | None] | None = None) -> ParityRun:
    """Feed the same prepared batches to every runner; compare runners[0] with each other one.

    images_rgb: RGB uint8 [H,W,3] arrays. tolerances: runner name -> Tolerances (default: the
    preset :func:`runner_precision` picks). gt (an LVIS/COCO annotation path, an Ultralytics
    data.yaml read as its ``split``, or a prepared LvisGT) with ``image_ids`` (one per image)
    adds box AP per runner, judged by ``ap_atol``.
    fixed_shape: (B, H, W) of a model exported with fixed dimensions (None where dynamic):
    a short last batch is filled by repeating its last image (those outputs are dropped) and
    images are zero-padded to H x W, for every runner alike. ``spec`` (a
    :class:`norcal.core.contract.Preprocessing`, e.g. a letterbox) replaces the size settings.
    ``on_batch(runner_name, images_done)`` is called after each batch (progress bars).
    noise_runner: the reference run more precisely (the family's
    :meth:`~norcal.export.families.base.Detector.noise_runner`), or a function making it. Every
    candidate is judged at its preset first; only where one whose preset has a floor factor
    (fp32) fails there is the noise runner made and run over the same batches, and those
    candidates are judged again with their score and box tolerances widened to the measured
    floor (:mod:`norcal.workflows.parity.floor`).
    """
    from norcal.runtime.inference import prepared_batches

    spec, batch_size = _checked_setup(runners, images_rgb, spec, min_size, max_size, input_format,
                                      divisibility, batch_size, fixed_shape, gt, image_ids, split)
    names = [r.name for r in runners]
    presets = {r.name: (tolerances or {}).get(r.name) or PRESETS[runner_precision(r)] for r in runners[1:]}
    seconds: dict[str, float] = {r.name: 0.0 for r in runners}

    def run(some: Sequence[Runner]):
        return _run_batches(some, prepared_batches(images_rgb, spec, batch_size), fixed_shape, on_batch,
                            seconds)

    outputs, batches = run(runners)
    ref = names[0]
    ap = _ap_by_runner(names, outputs, batches, gt, image_ids, category_ids, split)
    reports = [_judge(outputs, ref, n, presets[n], score_thresh, ap) for n in names[1:]]
    floored = [i for i, n in enumerate(names[1:]) if presets[n].floor_factor] if noise_runner is not None else []
    floor = None
    if any(not reports[i].passed for i in floored):
        # the preset alone fails: measure how far the reference sits from its precise rerun
        floor = _noise_floor(noise_runner, outputs[ref], score_thresh, lambda r: run([r])[0])
    _judge_floored(reports, floored, outputs, names, presets, floor, score_thresh, ap)
    return ParityRun(names, outputs, seconds, reports, len(images_rgb), ap, floor)


def fixed_input_shape(runner: Runner) -> tuple[int | None, int | None, int | None] | None:
    """(B, H, W) of an ONNX Runtime runner's ``images`` input where fixed (None where dynamic);
    None when all are dynamic or the runner does not say."""
    session = getattr(runner, "session", None)
    if session is None:
        return None
    dims = next((i.shape for i in session.get_inputs() if i.name == "images"), None)
    if not dims or len(dims) != 4:
        return None
    fixed = tuple(d if isinstance(d, int) and d > 0 else None for d in (dims[0], dims[2], dims[3]))
    return fixed if any(fixed) else None


def model_score_thresh(metadata: dict[str, str]) -> float:
    """The test score threshold a model records (``norcal.detector``'s score_thresh_test);
    0 when it says none (then only a zero score may be missing on one side)."""
    import json

    from norcal.core.contract import DETECTOR

    try:
        return float(json.loads(metadata.get(DETECTOR, "{}")).get("score_thresh_test", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0.0
