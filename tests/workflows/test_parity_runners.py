"""norcal.workflows.parity.runners: which runners a parity request opens, judged how."""

import numpy as np
import pytest

from conftest import TINY
from norcal.core.errors import NorcalError
from norcal.runtime import backends
from norcal.runtime.backends import Backend, backend_named
from norcal.workflows.parity import Candidate, ParityRequest, build_runners

CKPT, CFG = TINY / "model_final.pth", TINY / "config.yaml"


@pytest.fixture(scope="module")
def g05(tmp_path_factory):
    """The tiny detector exported with NorCal at gamma 0.5."""
    from norcal.core.files.onnx_io import save_onnx
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    spec, model = load_model(CKPT, CFG)
    path = tmp_path_factory.mktemp("runners") / "g05.onnx"
    save_onnx(calibrate_graph(export_detector(model, spec), 0.5), path)
    return path


@pytest.mark.parametrize("kwargs, message, params", [
    ({"batch_size": 0}, "batch_size must be >= 1, got 0", ("batch_size",)),
    ({"config": "c.yaml"}, "config goes with checkpoint", ("config", "checkpoint")),
    ({"checkpoint": "m.pth", "engine_precision": "fp16"}, "no engine given", ("engine_precision", "engine")),
    ({"engine": "e.engine", "engine_precision": "bf16"}, "must be one of fp32, tf32, fp16, int8",
     ("engine_precision",)),
    ({}, "nothing to compare ONNX Runtime with", ("checkpoint", "engine")),
    ({"candidates": (Candidate("m.fake", "bf16"),)}, "candidates: precision must be one of fp32, tf32, fp16, "
     "int8, got 'bf16' for m.fake", ("candidates",)),
])
def test_request_errors_name_parameters(tmp_path, kwargs, message, params):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    with pytest.raises(NorcalError, match=message) as e:
        ParityRequest(model, **kwargs).check()
    assert e.value.params == params and "--" not in str(e.value)
    with pytest.raises(NorcalError, match="no such file"):
        ParityRequest(tmp_path / "none.onnx", checkpoint=CKPT).check()


def test_checkpoint_is_the_reference_with_the_onnx_prior(g05):
    stages = []

    class Stage:
        def __init__(self, description):
            stages.append(description)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    built = build_runners(ParityRequest(g05, checkpoint=CKPT, config=CFG, batch_size=2), stage=Stage)
    assert [r.name for r in built.runners] == ["pytorch", "onnxruntime-cpu"]
    assert built.reference is built.runners[0] and built.onnx is built.runners[1]
    assert {n: t.precision for n, t in built.tolerances.items()} == {"pytorch": "fp32", "onnxruntime-cpu": "fp32"}
    assert "NorCal gamma 0.5" in built.calibration.describe()
    assert built.batch_size == 2 and built.notes == [] and stages == ["loading the PyTorch model"]
    assert (built.spec.min_size, built.spec.max_size) == (320, 512)  # the tiny config's test sizes


def test_an_engine_without_tensorrt_is_a_note(g05, tmp_path, monkeypatch):
    engine = tmp_path / "x.engine"
    with pytest.raises(NorcalError, match="no such engine file"):
        build_runners(ParityRequest(g05, engine=engine))
    engine.write_bytes(b"not run")
    monkeypatch.setattr(backend_named("tensorrt"), "unavailable", lambda: "no CUDA GPU is visible")
    with pytest.raises(NorcalError, match="nothing left to compare") as e:
        build_runners(ParityRequest(g05, engine=engine))
    assert e.value.params == ("checkpoint",)
    built = build_runners(ParityRequest(g05, checkpoint=CKPT, config=CFG, engine=engine))
    assert [r.name for r in built.runners] == ["pytorch", "onnxruntime-cpu"]
    assert built.notes == ["TensorRT not compared (no CUDA GPU is visible); x.engine was not run"]


class FixedRunner:
    """A runner of a backend the registry does not ship: fixed outputs, no metadata."""

    def __init__(self, path, provider, threads):
        self.name, self.metadata = "fake-host", {}
        self.input_names, self.output_names = ["images", "image_sizes"], ["num_detections"]

    def infer(self, feeds):
        return {"num_detections": np.zeros(len(feeds["images"]), np.int64)}


def test_candidates_are_opened_by_their_registered_backend(g05, tmp_path, monkeypatch):
    fake = Backend(name="fake", title="Fake", suffixes=(".fake",), expected="a fake model (.fake)",
                   providers=(None, "host"), gpu_providers=(), cpu_provider="host", opener=FixedRunner,
                   parity_precision="fp16")
    monkeypatch.setattr(backends, "BACKENDS", [*backends.BACKENDS, fake])
    model = tmp_path / "m.fake"
    with pytest.raises(NorcalError, match="m.fake: no such model file"):
        build_runners(ParityRequest(g05, candidates=(Candidate(model),)))
    model.write_bytes(b"fixed")
    built = build_runners(ParityRequest(g05, candidates=(Candidate(model),)))
    assert [r.name for r in built.runners] == ["onnxruntime-cpu", "fake-host"] and built.notes == []
    assert {n: t.precision for n, t in built.tolerances.items()} == {"onnxruntime-cpu": "fp32", "fake-host": "fp16"}
    built = build_runners(ParityRequest(g05, candidates=(Candidate(model, "int8"),)))
    assert built.tolerances["fake-host"].precision == "int8"
    monkeypatch.setattr(fake, "unavailable", lambda: "no fake device")
    with pytest.raises(NorcalError, match="^nothing left to compare: Fake is unavailable and no checkpoint was given$"):
        build_runners(ParityRequest(g05, candidates=(Candidate(model),)))
    built = build_runners(ParityRequest(g05, checkpoint=CKPT, config=CFG, candidates=(Candidate(model),)))
    assert built.notes == ["Fake not compared (no fake device); m.fake was not run"]
