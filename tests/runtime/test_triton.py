"""Triton model repositories: config.pbtxt must parse with Triton's own ModelConfig schema."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from norcal.core.errors import NorcalError
from norcal.runtime.triton import write_triton_repo

# tritonclient[grpc] provides Triton's ModelConfig schema
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2


def contract_model(batch="B", k=300) -> onnx.ModelProto:
    """Inputs and outputs of the ONNX contract; the body only has to be a valid graph."""
    vi = h.make_tensor_value_info
    outs = [vi("num_detections", T.INT32, [batch]), vi("boxes", T.FLOAT, [batch, k, 4]),
            vi("scores", T.FLOAT, [batch, k]), vi("classes", T.INT32, [batch, k]),
            vi("masks", T.FLOAT, [batch, k, 28, 28])]
    nodes = [h.make_node("Identity", ["images"], ["unused"])]
    nodes += [h.make_node("ConstantOfShape", ["image_sizes"], [o.name]) for o in outs]  # shape only
    g = h.make_graph(nodes, "contract",
                     [vi("images", T.FLOAT, [batch, 3, "H", "W"]), vi("image_sizes", T.INT64, [batch, 2])],
                     outs)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def parse(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def _dims(t):
    return list(t.dims)


def test_onnx_repo_config(tmp_path):
    src = tmp_path / "det.onnx"
    onnx.save(contract_model(), src)
    d = write_triton_repo(src, tmp_path / "repo", "lvis_maskrcnn", max_batch_size=4)
    assert d == tmp_path / "repo" / "lvis_maskrcnn"
    assert (d / "1" / "model.onnx").read_bytes() == src.read_bytes()
    c = parse(d / "config.pbtxt")
    MC = model_config_pb2
    assert c.name == "lvis_maskrcnn" and c.platform == "onnxruntime_onnx" and c.max_batch_size == 4
    assert c.HasField("dynamic_batching")
    ins = {t.name: t for t in c.input}
    assert _dims(ins["images"]) == [3, -1, -1] and ins["images"].data_type == MC.TYPE_FP32
    assert _dims(ins["image_sizes"]) == [2] and ins["image_sizes"].data_type == MC.TYPE_INT64
    outs = {t.name: t for t in c.output}
    assert list(outs) == ["num_detections", "boxes", "scores", "classes", "masks"]
    nd = outs["num_detections"]
    assert _dims(nd) == [1] and nd.HasField("reshape") and list(nd.reshape.shape) == []
    assert nd.data_type == MC.TYPE_INT32
    assert _dims(outs["boxes"]) == [300, 4] and outs["boxes"].data_type == MC.TYPE_FP32
    assert _dims(outs["scores"]) == [300] and _dims(outs["classes"]) == [300]
    assert outs["classes"].data_type == MC.TYPE_INT32
    assert _dims(outs["masks"]) == [300, 28, 28]
    assert not any(t.HasField("reshape") for t in c.output if t.name != "num_detections")


def test_refuses_overwrite_unless_forced(tmp_path):
    src = tmp_path / "det.onnx"
    onnx.save(contract_model(), src)
    repo = tmp_path / "repo"
    write_triton_repo(src, repo, "det")
    (repo / "det" / "marker").write_text("old")
    with pytest.raises(NorcalError, match="exists") as e:
        write_triton_repo(src, repo, "det")
    assert "pass force=True to replace it" in str(e.value) and e.value.param == "force=True"
    assert (repo / "det" / "marker").exists()
    write_triton_repo(src, repo, "det", max_batch_size=2, force=True)
    assert not (repo / "det" / "marker").exists()
    assert parse(repo / "det" / "config.pbtxt").max_batch_size == 2
    assert sorted(p.name for p in repo.iterdir()) == ["det"]  # no temp folders left behind


def test_static_batch_needs_max_batch_size_0(tmp_path):
    src = tmp_path / "det.onnx"
    onnx.save(contract_model(batch=1), src)
    with pytest.raises(NorcalError, match="fixed batch dim"):
        write_triton_repo(src, tmp_path / "repo", "det", max_batch_size=4)
    d = write_triton_repo(src, tmp_path / "repo", "det")  # default: no Triton batching
    c = parse(d / "config.pbtxt")
    assert c.max_batch_size == 0 and not c.HasField("dynamic_batching")
    ins = {t.name: _dims(t) for t in c.input}
    assert ins == {"images": [1, 3, -1, -1], "image_sizes": [1, 2]}
    assert {t.name: _dims(t) for t in c.output}["num_detections"] == [1]


def test_engine_repo_uses_sidecar(tmp_path, monkeypatch):
    from norcal.runtime.tensorrt_build import BuildOptions, prepare, write_trtexec_sidecar

    src = tmp_path / "det.onnx"
    onnx.save(contract_model(), src)
    engine = tmp_path / "det.engine"
    with pytest.raises(NorcalError, match="sidecar"):
        engine.write_bytes(b"not really an engine")
        write_triton_repo(engine, tmp_path / "repo", "det_trt")
    opts = BuildOptions(src, engine, batch=(1, 2, 6))
    model, profiles, cmd = prepare(opts)
    write_trtexec_sidecar(opts, model, profiles, cmd)
    d = write_triton_repo(engine, tmp_path / "repo", "det_trt")
    assert (d / "1" / "model.plan").read_bytes() == b"not really an engine"
    c = parse(d / "config.pbtxt")
    assert c.platform == "tensorrt_plan" and c.max_batch_size == 6  # the profile's max batch
    assert c.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert {t.name: _dims(t) for t in c.input} == {"images": [3, -1, -1], "image_sizes": [2]}
    with pytest.raises(NorcalError, match="exceeds the engine profile"):
        write_triton_repo(engine, tmp_path / "repo", "det_trt8", max_batch_size=8)


def test_bad_name(tmp_path):
    src = tmp_path / "det.onnx"
    onnx.save(contract_model(), src)
    with pytest.raises(NorcalError, match="model name"):
        write_triton_repo(src, tmp_path / "repo", "../escape")
