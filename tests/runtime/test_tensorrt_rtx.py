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
