"""`norcal tune --ray`: the network pass on 2 Ray workers and the re-scoring and evaluation
distributed over the gammas give the single-process sweep, number for number (a local Ray
instance started here, 2 CPUs, no external service)."""

import json
import os
import sys
from pathlib import Path

import pytest
import ray

from conftest import SYNTH

pytestmark = pytest.mark.slow  # detectors load on Ray workers; ~1 min on 2 shared cores

IDS = list(range(100001, 100009))
GAMMAS = [0.0, 0.5, 1.0]


# the dying worker below travels to Ray by value (tests/ is not on the workers' path)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def tune_here_and_on_ray(args, kwargs):
    """The same sweep in this process (one torch thread, as each worker has) and on two Ray
    workers: (here, on Ray)."""
    import torch

    from norcal.runtime.ray_inference import RayOptions
    from norcal.workflows.ray_tune import tune_ray
    from norcal.workflows.tune import tune

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = tune(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)
    return want, tune_ray(*args, **kwargs, options=RayOptions(num_workers=2))


@pytest.fixture(scope="module")
def subset_gt(tmp_path_factory):
    """val.json restricted to 8 images (LVIS fields kept)."""
    data = json.loads((SYNTH / "val.json").read_text())
    data["images"] = [im for im in data["images"] if im["id"] in IDS]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in IDS]
    path = tmp_path_factory.mktemp("gt") / "val8.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def budget():
    """A cache budget of 4 images: the 8 images go through as 2 chunks of 2 batches."""
    from norcal.export.families.detectron2.loader import load_model
    from norcal.export.families.detectron2.family import estimate_cache_bytes

    spec, _ = load_model(SYNTH / "model_final.pth", SYNTH / "config.yaml")
    return 4 * estimate_cache_bytes(spec, 1)


@pytest.fixture(scope="module")
def single(subset_gt, budget):
    """The single-process sweep, torch on 1 thread as each Ray worker runs it."""
    import torch

    from norcal.workflows.tune import tune

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return tune(SYNTH / "model_final.pth", subset_gt, SYNTH / "val", GAMMAS,
                    SYNTH / "train_annotations.json", config=SYNTH / "config.yaml", batch_size=2,
                    max_cache_bytes=budget)
    finally:
        torch.set_num_threads(threads)


def test_two_workers_give_the_single_process_sweep(local_ray, subset_gt, budget, single, tmp_path, capsys):
    from norcal.cli import main

    out = tmp_path / "sweep.json"
    rc = main(["tune", str(SYNTH / "model_final.pth"), "--config", str(SYNTH / "config.yaml"),
               "--gt", str(subset_gt), "--images", str(SYNTH / "val"), "--table",
               str(SYNTH / "train_annotations.json"), "--gammas", ",".join(map(str, GAMMAS)),
               "--batch", "2", "--max-cache-gb", str(budget / 2**30), "--json", str(out),
               "--ray", "--num-workers", "2"])
    assert rc == 0, capsys.readouterr().err
    got = json.loads(out.read_text())
    want = single.to_json()
    assert got["best"] == want["best"] and got["num_images"] == want["num_images"] == 8
    for a, b in zip(got["sweep"], want["sweep"], strict=True):
        assert a["gamma"] == b["gamma"] and a["num_detections"] == b["num_detections"]
        assert a["stats"] == b["stats"]  # every number, exactly
    assert "on Ray" in capsys.readouterr().out



def dying_worker(marker: Path, image_id: int):
    """A tune worker whose process exits on the network batch holding ``image_id``, once over
    all workers (a marker file says it happened)."""
    from norcal.workflows.ray_tune import _TuneWorker

    class DyingWorker(_TuneWorker):
        def cache(self, pairs, *args):
            if any(i == image_id for i, _ in pairs) and not marker.exists():
                marker.touch()
                os._exit(1)
            return super().cache(pairs, *args)

    return DyingWorker


def test_a_worker_killed_in_the_network_pass_is_replaced_and_the_sweep_unchanged(
        local_ray, subset_gt, budget, single, tmp_path, monkeypatch):
    from norcal.runtime.ray_inference import RayOptions
    from norcal.workflows import ray_tune

    marker = tmp_path / "died"
    monkeypatch.setattr(ray_tune, "_TuneWorker", dying_worker(marker, IDS[5]))
    got = ray_tune.tune_ray(SYNTH / "model_final.pth", subset_gt, SYNTH / "val", GAMMAS,
                            SYNTH / "train_annotations.json", config=SYNTH / "config.yaml", batch_size=2,
                            max_cache_bytes=budget, options=RayOptions(num_workers=2))
    assert marker.exists()  # the worker did die
    assert [(p.gamma, p.num_detections, p.stats) for p in got.points] == \
        [(p.gamma, p.num_detections, p.stats) for p in single.points]



def test_a_batch_that_always_fails_is_one_line_naming_its_first_image(local_ray, subset_gt, budget,
                                                                       monkeypatch):
    from norcal.core.errors import NorcalError
    from norcal.runtime.ray_inference import RayOptions
    from norcal.workflows import ray_tune

    class FailingWorker(ray_tune._TuneWorker):
        """The detector itself fails on the batch holding IDS[2], every time."""

        def cache(self, pairs, *args):
            def fail(*a, **k):
                raise RuntimeError("injected fault")

            if any(i == IDS[2] for i, _ in pairs):
                self.model.inference = fail
            try:
                return super().cache(pairs, *args)
            finally:
                self.model.__dict__.pop("inference", None)

    monkeypatch.setattr(ray_tune, "_TuneWorker", FailingWorker)
    with pytest.raises(NorcalError) as e:
        ray_tune.tune_ray(SYNTH / "model_final.pth", subset_gt, SYNTH / "val", GAMMAS,
                          SYNTH / "train_annotations.json", config=SYNTH / "config.yaml", batch_size=2,
                          max_cache_bytes=budget, options=RayOptions(num_workers=2, max_retries=1))
    assert str(e.value) == (f"a Ray worker failed on {SYNTH / 'val' / f'{IDS[2]}.png'} (and 1 more images "
                            "of its batch): RuntimeError: injected fault after 1 retry")


@pytest.fixture(scope="module")
def retina_gt(tmp_path_factory):
    """RetinaNet fixture: a GT from detectron2's baseline detections (top 15 per image), the
    table from the fixture's manifest counts."""
    import golden as G
    from conftest import FIXTURES

    fixture = FIXTURES / "d2_retinanet_tiny"
    path = G.gt_from_golden(fixture, tmp_path_factory.mktemp("retina") / "gt.json")
    return fixture, G.manifest_table(fixture), path


def test_retinanet_candidates_on_two_workers_give_the_single_process_sweep(local_ray, retina_gt):
    """RetinaNet caches each gamma's candidates in the network pass: the workers do that too."""
    fixture, table, gt = retina_gt
    args = (fixture / "model_final.pth", gt, fixture / "images", [0.0, 0.5, 1.0], table)
    kwargs = dict(config=fixture / "config.yaml", batch_size=1)
    want, got = tune_here_and_on_ray(args, kwargs)
    assert [(p.gamma, p.num_detections, p.stats) for p in got.points] == \
        [(p.gamma, p.num_detections, p.stats) for p in want.points]
    assert got.best.gamma == want.best.gamma and len({p.stats["AP"] for p in got.points}) > 1
