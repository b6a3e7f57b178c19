"""`norcal infer --ray`: the bundled example's model on a local Ray instance (started here,
2 CPUs, no external service) gives the single-process results file byte for byte, in image
order whichever worker finishes first, and survives a worker that raises or dies once.

The reference is always the single-process run of the same exported graph (ONNX Runtime, 1
intra-op thread), never values pasted from an earlier run.
"""

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray

# each Ray Data run starts its actors (~10-20 s on 2 shared cores); the module takes ~2 min
pytestmark = pytest.mark.slow

from conftest import SYNTH  # noqa: E402
from norcal.cli import main  # noqa: E402
from norcal.core.contract import input_spec  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.runtime.inference import prepare  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.runtime.ray_inference import RayOptions, ResultsFormat, run_images_ray  # noqa: E402
from norcal.runtime.runners import open_runner  # noqa: E402

SYNTH_VAL = SYNTH / "val"
IMAGES = sorted(SYNTH_VAL.glob("*.png"))[:8]
BATCH = 2

# the fault-injecting runners below travel to the Ray workers by value (tests/ is not on
# the workers' path)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def synth_onnx(tmp_path_factory):
    """The bundled example's checkpoint exported as `norcal demo` exports it (plain softmax)."""
    import onnx

    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    d = SYNTH_VAL.parent
    spec, model = load_model(d / "model_final.pth", d / "config.yaml")
    path = tmp_path_factory.mktemp("synth") / "synth.onnx"
    onnx.save(export_detector(model, spec), path)
    return path


@pytest.fixture(scope="module")
def single(synth_onnx, tmp_path_factory):
    """The single-process results file (1 ONNX Runtime thread) the Ray runs must equal."""
    out = tmp_path_factory.mktemp("single") / "results.json"
    assert main(["infer", str(synth_onnx), *map(str, IMAGES), "--batch", str(BATCH), "--threads", "1",
                 "-o", str(out)]) == 0
    return out


class FaultyRunner:
    """An ONNX Runtime runner that misbehaves on purpose, once over all workers (a marker file
    says it happened): ``mode`` 'raise' raises, 'die' kills the worker process, 'slow' holds
    it until another worker has logged a batch, on the batch whose images sum to ``target``;
    every call is logged (end time, sum)."""

    def __init__(self, model, folder, mode, target, always=False):
        self.runner = open_runner(model, "cpu", 1)
        self.folder, self.mode, self.target, self.always = Path(folder), mode, target, always
        self.metadata, self.output_names = self.runner.metadata, self.runner.output_names

    def infer(self, feeds):
        key = float(feeds["images"].sum())
        if key == self.target and (self.always or self._first()):
            if self.mode == "raise":
                raise RuntimeError("injected fault")
            if self.mode == "die":
                os._exit(1)
            self._wait_for_another()
        out = self.runner.infer(feeds)
        with open(self.folder / "calls.log", "a") as f:
            f.write(f"{time.time()} {key}\n")
        return out

    def _wait_for_another(self, limit_s: float = 300.0):
        """Hold this batch until a later one is done (the order forced, not left to timing);
        past ``limit_s`` it goes on, and the test's check of the log fails."""
        log = self.folder / "calls.log"
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            lines = log.read_text().split("\n")[:-1] if log.exists() else []  # whole lines only
            if any(float(line.split()[1]) != self.target for line in lines):
                return
            time.sleep(0.05)

    def _first(self):
        try:
            with open(self.folder / "fired", "x"):
                return True
        except FileExistsError:
            return False


def batch_key(k: int, model) -> float:
    """The pixel sum of planned batch k as the host prepares it (how FaultyRunner spots it)."""
    spec = input_spec(open_runner(model, "cpu", 1).metadata)
    return float(prepare([read_rgb(p) for p in IMAGES[k * BATCH:(k + 1) * BATCH]], spec).images.sum())


def run_faulty(model, folder, mode, k, out, always=False, retries=3):
    """run_images_ray with FaultyRunner workers, written to ``out`` as `norcal infer` writes."""
    from norcal.runtime.results import results_writer

    make = functools.partial(FaultyRunner, model, folder, mode, batch_key(k, model), always)
    spec = input_spec(open_runner(model, "cpu", 1).metadata)
    ids = [int(p.stem) for p in IMAGES]
    with results_writer(out) as w:
        for image in run_images_ray(make, IMAGES, ids, spec, ResultsFormat(None, True), BATCH,
                                    RayOptions(num_workers=2, max_retries=retries)):
            w.add(image.text, image.count)


def test_two_workers_equal_single_process_byte_for_byte(local_ray, synth_onnx, single, tmp_path, capsys):
    out = tmp_path / "ray.json"
    assert main(["infer", str(synth_onnx), *map(str, IMAGES), "--batch", str(BATCH), "--ray",
                 "--num-workers", "2", "-o", str(out)]) == 0
    assert "on Ray (default address, 2 workers)" in capsys.readouterr().err
    assert out.read_bytes() == single.read_bytes()
    res = json.loads(out.read_text())
    assert len(res) == 8 * 300 and [r["image_id"] for r in res[::300]] == [int(p.stem) for p in IMAGES]


def test_order_is_input_order_when_the_first_batch_finishes_last(local_ray, synth_onnx, single, tmp_path):
    run_faulty(synth_onnx, tmp_path, "slow", 0, tmp_path / "ray.json")
    log = [line.split() for line in (tmp_path / "calls.log").read_text().splitlines()]
    first = {float(key): float(t) for t, key in log}[batch_key(0, synth_onnx)]
    assert any(float(t) < first for t, _ in log)  # a later batch did arrive first (forced)
    assert (tmp_path / "ray.json").read_bytes() == single.read_bytes()


@pytest.mark.parametrize("mode", ["raise", "die"])
def test_a_worker_failing_once_is_retried_and_the_output_complete(local_ray, synth_onnx, single, tmp_path,
                                                                  mode):
    run_faulty(synth_onnx, tmp_path, mode, 2, tmp_path / "ray.json")
    assert (tmp_path / "fired").exists()  # the fault did happen
    assert (tmp_path / "ray.json").read_bytes() == single.read_bytes()


def test_a_batch_that_always_fails_is_one_line_and_nothing_is_written(local_ray, synth_onnx, tmp_path):
    out = tmp_path / "ray.json"
    with pytest.raises(NorcalError) as e:
        run_faulty(synth_onnx, tmp_path, "raise", 1, out, always=True, retries=1)
    msg = str(e.value)
    assert "\n" not in msg and e.value.param == "max_retries"
    assert msg == (f"a Ray worker failed on {IMAGES[2]} (and 1 more images of its batch): "
                   "RuntimeError: injected fault after 1 retry")
    assert not out.exists() and not list(tmp_path.glob(".ray.json.*"))


def test_an_undecodable_image_is_named_in_one_line_and_nothing_is_written(local_ray, synth_onnx, tmp_path,
                                                                         capsys):
    from PIL import Image

    # a JPEG whose header is sound (the up-front check passes) but whose body is cut off
    bad = tmp_path / "imgs" / "100099.jpg"
    bad.parent.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(bad)
    bad.write_bytes(bad.read_bytes()[:400])
    out = tmp_path / "ray.json"
    argv = ["infer", str(synth_onnx), str(IMAGES[0]), str(bad), "--ray", "--num-workers", "2",
            "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {bad.resolve()}: cannot read the image (")
    assert "--skip-unreadable" in err[-1]
    assert not out.exists()
    assert main([*argv, "--skip-unreadable"]) == 0  # skipped, listed, the rest written
    assert [s["file"] for s in json.loads((tmp_path / "ray.skipped.json").read_text())["skipped"]] == \
        [str(bad.resolve())]
    assert {r["image_id"] for r in json.loads(out.read_text())} == {int(IMAGES[0].stem)}


def test_without_ray_nothing_imports_ray(synth_onnx, tmp_path):
    code = ("import sys; from norcal.cli import main; "
            f"rc = main(['infer', {str(synth_onnx)!r}, {str(IMAGES[0])!r}, "
            f"'-o', {str(tmp_path / 'r.json')!r}]); "
            "assert rc == 0, rc; assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


@pytest.mark.parametrize("missing", ["ray", "ray.data"])
def test_missing_ray_is_one_line_naming_the_extra(missing, monkeypatch, tmp_path, capsys, synth_onnx):
    # Ray is installed here: a None entry makes `import ray` (or Ray Data alone) fail as if not
    monkeypatch.setitem(sys.modules, missing, None)
    assert main(["infer", str(synth_onnx), str(IMAGES[0]), "--ray", "-o", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err == ("error: running on Ray needs the optional package ray[data], which is not installed: "
                   "pip install 'norcal-deploy[ray]'\n")


def test_ray_flags_without_ray_are_refused(synth_onnx, tmp_path, capsys):
    assert main(["infer", str(synth_onnx), str(IMAGES[0]), "--num-workers", "2",
                 "-o", str(tmp_path / "r.json")]) == 2
    assert "--num-workers only apply with --ray" in capsys.readouterr().err
