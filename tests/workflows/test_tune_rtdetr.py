"""norcal tune on an Ultralytics RT-DETR checkpoint: the sweep runs end to end through the
RT-DETR detector's cache and re-scoring, and its gamma-0 detections are those of ``norcal infer``
on the gamma-0 export (the host's own stretch and box mapping on both sides)."""

from __future__ import annotations

import pytest

from yolo_models import IMAGES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR
from test_tune_yolo import _gamma_0_is_infer, _gt, _tune_sweep  # noqa: E402 - the same hand-written GT (6 classes)


@pytest.mark.slow
def test_tune_rtdetr_checkpoint_end_to_end_and_gamma_0_is_infer(yolo_work, tmp_path):
    from norcal.export.families.ultralytics.rtdetr import RtdetrDetector

    best, gt, images, table, res = _tune_sweep(yolo_work.rtdetr, yolo_work.table, tmp_path)
    assert all(p["num_detections"] > 0 for p in res["sweep"])
    # NorCal moves the sweep: its gammas do not all give the same detections
    assert len({(p["num_detections"], p["stats"]["AP"]) for p in res["sweep"]}) > 1

    plan, cache = _gamma_0_is_infer(best, gt, images, table, tmp_path)
    assert isinstance(plan.detector, RtdetrDetector)
    assert len(cache) == 4 and plan.detector.cache_bytes(4, 2) >= cache.nbytes


@pytest.mark.slow
def test_tune_rtdetr_on_two_ray_workers_gives_the_single_process_sweep(yolo_work, tmp_path, local_ray):
    """As for YOLO: the workers cache with the RT-DETR detector's methods, the driver's gammas
    re-score the joined caches: the sweep is the single process's, number for number."""
    from norcal.export.families import load_detector
    from test_ray_tune import tune_here_and_on_ray

    gt = _gt(tmp_path / "gt.json")
    per_image = load_detector(yolo_work.rtdetr).cache_bytes(1, 3)
    args = (yolo_work.rtdetr, gt, IMAGES[0].parent, [0.0, 0.5, 1.0], str(yolo_work.table))
    kwargs = dict(batch_size=1, max_cache_bytes=2 * per_image)  # 2 chunks of 2 one-image batches
    want, got = tune_here_and_on_ray(args, kwargs)
    assert [(p.gamma, p.num_detections, p.stats) for p in got.points] == \
        [(p.gamma, p.num_detections, p.stats) for p in want.points]
    # 300 detections per image at every gamma (no score cut): NorCal shows in the AP
    assert got.best.gamma == want.best.gamma and len({p.stats["AP"] for p in got.points}) > 1
