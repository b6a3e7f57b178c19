"""The runtime backend registry: each backend opens its own suffixes, open_runner asks only the
registry, and a backend added to it is opened with no other code change."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from norcal.core.errors import NorcalError
from norcal.core.runner import BaseRunner
from norcal.runtime import backends
from norcal.runtime.backends import BACKENDS, Backend, backend_for, backend_named, needs_gpu
from norcal.runtime.runners import open_runner
from norcal.workflows.parity import runner_precision

TODAY = "expected .onnx or a TensorRT engine (.engine, .plan, .trt)"


def test_every_suffix_maps_to_its_backend():
    assert [b.name for b in BACKENDS] == ["onnxruntime", "tensorrt"]
    assert backend_named("onnxruntime").suffixes == (".onnx",)
    assert backend_named("tensorrt").suffixes == (".engine", ".plan", ".trt")
    for b in BACKENDS:
        for suffix in b.suffixes:
            assert backend_for(f"dir.x/model{suffix}") is b
            assert backend_for(f"MODEL{suffix.upper()}") is b
    every = [s for b in BACKENDS for s in b.suffixes]
    assert len(every) == len(set(every))  # no suffix claimed twice
    assert backend_for("model.pt") is None and backend_for("model") is None
    with pytest.raises(NorcalError, match="^unknown backend 'tpu'; choose one of onnxruntime, tensorrt$"):
        backend_named("tpu")


def test_triton_uses_the_one_engine_suffix_list():
    from norcal.runtime import triton

    assert triton.ENGINE_SUFFIXES is backend_named("tensorrt").suffixes


@pytest.mark.parametrize("name, shown", [("model.pt", "'.pt'"), ("model", "'(no suffix)'"),
                                         ("model.ONNX.bak", "'.bak'")])
def test_unknown_suffix_keeps_the_message(tmp_path, name, shown):
    path = tmp_path / name
    with pytest.raises(NorcalError) as e:
        open_runner(path)
    assert str(e.value) == f"{path}: unknown model type {shown}; {TODAY}"


@pytest.mark.parametrize("model, provider, gpu", [
    ("m.onnx", "cpu", False), ("m.onnx", "auto", False), ("m.onnx", None, False), ("m.onnx", "cuda", True),
    ("m.onnx", "tensorrt", True), ("m.engine", "auto", True), ("m.plan", None, True), ("m.trt", "cpu", True),
    ("m.pt", "cuda", False)])
def test_gpu_need_comes_from_the_backend(model, provider, gpu):
    assert needs_gpu(model, provider) is gpu


def test_engine_refuses_an_onnx_provider_and_opens_only_with_tensorrt(tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"x")
    with pytest.raises(NorcalError, match=r"^m.engine is a TensorRT engine; provider cpu applies to .onnx models$") \
            as e:
        open_runner(engine, "cpu")
    assert e.value.params == ("provider",)
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed: the engine test in test_tensorrt.py runs it")
    with pytest.raises(NorcalError, match="cannot run TensorRT engine .*m.engine: TensorRT's Python"):
        open_runner(engine)


class FixedRunner(BaseRunner):
    """A runner whose outputs are fixed: one detection per image."""

    def __init__(self, path: Path, provider, threads):
        self.path, self.provider, self.threads = path, provider, threads
        self.name, self.metadata = f"fake-{provider or 'host'}", {}
        self.input_names, self.output_names = ["images", "image_sizes"], ["num_detections", "boxes"]

    def infer_impl(self, feeds):
        batch = len(feeds["images"])
        return {"num_detections": np.ones(batch, np.int64),
                "boxes": np.tile(np.array([[[1, 2, 3, 4]]], np.float32), (batch, 1, 1))}


FAKE = Backend(name="fake", title="Fake", suffixes=(".fake",), expected="a fake model (.fake)",
               providers=(None, "host", "accel"), gpu_providers=("accel",), cpu_provider="host",
               opener=FixedRunner, parity_precision="fp16")


@pytest.fixture
def with_fake(monkeypatch):
    monkeypatch.setattr(backends, "BACKENDS", [*BACKENDS, FAKE])
    return FAKE


def test_a_registered_backend_is_opened_with_no_other_change(with_fake, tmp_path):
    runner = open_runner(tmp_path / "m.fake", "accel", 3)
    assert isinstance(runner, FixedRunner) and (runner.path, runner.provider, runner.threads) == \
        (tmp_path / "m.fake", "accel", 3)
    out = runner.infer({"images": np.zeros((2, 3, 8, 8), np.float32), "image_sizes": np.zeros((2, 2), np.int64)})
    assert out["num_detections"].tolist() == [1, 1] and out["boxes"].tolist() == [[[1, 2, 3, 4]]] * 2
    with pytest.raises(NorcalError, match="^missing inputs image_sizes$"):
        runner.infer({"images": np.zeros((1, 3, 8, 8), np.float32)})
    assert needs_gpu("m.fake", "accel") and not needs_gpu("m.fake", "host")
    assert runner_precision(runner) == "fp16"  # the backend's preset
    with pytest.raises(NorcalError) as e:
        open_runner(tmp_path / "m.pt")
    assert str(e.value).endswith("expected .onnx, a TensorRT engine (.engine, .plan, .trt) or a fake model (.fake)")


def test_removing_a_backend_stops_its_files(monkeypatch, tmp_path):
    monkeypatch.setattr(backends, "BACKENDS", [backend_named("onnxruntime")])
    with pytest.raises(NorcalError) as e:
        open_runner(tmp_path / "m.engine")
    assert str(e.value) == f"{tmp_path / 'm.engine'}: unknown model type '.engine'; expected .onnx"


def test_backend_runner_refuses_a_feed_outside_its_bounds_before_running():
    """The base checks every input against the backend's (lo, hi) dims; the backend never runs
    a batch outside them, and one within them (free dims any size) runs."""
    from norcal.core.errors import NorcalError
    from norcal.runtime.backends.base import BackendRunner

    class Bounded(BackendRunner):
        name, input_names, output_names = "bounded", ["images", "image_sizes"], ["n"]
        ran = 0

        def input_bounds(self, name):
            return ((1, 3, 32, None), (4, 3, 64, None)) if name == "images" else None

        def run(self, feeds):
            self.ran += 1
            return {"n": np.array(len(feeds["images"]))}

    r = Bounded()
    sizes = np.zeros((2, 2), np.int64)
    assert int(r.infer({"images": np.zeros((2, 3, 64, 999), np.float32), "image_sizes": sizes})["n"]) == 2
    for bad in ((5, 3, 32, 32), (1, 3, 31, 32), (1, 3, 65, 32), (1, 3, 32)):
        with pytest.raises(NorcalError, match=r"input 'images' has shape .* outside"):
            r.infer({"images": np.zeros(bad, np.float32), "image_sizes": sizes})
    assert r.ran == 1
