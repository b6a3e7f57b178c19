"""ONNX files with external data: loaded for real, written when too large, clear errors when broken."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import norcal.core.files.onnx_io as onnx_io
from norcal.core.errors import NorcalError
from norcal.core.files.onnx_io import load_onnx, save_onnx


def _model(n=4096):
    w = numpy_helper.from_array(np.arange(n, dtype=np.float32).reshape(-1, 1), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 1])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _external(tmp_path, name="m.onnx"):
    path = tmp_path / name
    onnx.save(_model(), str(path), save_as_external_data=True, location=name + ".data", size_threshold=0)
    return path


def test_external_data_model_loads_with_its_weights(tmp_path):
    model = load_onnx(_external(tmp_path))
    w = numpy_helper.to_array(model.graph.initializer[0])
    assert w.shape == (4096, 1) and w[123, 0] == 123.0


def test_missing_external_data_file_is_one_line(tmp_path):
    path = _external(tmp_path)
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(NorcalError, match="m.onnx.data.*missing") as e:
        load_onnx(path)
    assert "\n" not in str(e.value)


def test_truncated_external_data_is_one_line(tmp_path):
    path = _external(tmp_path)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(NorcalError, match="truncated"):
        load_onnx(path)


@pytest.mark.parametrize("location", ["../outside.data", "/etc/passwd"])
def test_external_data_outside_the_folder_is_refused(tmp_path, location):
    sub = tmp_path / "models"
    sub.mkdir()
    path = _external(sub)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, str(path))
    (tmp_path / "outside.data").write_bytes((sub / "m.onnx.data").read_bytes())
    with pytest.raises(NorcalError, match="outside the model's folder"):
        load_onnx(path)


def test_large_model_is_written_with_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_io, "PROTOBUF_LIMIT", 1000)  # stand-in for 2 GiB
    model = _model()
    out = tmp_path / "big.onnx"
    save_onnx(model, out)
    assert (tmp_path / "big.onnx.data").stat().st_size == 4096 * 4
    assert out.stat().st_size < 4096 * 4
    assert model.graph.initializer[0].raw_data  # the caller's model is left as it was
    back = load_onnx(out)
    np.testing.assert_array_equal(numpy_helper.to_array(back.graph.initializer[0]),
                                  numpy_helper.to_array(model.graph.initializer[0]))


def test_small_model_is_one_file(tmp_path):
    save_onnx(_model(), tmp_path / "small.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["small.onnx"]


def test_folder_is_not_an_onnx_file(tmp_path):
    with pytest.raises(NorcalError, match="is a folder"):
        load_onnx(tmp_path)


def test_unsorted_graph_is_named_as_such_not_as_truncated(tmp_path):
    """Ultralytics' half=True export appends its input Cast after the nodes that read it: ONNX
    Runtime runs such a graph, the ONNX checker refuses it. The error says the order is the
    problem and how to get a graph we take, not that the file is truncated."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Identity", ["t"], ["y"]), helper.make_node("Identity", ["x"], ["t"])]
    p = tmp_path / "unsorted.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y])), str(p))
    with pytest.raises(NorcalError) as e:
        load_onnx(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: its nodes are not in topological order")
    assert "truncated" not in msg and "fp32" in msg
