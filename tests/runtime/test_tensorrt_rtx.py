"""norcal build --target rtx: NVIDIA's TensorRT for RTX 1.7.1.116 (installed by the README's line)
builds engines ahead of time on this CPU-only machine. No engine is run here: RTX engines run
only on RTX-class GPUs (the bench script runs one where a lent GPU is of that kind)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.runtime.tensorrt_build import BuildOptions, build_engine, prepare, sidecar_path

sys.path.insert(0, str(Path(__file__).parent))
from test_tensorrt import tiny_detector  # noqa: E402


def with_node(model: onnx.ModelProto, node, *inits) -> onnx.ModelProto:
    """The model with one more node (its output unused) and its constant inputs."""
    model.graph.node.append(node)
    model.graph.initializer.extend(inits)
    return model


def roi_align_detector():
    """The tiny detector with an R-CNN-like RoiAlign on its images."""
    return with_node(tiny_detector(), h.make_node("RoiAlign", ["images", "rois", "bi"], ["pooled"],
                                                  name="box_pooler/RoiAlign", output_height=2, output_width=2,
                                                  sampling_ratio=2),
                     h.make_tensor("rois", T.FLOAT, [1, 4], [0, 0, 4, 4]), h.make_tensor("bi", T.INT64, [1], [0]))


def _save(tmp_path, model, name="m.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_rtx_build_writes_an_engine_and_its_sidecar_for_rtx_gpus(tmp_path, capsys):
    model = _save(tmp_path, tiny_detector({"norcal.gamma": "0.3"}))
    engine = tmp_path / "m.engine"
    assert main(["build", str(model), "--target", "rtx", "--batch", "1:2:4", "--shapes",
                 "32x32:64x64:128x128", "-o", str(engine)]) == 0
    out = capsys.readouterr().out
    assert "trtexec" not in out  # trtexec builds no RTX engine: no line is offered
    assert ("(fp32, TensorRT for RTX 1.7.1.116, for compute capability 8.0 8.6 8.9 12.0 12.1)" in out)
    blob = engine.read_bytes()
    assert len(blob) > 100_000  # a serialized plan, NVIDIA's (its size varies with the targets)
    side = json.loads(sidecar_path(engine).read_text())
    assert side["library"] == "TensorRT for RTX" and side["tensorrt_version"] == "1.7.1.116"
    assert side["compute_capabilities"] == ["8.0", "8.6", "8.9", "12.0", "12.1"]
    assert side["plugins"] == [] and side["trtexec"] is None and side["device"] is None
    assert side["profile"]["images"] == {"min": [1, 3, 32, 32], "opt": [2, 3, 64, 64], "max": [4, 3, 128, 128]}
    assert side["metadata"] == {"norcal.gamma": "0.3"}


def test_the_capabilities_asked_for_are_the_ones_built(tmp_path, capsys):
    model = _save(tmp_path, tiny_detector())
    sizes = {}
    for caps in (["7.5"], ["8.9"], ["8.0", "8.9", "12.0"]):
        engine = tmp_path / f"{'_'.join(caps)}.engine"
        flags = [x for c in caps for x in ("--compute-capability", c)]
        assert main(["build", str(model), "--target", "rtx", "--shape", "64x64", "-o", str(engine), *flags]) == 0
        assert json.loads(sidecar_path(engine).read_text())["compute_capabilities"] == caps
        sizes[tuple(caps)] = engine.stat().st_size
    # one plan per target: three capabilities make a larger engine than one (NVIDIA's builder did it)
    assert sizes[("8.0", "8.9", "12.0")] > max(sizes[("7.5",)], sizes[("8.9",)])
    capsys.readouterr()
    assert main(["build", str(model), "--target", "rtx", "--compute-capability", "9.0", "-o",
                 str(tmp_path / "h.engine")]) == 2
    assert "invalid choice: '9.0'" in capsys.readouterr().err
    with pytest.raises(Exception, match="not Hopper H100/H200"):
        build_engine(*_opts(model, tmp_path / "h.engine", capabilities=("9.0",)))
    assert not (tmp_path / "h.engine").exists()


def _opts(model, engine, **kw):
    opts = BuildOptions(model, engine, target="rtx", batch=(1, 1, 1), hw=((64, 64),) * 3, **kw)
    return (opts, *prepare(opts))


@pytest.mark.parametrize("node, inits, op", [
    (h.make_node("NonZero", ["image_sizes"], ["nz"], name="keep/NonZero"), (), "NonZero"),
    (h.make_node("RoiAlign", ["images", "rois", "bi"], ["pooled"], name="box_pooler/RoiAlign", sampling_ratio=2),
     (h.make_tensor("rois", T.FLOAT, [1, 4], [0, 0, 4, 4]), h.make_tensor("bi", T.INT64, [1], [0])), "RoiAlign"),
])
def test_rtx_refuses_data_dependent_layers_and_plugins_in_one_line(node, inits, op, tmp_path, capsys):
    model = _save(tmp_path, with_node(tiny_detector(), node, *inits))
    engine = tmp_path / "m.engine"
    assert main(["build", str(model), "--target", "rtx", "-o", str(engine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be built for TensorRT for RTX" in err
    assert f"{op} ({node.name})" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing written


def test_rtx_and_trtexec_only_is_refused(tmp_path, capsys):
    model = _save(tmp_path, tiny_detector())
    assert main(["build", str(model), "--target", "rtx", "--trtexec-only", "-o", str(tmp_path / "m.engine")]) == 2
    assert "trtexec does not build TensorRT for RTX engines" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_the_sidecar_lists_the_plugins_an_engine_needs(tmp_path, capsys):
    model = _save(tmp_path, roi_align_detector())
    engine = tmp_path / "m.engine"
    assert main(["build", str(model), "--trtexec-only", "-o", str(engine)]) == 0  # TensorRT 10/11's path
    assert json.loads(sidecar_path(engine).read_text())["plugins"] == [
        {"plugin": "ROIAlign_TRT", "library": "libnvinfer_plugin", "since": "8.5", "op_type": "RoiAlign",
         "nodes": ["box_pooler/RoiAlign"]}]
    plain = tmp_path / "plain.engine"
    assert main(["build", str(_save(tmp_path, tiny_detector(), "p.onnx")), "--trtexec-only", "-o", str(plain)]) == 0
    assert json.loads(sidecar_path(plain).read_text())["plugins"] == []


def test_the_runner_registers_plugins_before_it_deserializes():
    """TensorRTRunner's deserialization step, driven through a recorder of the TensorRT calls."""
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    calls = []

    class Trt:
        __version__ = "10.15.0"

        class Logger:
            WARNING = 2

            def __init__(self, level):
                pass

        @staticmethod
        def init_libnvinfer_plugins(logger, namespace):
            calls.append(("init_libnvinfer_plugins", namespace))
            return True

        class Runtime:
            def __init__(self, logger):
                calls.append(("Runtime",))

            def deserialize_cuda_engine(self, blob):
                calls.append(("deserialize", blob))
                return "engine"

    class Path_:
        def read_bytes(self):
            return b"plan"

    runner = TensorRTRunner.__new__(TensorRTRunner)
    runner.engine_path = Path_()
    assert runner._deserialize(Trt) == "engine"
    assert calls == [("init_libnvinfer_plugins", ""), ("Runtime",), ("deserialize", b"plan")]


# ----------------------------------------------------------------------------- the runner: which library, which GPU

class _StandInTorch:
    """Stands in for torch where no GPU is: reports one CUDA device of the given compute
    capability and name. It runs nothing; it lets the runner's checks before deserializing run."""

    def __init__(self, capability: tuple[int, int], name: str):
        rec = self
        self.calls = []

        class cuda:
            @staticmethod
            def get_device_capability(device):
                return capability

            @staticmethod
            def get_device_name(device):
                return name

            @staticmethod
            def set_device(device):
                rec.calls.append(("set_device", device))

        self.cuda = cuda

    @staticmethod
    def device(kind, index):
        return f"{kind}:{index}"


@pytest.fixture(scope="module")
def rtx_engine(tmp_path_factory):
    """A real TensorRT for RTX engine of the tiny detector, built by norcal build for 8.9 only."""
    d = tmp_path_factory.mktemp("rtx_engine")
    model = _save(d, tiny_detector({"norcal.gamma": "0.3"}))
    engine = d / "m.engine"
    assert main(["build", str(model), "--target", "rtx", "--shape", "64x64", "--compute-capability", "8.9",
                 "-o", str(engine)]) == 0
    return engine


def _gpu(monkeypatch, capability, name):
    from norcal.runtime.backends.tensorrt import runner

    torch = _StandInTorch(capability, name)
    monkeypatch.setattr(runner, "_torch_cuda", lambda: torch)
    return torch


def _record_deserialize(monkeypatch):
    """Records the module and title the runner deserializes with; the real step still runs."""
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    seen, real = [], TensorRTRunner._deserialize

    def deserialize(self, trt, title="TensorRT"):
        seen.append((trt, title))
        return None if trt.__name__ == "tensorrt_rtx_bindings" else real(self, trt, title)

    monkeypatch.setattr(TensorRTRunner, "_deserialize", deserialize)
    return seen


@pytest.mark.parametrize("capability, gpu", [((9, 0), "NVIDIA H100 80GB HBM3"), ((9, 0), "NVIDIA H200"),
                                             ((7, 0), "Tesla V100-SXM2-16GB")])
def test_an_rtx_engine_is_refused_on_a_gpu_rtx_does_not_run_on(rtx_engine, capability, gpu, monkeypatch):
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    torch, seen = _gpu(monkeypatch, capability, gpu), _record_deserialize(monkeypatch)
    with pytest.raises(NorcalError) as e:
        TensorRTRunner(rtx_engine)
    msg, cc = str(e.value), "{}.{}".format(*capability)
    assert "\n" not in msg and msg.startswith(f"{rtx_engine} is a TensorRT for RTX engine and cannot run on {gpu}")
    assert f"(compute capability {cc}): TensorRT for RTX engines run on RTX-class GPUs, compute capability " \
           "7.5, 8.0, 8.6, 8.9, 12.0, 12.1 only (not Hopper H100/H200)" in msg
    assert seen == [] and torch.calls == []  # refused before the GPU is touched or the engine read


def test_an_rtx_engine_is_refused_on_an_rtx_gpu_it_was_not_built_for(rtx_engine, monkeypatch):
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    _gpu(monkeypatch, (8, 6), "NVIDIA GeForce RTX 3090")
    seen = _record_deserialize(monkeypatch)
    with pytest.raises(NorcalError) as e:
        TensorRTRunner(rtx_engine)
    assert str(e.value) == (f"{rtx_engine} was built for compute capability 8.9, and NVIDIA GeForce RTX 3090 is "
                            "8.6: rebuild it for that GPU (target 'rtx', capabilities ('8.6',))")
    assert seen == []


def test_an_rtx_engine_is_deserialized_by_tensorrt_for_rtx_on_a_gpu_it_was_built_for(rtx_engine, monkeypatch):
    """On an 8.9 GPU the checks pass and NVIDIA's TensorRT for RTX module (the real one) is the
    one handed to deserialization; no GPU is here, so the step is recorded and returns nothing,
    which the runner reports naming the library."""
    import tensorrt_rtx_bindings

    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # TensorRT 10/11 is not what this engine needs
    torch = _gpu(monkeypatch, (8, 9), "NVIDIA GeForce RTX 4090")
    seen = _record_deserialize(monkeypatch)
    with pytest.raises(NorcalError, match=r"TensorRT for RTX 1\.7\.1\.116 cannot load it \(built with TensorRT "
                                          r"for RTX 1\.7\.1\.116 on an unknown GPU"):
        TensorRTRunner(rtx_engine)
    assert seen == [(tensorrt_rtx_bindings, "TensorRT for RTX")] and torch.calls == [("set_device", "cuda:0")]


def test_an_rtx_engine_without_tensorrt_for_rtx_names_the_engine_and_the_module(rtx_engine, monkeypatch):
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    monkeypatch.setitem(sys.modules, "tensorrt_rtx_bindings", None)  # `import` raises ImportError
    _gpu(monkeypatch, (8, 9), "NVIDIA GeForce RTX 4090")
    with pytest.raises(NorcalError) as e:
        TensorRTRunner(rtx_engine)
    assert str(e.value) == (f"cannot run TensorRT for RTX engine {rtx_engine}: TensorRT for RTX's Python package "
                            "is not installed (module tensorrt_rtx_bindings; pip install 'norcal-deploy[tensorrt-rtx]')")


def test_a_tensorrt_engine_loads_tensorrt_and_is_not_held_to_rtx_gpus(tmp_path, monkeypatch, capsys):
    """A TensorRT 10/11 engine's sidecar (library TensorRT): the `tensorrt` module, named when it
    is missing although TensorRT for RTX is installed; on an H100 it goes on to deserialize."""
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    engine = tmp_path / "m.engine"
    assert main(["build", str(_save(tmp_path, tiny_detector())), "--trtexec-only", "-o", str(engine)]) == 0
    engine.write_bytes(b"plan")  # trtexec's engine, never run here
    assert json.loads(sidecar_path(engine).read_text())["library"] == "TensorRT"
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(NorcalError) as e:
        TensorRTRunner(engine)
    assert str(e.value) == (f"cannot run TensorRT engine {engine}: TensorRT's Python package is not installed "
                            "(module tensorrt; pip install 'norcal-deploy[tensorrt]'; on a Jetson it comes with JetPack)")

    class Trt:  # stands in for the tensorrt module: its runtime loads nothing
        __name__, __version__ = "tensorrt", "10.15.0"

        class Logger:
            WARNING = 2

            def __init__(self, level):
                pass

        @staticmethod
        def init_libnvinfer_plugins(logger, namespace):
            return True

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, blob):
                return None

    monkeypatch.setitem(sys.modules, "tensorrt", Trt)
    _gpu(monkeypatch, (9, 0), "NVIDIA H100 80GB HBM3")
    seen = _record_deserialize(monkeypatch)
    with pytest.raises(NorcalError, match="TensorRT 10.15.0 cannot load it"):
        TensorRTRunner(engine)
    assert seen == [(Trt, "TensorRT")]


def test_a_sidecar_naming_another_library_is_refused_in_one_line(rtx_engine, tmp_path, monkeypatch):
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    engine = tmp_path / "x.engine"
    engine.write_bytes(rtx_engine.read_bytes())
    side = json.loads(sidecar_path(rtx_engine).read_text())
    sidecar_path(engine).write_text(json.dumps({**side, "library": "TensorFlow Lite"}))
    with pytest.raises(NorcalError) as e:
        TensorRTRunner(engine)
    assert str(e.value) == (f"{engine}: its sidecar names library 'TensorFlow Lite', which norcal does not run "
                            "(one of 'TensorRT', 'TensorRT for RTX')")


def test_an_rtx_engine_on_this_machine_says_no_gpu(rtx_engine):
    """The real path where no GPU is (this machine, CI): TensorRT for RTX loads, torch sees no GPU."""
    from norcal.runtime.backends.tensorrt import unavailable
    from norcal.runtime.runners import open_runner

    import torch

    if torch.cuda.is_available():  # a GPU machine: the engine runs there, or is refused saying why
        try:
            assert open_runner(rtx_engine).name == "tensorrt-rtx-fp32"
        except NorcalError as e:
            assert "is a TensorRT for RTX engine and cannot run on" in str(e) or "was built for" in str(e), e
        return
    with pytest.raises(NorcalError, match="^the TensorRT runner needs a CUDA GPU, and torch sees none$"):
        open_runner(rtx_engine)
    assert unavailable() == "no CUDA GPU is visible"


def test_no_library_installed_is_why_no_engine_runs(monkeypatch):
    from norcal.runtime.backends.tensorrt import unavailable

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt_rtx_bindings", None)
    assert unavailable() == "neither TensorRT's nor TensorRT for RTX's Python package is installed"
