"""How ONNX Runtime's execution provider is chosen: 'auto' (infer's default) prefers CUDA where
the installed onnxruntime has it and falls back to CPU; the runner's name says what the session
really runs on. No GPU needed: the choice is checked on provider lists."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper as h

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner, choose_provider

CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"


@pytest.mark.parametrize("available, chosen", [
    ([CUDA, CPU], "cuda"),            # onnxruntime-gpu
    ([TRT, CUDA, CPU], "cuda"),       # never TensorRT unasked: it builds an engine per session
    ([CPU], "cpu"),                   # the CPU onnxruntime
    (["AzureExecutionProvider", CPU], "cpu"),
])
def test_auto_prefers_cuda_and_falls_back_to_cpu(available, chosen):
    assert choose_provider("auto", available) == chosen


@pytest.mark.parametrize("requested", ["cpu", "cuda", "tensorrt"])
def test_an_explicit_provider_is_kept(requested):
    assert choose_provider(requested, [TRT, CUDA, CPU]) == requested
    assert choose_provider(requested, [CPU]) == requested  # the runner then says it is missing


@pytest.fixture
def identity(tmp_path):
    vi = h.make_tensor_value_info
    graph = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "g", [vi("x", T.FLOAT, [1])],
                         [vi("y", T.FLOAT, [1])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


class _Session:
    """Records the providers a session is asked for (no GPU needed)."""
    asked: list = []

    def __init__(self, path, sess_options=None, providers=None):
        _Session.asked = list(providers)

    def get_providers(self):
        return _Session.asked

    def get_inputs(self):
        return []

    get_outputs = get_inputs

    def get_modelmeta(self):
        return type("Meta", (), {"custom_metadata_map": {}})()


def test_auto_asks_onnxruntime_for_cuda_then_cpu(identity, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", _Session)
    runner = OnnxRuntimeRunner(identity, "auto")
    assert _Session.asked == [CUDA, CPU] and runner.name == "onnxruntime-cuda"
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CPU])
    runner = OnnxRuntimeRunner(identity, "auto")
    assert _Session.asked == [CPU] and runner.name == "onnxruntime-cpu"


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_name_is_the_provider_the_session_runs_on(identity, monkeypatch):
    # asked for CUDA that this onnxruntime cannot start, the session runs on CPU and says so
    real = ort.get_available_providers()
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, *real])
    runner = OnnxRuntimeRunner(identity, "auto")
    ran = runner.session.get_providers()[0]
    assert runner.name == {CUDA: "onnxruntime-cuda", CPU: "onnxruntime-cpu"}[ran]
    assert runner.infer({"x": np.ones(1, np.float32)})["y"].tolist() == [1.0]


def test_unknown_provider_lists_auto(identity):
    from norcal.core.errors import NorcalError

    with pytest.raises(NorcalError, match="choose one of cpu, cuda, tensorrt, auto"):
        OnnxRuntimeRunner(identity, "tpu")


def test_infer_defaults_to_auto(monkeypatch, identity, tmp_path, capsys):
    seen = []
    import norcal.runtime.runners as runners

    def fake_open(path, provider=None, threads=None):
        seen.append(provider)
        raise SystemExit(0)

    monkeypatch.setattr(runners, "open_runner", fake_open)
    img = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(img)
    with pytest.raises(SystemExit):
        main(["infer", str(identity), str(img), "-o", str(tmp_path / "r.json")])
    assert seen == ["auto"]


def test_a_batch_outside_the_graphs_fixed_dims_is_one_line(tmp_path):
    """As the TensorRT runner's profile check: a graph exported with fixed H and W (--height /
    --width, ViTDet's square) refuses a batch of another size by name, not with ONNX Runtime's
    multi-line shape error."""
    vi = h.make_tensor_value_info
    graph = h.make_graph([h.make_node("Identity", ["images"], ["y"])], "g",
                         [vi("images", T.FLOAT, ["batch", 3, 4, 4])], [vi("y", T.FLOAT, ["batch", 3, 4, 4])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "fixed.onnx")
    runner = OnnxRuntimeRunner(tmp_path / "fixed.onnx", "cpu")
    ok = np.ones((2, 3, 4, 4), np.float32)
    np.testing.assert_array_equal(runner.infer({"images": ok})["y"], ok)  # any batch, the fixed H, W
    with pytest.raises(NorcalError, match=r"^fixed\.onnx: input 'images' has shape 1x3x4x8, but the model fixes "
                                          r"it at \?x3x4x4; export it with dims"):
        runner.infer({"images": np.ones((1, 3, 4, 8), np.float32)})
