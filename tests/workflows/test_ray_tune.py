"""`norcal tune --ray`: the network pass on 2 Ray workers and the re-scoring and evaluation
distributed over the gammas give the single-process sweep, number for number (a local Ray
instance started here, 2 CPUs, no external service)."""

import json

import pytest

from conftest import SYNTH

ray = pytest.importorskip("ray", reason="needs the ray extra: pip install 'norcal-deploy[ray]'")
pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # two detectors load on Ray workers; ~1 min on 2 shared cores

IDS = list(range(100001, 100009))
GAMMAS = [0.0, 0.5, 1.0]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False)
    yield
    ray.shutdown()


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
    from norcal.export.detector import load_detector
    from norcal.workflows.tune import estimate_cache_bytes

    spec, _ = load_detector(SYNTH / "model_final.pth", SYNTH / "config.yaml")
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
