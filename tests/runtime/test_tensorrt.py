"""norcal build / TensorRTRunner. Command lines and profiles are written out by hand here;
engine tests need TensorRT and a GPU and skip without them (outputs compared to ONNX Runtime)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.core.profiles import detector_profiles
from norcal.cli.options import parse_hw_range, parse_range
from norcal.runtime.tensorrt_build import BuildOptions, sidecar_path, trtexec_command


def tiny_detector(metadata=None) -> onnx.ModelProto:
    """A few supported ops with the detector contract's inputs and outputs (K = 1)."""
    inits = [h.make_tensor("hw_axes", T.INT64, [2], [2, 3]), h.make_tensor("one", T.INT64, [1], [1]),
             h.make_tensor("zero", T.FLOAT, [], [0.0])]
    nodes = [
        h.make_node("ReduceMean", ["images", "hw_axes"], ["mean"], name="mean", keepdims=0),  # [B,3]
        h.make_node("Cast", ["image_sizes"], ["sizes_f"], name="sizes_f", to=T.FLOAT),  # [B,2]
        h.make_node("Concat", ["sizes_f", "sizes_f"], ["box"], name="box", axis=1),  # [B,4]
        h.make_node("Unsqueeze", ["box", "one"], ["boxes"], name="boxes"),  # [B,1,4]
        h.make_node("ReduceMax", ["mean", "one"], ["scores"], name="scores", keepdims=1),  # [B,1]
        h.make_node("ArgMax", ["mean"], ["classes"], name="classes", axis=1, keepdims=1),  # [B,1]
        h.make_node("Greater", ["scores", "zero"], ["pos"], name="pos"),
        h.make_node("Cast", ["pos"], ["pos_i"], name="pos_i", to=T.INT64),
        h.make_node("ReduceSum", ["pos_i", "one"], ["num_detections"], name="num", keepdims=0),  # [B]
    ]
    g = h.make_graph(
        nodes, "tiny",
        [h.make_tensor_value_info("images", T.FLOAT, ["B", 3, "H", "W"]),
         h.make_tensor_value_info("image_sizes", T.INT64, ["B", 2])],
        [h.make_tensor_value_info("num_detections", T.INT64, ["B"]),
         h.make_tensor_value_info("boxes", T.FLOAT, ["B", 1, 4]),
         h.make_tensor_value_info("scores", T.FLOAT, ["B", 1]),
         h.make_tensor_value_info("classes", T.INT64, ["B", 1])],
        inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
    m.ir_version = 10
    if metadata:
        h.set_model_props(m, metadata)
    onnx.checker.check_model(m)
    return m


def test_trtexec_command_line():
    profiles = detector_profiles((1, 4, 8), (32, 32), (800, 1088), (1344, 1344))
    cmd = trtexec_command("model.onnx", "out/model.engine", profiles, fp16=True, workspace_gb=4,
                          timing_cache="trt.cache")
    assert cmd == ("trtexec --onnx=model.onnx --saveEngine=out/model.engine "
                   "--minShapes=images:1x3x32x32,image_sizes:1x2 "
                   "--optShapes=images:4x3x800x1088,image_sizes:4x2 "
                   "--maxShapes=images:8x3x1344x1344,image_sizes:8x2 "
                   "--fp16 --memPoolSize=workspace:4096M --timingCacheFile=trt.cache")
    plain = trtexec_command("my model.onnx", "m.engine", detector_profiles((1, 1, 1), (640, 640), (640, 640),
                                                                            (640, 640)), workspace_gb=0.5)
    assert plain == ("trtexec '--onnx=my model.onnx' --saveEngine=m.engine "
                     "--minShapes=images:1x3x640x640,image_sizes:1x2 "
                     "--optShapes=images:1x3x640x640,image_sizes:1x2 "
                     "--maxShapes=images:1x3x640x640,image_sizes:1x2 --memPoolSize=workspace:512M")


def test_option_parsing():
    assert parse_range("1:4:8") == (1, 4, 8) and parse_range("2") == (2, 2, 2)
    assert parse_hw_range("320x320:800x1088:1344x1344") == ((320, 320), (800, 1088), (1344, 1344))
    for bad in ("8:4:1", "0:1:2", "1:2", "a:b:c"):
        with pytest.raises(NorcalError):
            parse_range(bad)
    with pytest.raises(NorcalError, match="W needs"):
        parse_hw_range("320x900:800x800:1344x1344")


def _hide_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` raise ImportError


def test_build_without_tensorrt_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    _hide_tensorrt(monkeypatch)
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_detector(), model)
    engine = tmp_path / "tiny.engine"
    rc = main(["build", str(model), "--fp16", "--batch", "1:2:4", "--shape", "320x480", "-o", str(engine)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("error:") and "trtexec" in err and "not installed" in err
    assert (f"trtexec --onnx={model} --saveEngine={engine} "
            "--minShapes=images:1x3x320x480,image_sizes:1x2 --optShapes=images:2x3x320x480,image_sizes:2x2 "
            "--maxShapes=images:4x3x320x480,image_sizes:4x2 --fp16") in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.onnx"]


def test_import_tensorrt_message_is_neutral_and_the_runner_adds_context(tmp_path, monkeypatch):
    from norcal.runtime.tensorrt_build import import_tensorrt
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    _hide_tensorrt(monkeypatch)
    with pytest.raises(NorcalError) as e:
        import_tensorrt()
    assert "not installed" in str(e.value) and "trtexec" not in str(e.value)
    with pytest.raises(NorcalError, match="cannot run TensorRT engine .*x.engine: TensorRT's Python"):
        TensorRTRunner(tmp_path / "x.engine")


def test_engine_without_sidecar_warns_about_the_default_resize(tmp_path, capsys):
    from norcal.cli import _show_warning
    from norcal.runtime.backends.tensorrt.runner import NoSidecarWarning, engine_metadata

    engine = tmp_path / "m.engine"
    engine.write_bytes(b"x")
    with pytest.warns(NoSidecarWarning) as caught:
        assert engine_metadata(engine) == ({}, {})
    _show_warning(caught[0].message, NoSidecarWarning, "", 0)  # what the CLI prints
    err = capsys.readouterr().err
    assert "warning:" in err and "m.engine.json not found" in err and "800/1333" in err
    assert "--min-size/--max-size" in err and len(err.strip().splitlines()) == 1


def test_trtexec_only_writes_the_sidecar(tmp_path, monkeypatch, capsys):
    _hide_tensorrt(monkeypatch)
    meta = {"norcal.gamma": "0.3", "norcal.min_size_test": "600", "norcal.max_size_test": "1000"}
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_detector(meta), model)
    engine = tmp_path / "tiny.engine"
    assert main(["build", str(model), "--trtexec-only", "-o", str(engine)]) == 0
    assert not engine.exists()
    side = json.loads(sidecar_path(engine).read_text())
    assert sidecar_path(engine).name == "tiny.engine.json"
    assert side["metadata"] == meta
    assert side["onnx_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert side["precision"] == "fp32" and side["built_by"] == "trtexec"
    # 600/1000 resize padded to 32: H, W in [32, 1024]; opt 608 x 800 (4:3 at short edge 600)
    assert side["profile"] == {
        "images": {"min": [1, 3, 32, 32], "opt": [4, 3, 608, 800], "max": [8, 3, 1024, 1024]},
        "image_sizes": {"min": [1, 2], "opt": [4, 2], "max": [8, 2]},
    }
    assert [i["name"] for i in side["inputs"]] == ["images", "image_sizes"]
    assert side["inputs"][0] == {"name": "images", "dtype": "FLOAT", "shape": ["B", 3, "H", "W"]}
    assert [o["name"] for o in side["outputs"]] == ["num_detections", "boxes", "scores", "classes"]
    assert side["trtexec"] in capsys.readouterr().out


def test_build_refuses_a_model_tensorrt_cannot_parse(tmp_path, monkeypatch, capsys):
    _hide_tensorrt(monkeypatch)
    m = tiny_detector()
    m.graph.node.append(h.make_node("Unique", ["scores"], ["u"], name="dedupe"))
    path = tmp_path / "bad.onnx"
    onnx.save(m, path)
    with pytest.raises(NorcalError, match=r"dedupe \(Unique\)") as e:
        from norcal.workflows.build import prepare
        prepare(BuildOptions(path, tmp_path / "bad.engine"))
    assert str(e.value).endswith("or pass check=False") and e.value.param == "check=False"
    # the CLI names its flag
    assert main(["build", str(path), "-o", str(tmp_path / "bad.engine")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith("run norcal check for all, or pass --skip-check"), err


def _have_tensorrt_gpu() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt Python package is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(_have_tensorrt_gpu() is not None, reason=str(_have_tensorrt_gpu()))
@pytest.mark.parametrize("fp16", [False, True])
def test_real_engine_matches_onnxruntime(tmp_path, fp16, capsys):
    import onnxruntime as ort

    from norcal.runtime.tensorrt_build import build_engine, prepare
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    model_path = tmp_path / "tiny.onnx"
    onnx.save(tiny_detector({"norcal.gamma": "0.3"}), model_path)
    opts = BuildOptions(model_path, tmp_path / "tiny.engine", fp16=fp16, batch=(1, 2, 4),
                        hw=((32, 32), (64, 96), (128, 128)), timing_cache=tmp_path / "trt.cache")
    model, profiles, cmd = prepare(opts)
    messages = []
    side = build_engine(opts, model, profiles, cmd, on_message=messages.append)
    assert all(m.startswith("[TensorRT] ") for m in messages)  # TensorRT's warnings, passed on
    assert capsys.readouterr().out == ""  # the library prints nothing
    assert (tmp_path / "trt.cache").stat().st_size > 0
    runner = TensorRTRunner(opts.engine_path)
    assert runner.metadata == {"norcal.gamma": "0.3"} and side["precision"] == runner.name.split("-")[1]
    rng = np.random.default_rng(0)
    feeds = {"images": rng.normal(size=(3, 3, 64, 96)).astype(np.float32),
             "image_sizes": np.array([[64, 96], [60, 90], [32, 40]], np.int64)}
    want = dict(zip([o.name for o in model.graph.output],
                    ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, feeds)))
    got = runner.infer(feeds)
    tol = 1e-2 if fp16 else 1e-5
    for name, ref in want.items():
        assert got[name].shape == ref.shape, name
        np.testing.assert_allclose(got[name].astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)
    with pytest.raises(NorcalError, match="outside the engine's profile"):
        runner.infer({"images": np.zeros((5, 3, 64, 64), np.float32), "image_sizes": np.zeros((5, 2), np.int64)})


def test_static_batch_model_gets_batch_1_unless_asked(tmp_path, monkeypatch, capsys):
    _hide_tensorrt(monkeypatch)
    m = tiny_detector()
    for v in m.graph.input:
        v.type.tensor_type.shape.dim[0].dim_value = 1
    path = tmp_path / "static.onnx"
    onnx.save(m, path)
    engine = tmp_path / "static.engine"
    assert main(["build", str(path), "--trtexec-only", "--shape", "800x1088", "-o", str(engine)]) == 0
    assert json.loads(sidecar_path(engine).read_text())["profile"]["images"] == {
        "min": [1, 3, 800, 1088], "opt": [1, 3, 800, 1088], "max": [1, 3, 800, 1088]}
    capsys.readouterr()
    assert main(["build", str(path), "--trtexec-only", "--batch", "1:2:4", "-o", str(tmp_path / "b.engine")]) == 2
    assert "fixes at 1" in capsys.readouterr().err


class _RecordingTensorRT:
    """Stands in for the `tensorrt` module to record the builder calls norcal makes.

    It produces no engine and no result: it only checks how the TensorRT 10 builder API is
    driven (profile shapes, flags, workspace, timing cache, parser errors)."""

    __version__ = "10.15.0"

    class ILogger:
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

        def __init__(self):
            pass

    class MemoryPoolType:
        WORKSPACE = "WORKSPACE"

    class BuilderFlag:
        FP16 = "FP16"
        INT8 = "INT8"

    def __init__(self, parse_ok=True):
        self.calls = []
        rec = self

        def init_libnvinfer_plugins(logger, namespace):
            rec.calls.append(("init_libnvinfer_plugins", namespace))
            return True

        self.init_libnvinfer_plugins = init_libnvinfer_plugins

        class Input:
            def __init__(self, name, shape):
                self.name, self.shape = name, shape

        class Network:
            num_inputs = 2

            def get_input(self, i):
                return [Input("images", (-1, 3, -1, -1)), Input("image_sizes", (-1, 2))][i]

        class Error:
            def node(self):
                return 3

            def node_name(self):
                return "topk_scores"

            def node_operator(self):
                return "TopK"

            def desc(self):
                return "K exceeds the limit"

        class Parser:
            def __init__(self, network, logger):
                self.num_errors = 0 if parse_ok else 1
                self.logger = logger

            def parse_from_file(self, path):
                rec.calls.append(("parse_from_file", path))
                self.logger.log(rec.ILogger.INFO, "parsing")
                self.logger.log(rec.ILogger.WARNING, "INT64 weights cast down to INT32")
                return parse_ok

            def get_error(self, i):
                return Error()

        class Profile:
            def set_shape(self, name, lo, opt, hi):
                rec.calls.append(("set_shape", name, tuple(lo), tuple(opt), tuple(hi)))

        class Cache:
            def serialize(self):
                return b"timing-cache"

        class Config:
            def set_memory_pool_limit(self, pool, size):
                rec.calls.append(("pool", pool, size))

            def set_flag(self, flag):
                rec.calls.append(("flag", flag))

            def add_optimization_profile(self, p):
                rec.calls.append(("add_profile",))

            def create_timing_cache(self, blob):
                rec.calls.append(("create_timing_cache", blob))
                return Cache()

            def set_timing_cache(self, cache, ignore_mismatch):
                rec.calls.append(("set_timing_cache", ignore_mismatch))

            def get_timing_cache(self):
                return Cache()

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                return Network()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                rec.calls.append(("build",))
                return b"serialized-by-recorder"

        self.Builder, self.OnnxParser = Builder, Parser


def test_builder_api_calls(tmp_path, monkeypatch, capsys):
    from norcal.runtime.tensorrt_build import build_engine, prepare

    fake = _RecordingTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    model_path = tmp_path / "tiny.onnx"
    onnx.save(tiny_detector({"norcal.gamma": "0.3"}), model_path)
    (tmp_path / "old.cache").write_bytes(b"previous")
    opts = BuildOptions(model_path, tmp_path / "tiny.engine", fp16=True, batch=(1, 2, 4),
                        hw=((32, 32), (64, 96), (128, 128)), workspace_gb=2,
                        timing_cache=tmp_path / "old.cache")
    model, profiles, cmd = prepare(opts)
    messages = []
    side = build_engine(opts, model, profiles, cmd, on_message=messages.append)
    assert all(m.startswith("[TensorRT] ") for m in messages)  # TensorRT's warnings, passed on
    assert capsys.readouterr().out == ""  # the library prints nothing
    # NVIDIA's plugin library registered before the parser imports a node (RoiAlign -> ROIAlign_TRT)
    assert fake.calls[:2] == [("init_libnvinfer_plugins", ""), ("parse_from_file", str(model_path))]
    assert ("pool", "WORKSPACE", 2 << 30) in fake.calls and ("flag", "FP16") in fake.calls
    assert ("set_shape", "images", (1, 3, 32, 32), (2, 3, 64, 96), (4, 3, 128, 128)) in fake.calls
    assert ("set_shape", "image_sizes", (1, 2), (2, 2), (4, 2)) in fake.calls
    assert ("create_timing_cache", b"previous") in fake.calls
    assert (tmp_path / "old.cache").read_bytes() == b"timing-cache"  # saved back after the build
    assert (tmp_path / "tiny.engine").read_bytes() == b"serialized-by-recorder"
    assert json.loads((tmp_path / "tiny.engine.json").read_text()) == side
    assert side["tensorrt_version"] == "10.15.0" and side["built_by"] == "norcal build"

    monkeypatch.setitem(sys.modules, "tensorrt", _RecordingTensorRT(parse_ok=False))
    opts2 = BuildOptions(model_path, tmp_path / "fail.engine", batch=(1, 1, 1))
    with pytest.raises(NorcalError, match=r"node 'topk_scores' \(TopK\): K exceeds the limit"):
        build_engine(opts2, *prepare(opts2))
    assert not (tmp_path / "fail.engine").exists()


def tiny_qdq_detector(metadata=None) -> onnx.ModelProto:
    """tiny_detector with its images through an int8 QuantizeLinear/DequantizeLinear pair (scale
    1, zero point 0): an explicitly quantized model as norcal quantize writes them."""
    m = tiny_detector(metadata)
    g = m.graph
    g.initializer.extend([h.make_tensor("q_scale", T.FLOAT, [], [1.0]), h.make_tensor("q_zp", T.INT8, [], [0])])
    mean = next(n for n in g.node if n.name == "mean")
    mean.input[0] = "images_dq"
    nodes = [h.make_node("QuantizeLinear", ["images", "q_scale", "q_zp"], ["images_q"], name="q"),
             h.make_node("DequantizeLinear", ["images_q", "q_scale", "q_zp"], ["images_dq"], name="dq")]
    rest = list(g.node)
    del g.node[:]
    g.node.extend(nodes + rest)
    onnx.checker.check_model(m)
    return m


def test_int8_refuses_a_model_without_qdq_in_one_line(tmp_path, monkeypatch, capsys):
    _hide_tensorrt(monkeypatch)
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_detector(), model)
    engine = tmp_path / "tiny.engine"
    assert main(["build", str(model), "--int8", "--trtexec-only", "-o", str(engine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no QuantizeLinear nodes" in err and "run norcal quantize" in err, err
    assert not engine.exists() and not sidecar_path(engine).exists()


def test_int8_on_an_fp16_model_says_to_quantize_the_fp32_one(tmp_path, monkeypatch, capsys):
    # norcal quantize refuses an fp16 model: the hint must name the fp32 model, not this one
    from norcal.core.contract import PRECISION

    _hide_tensorrt(monkeypatch)
    model = tmp_path / "tiny.fp16.onnx"
    onnx.save(tiny_detector({PRECISION: "fp16"}), model)
    engine = tmp_path / "tiny.engine"
    assert main(["build", str(model), "--int8", "--trtexec-only", "-o", str(engine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is fp16" in err and "fp32 model it came from" in err, err
    assert f"quantize on {model}" not in err, err
    assert not engine.exists() and not sidecar_path(engine).exists()


@pytest.mark.parametrize("shape, ok", [(["--shape", "801x1088"], False), (["--shape", "800x1090"], False),
                                       (["--shapes", "330x330:340x340:350x350"], False),
                                       (["--shape", "800x1088"], True), (["--shapes", "330x330:340x340:360x360"], True)])
def test_build_refuses_image_sizes_the_host_never_sends(shape, ok, tmp_path, monkeypatch, capsys):
    # the host pads H and W to a multiple of size_divisibility (32): 801 or 330..350 can never
    # come in, so such an engine would refuse every batch at run time
    from norcal.core.contract import SIZE_DIVISIBILITY

    _hide_tensorrt(monkeypatch)
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_detector({SIZE_DIVISIBILITY: "32"}), model)
    engine = tmp_path / "tiny.engine"
    rc = main(["build", str(model), "--trtexec-only", "-o", str(engine), *shape])
    err = capsys.readouterr().err
    if ok:
        assert rc == 0, err
        return
    assert rc == 2 and err.count("\n") == 1 and "multiple of" in err and "32" in err, err
    assert "--shape" in err, err
    assert not sidecar_path(engine).exists()


def test_int8_trtexec_line_and_sidecar(tmp_path, monkeypatch, capsys):
    _hide_tensorrt(monkeypatch)
    model = tmp_path / "tiny.int8.onnx"
    onnx.save(tiny_qdq_detector({"norcal.precision": "int8"}), model)
    engine = tmp_path / "tiny.engine"
    assert main(["build", str(model), "--int8", "--trtexec-only", "-o", str(engine)]) == 0
    side = json.loads(sidecar_path(engine).read_text())
    assert side["precision"] == "int8"
    assert "--int8" in side["trtexec"].split()
    assert "--calib" not in side["trtexec"]  # explicit quantization: no calibration cache
    assert side["trtexec"] in capsys.readouterr().out
    assert main(["build", str(model), "--int8", "--fp16", "--trtexec-only", "-o", str(engine)]) == 0
    side = json.loads(sidecar_path(engine).read_text())
    assert side["precision"] == "int8+fp16" and {"--int8", "--fp16"} <= set(side["trtexec"].split())


def test_int8_builder_sets_the_int8_flag_and_no_calibrator(tmp_path, monkeypatch):
    from norcal.runtime.tensorrt_build import build_engine, prepare

    fake = _RecordingTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    model_path = tmp_path / "tiny.int8.onnx"
    onnx.save(tiny_qdq_detector(), model_path)
    opts = BuildOptions(model_path, tmp_path / "tiny.engine", int8=True, batch=(1, 2, 4),
                        hw=((32, 32), (64, 96), (128, 128)))
    side = build_engine(opts, *prepare(opts))
    assert ("flag", "INT8") in fake.calls and ("flag", "FP16") not in fake.calls
    assert side["precision"] == "int8"

    class NoInt8(_RecordingTensorRT):  # TensorRT 11 drops the weak-typing flags
        class BuilderFlag:
            FP16 = "FP16"

    fake = NoInt8()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    assert build_engine(opts, *prepare(opts))["precision"] == "int8"  # the Q/DQ nodes suffice
    assert not [c for c in fake.calls if c[0] == "flag"]


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(_have_tensorrt_gpu() is not None, reason=str(_have_tensorrt_gpu()))
def test_real_int8_engine_from_qdq_matches_onnxruntime(tmp_path, capsys):
    import onnxruntime as ort

    from norcal.runtime.tensorrt_build import build_engine, prepare
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    model_path = tmp_path / "tiny.int8.onnx"
    onnx.save(tiny_qdq_detector(), model_path)
    opts = BuildOptions(model_path, tmp_path / "tiny.engine", int8=True, batch=(1, 2, 4),
                        hw=((32, 32), (64, 96), (128, 128)))
    model, profiles, cmd = prepare(opts)
    assert build_engine(opts, model, profiles, cmd)["precision"] == "int8"
    runner = TensorRTRunner(opts.engine_path)
    rng = np.random.default_rng(0)
    # integer pixel values: the scale-1 Q/DQ pair is exact on them (no rounding to compare)
    feeds = {"images": rng.integers(-100, 100, size=(2, 3, 64, 96)).astype(np.float32),
             "image_sizes": np.array([[64, 96], [60, 90]], np.int64)}
    want = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = runner.infer(feeds)
    for o, ref in zip(model.graph.output, want):
        np.testing.assert_allclose(got[o.name].astype(np.float64), ref.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_build_refuses_the_onnxruntime_int8_form_in_one_line(tmp_path, monkeypatch, capsys):
    """norcal quantize --form ort writes uint8 activations and int32 biases, which TensorRT does
    not build: refused by its metadata, with int8 and without, before TensorRT is asked; the
    tensorrt form (recorded or written before the key) builds."""
    from norcal.runtime.tensorrt_build import build_engine, prepare

    monkeypatch.setitem(sys.modules, "tensorrt", _RecordingTensorRT())
    model = tmp_path / "tiny.int8-ort.onnx"
    onnx.save(tiny_qdq_detector({"norcal.precision": "int8", "norcal.int8_form": "ort"}), model)
    engine = tmp_path / "tiny.engine"
    for flags in (["--int8"], []):
        assert main(["build", str(model), *flags, "-o", str(engine)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "norcal.int8_form=ort" in err and "TensorRT does not build" in err, err
        assert "norcal quantize --form tensorrt" in err, err
        assert not engine.exists() and not sidecar_path(engine).exists()
    for form in ({"norcal.int8_form": "tensorrt"}, {}):
        onnx.save(tiny_qdq_detector({"norcal.precision": "int8", **form}), model)
        opts = BuildOptions(model, engine, int8=True, batch=(1, 2, 4), hw=((32, 32), (64, 96), (128, 128)))
        assert build_engine(opts, *prepare(opts))["precision"] == "int8"
