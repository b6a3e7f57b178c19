"""Foreign ONNX graphs: the classifier search never guesses, and the NorCal node on a class axis
other than the last (YOLO's [B, C, A] logits), checked against numpy by hand in ONNX Runtime."""

import contextlib
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from norcal.cli import export_main
from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable
from norcal.export.graph.calibrate import calibrate_graph
from norcal.export.graph.surgery import has_norcal, norcal_metadata, strip_norcal
from norcal.export.trt_check import check_model

YOLO_LOGITS = "/model.23/Concat_7_output_0"  # the input of the head's one Sigmoid, [B, 80, A]
YOLO_CLASSES = 80
YOLO_COUNTS = np.arange(1, YOLO_CLASSES + 1, dtype=np.float64) * 7  # N_c = 7, 14, ..., 560


def table(counts, name="t"):
    cats = [{"id": i + 1, "name": f"c{i}", "image_count": float(c), "instance_count": float(c),
             "frequency": "r"} for i, c in enumerate(counts)]
    return CalibrationTable(name, "test", "image", cats)


def table_file(path, counts):
    cats = [{"id": i + 1, "name": f"c{i}", "image_count": float(c)} for i, c in enumerate(counts)]
    path.write_text(json.dumps({"name": "t", "categories": cats}))
    return path


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def softmax(z, axis):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def with_output(model, name):
    """A copy of ``model`` that also outputs the tensor ``name`` (to read the raw logits)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return out


# ------------------------------------------------------------------ the real Ultralytics export

@pytest.fixture(scope="session")
def yolo_seg(tmp_path_factory):
    """YOLO11n-seg built from its yaml (random weights, 80 classes) and exported by Ultralytics'
    own exporter: output0 [B, 4+80+32, A], the class logits concatenated then one Sigmoid."""
    root = tmp_path_factory.mktemp("yolo")
    env = {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(root / "config")}  # nothing into $HOME
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from ultralytics import YOLO

        with contextlib.chdir(root):  # a yaml-built model exports next to the working directory
            path = YOLO("yolo11n-seg.yaml").export(format="onnx", dynamic=True, imgsz=64, simplify=False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return root / path


@pytest.fixture(scope="session")
def yolo_images():
    return np.random.default_rng(0).uniform(0, 1, size=(2, 3, 64, 64)).astype(np.float32)


@pytest.mark.slow
def test_yolo_without_logits_is_refused_not_put_on_the_attention_softmax(yolo_seg):
    model = onnx.load(str(yolo_seg))
    with pytest.raises(NorcalError) as e:
        calibrate_graph(model, 0.5, table(YOLO_COUNTS), background="none")
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "found no box classifier" in msg
    assert "attn/Softmax" in msg and "attention" in msg  # what was found, and why it was not taken
    assert f"{YOLO_LOGITS}' [" in msg and ", 80, " in msg  # the Sigmoid's logits with their shape
    assert "logits" in e.value.params


@pytest.mark.slow
def test_yolo_cli_without_logits_converts_it_to_our_outputs(yolo_seg, tmp_path, capsys):
    # norcal export (not the library's calibrate_graph) takes Ultralytics' graph through the
    # ingest (norcal.export.families.ultralytics.onnx_yolo): our outputs, NorCal on cls_logits
    out = tmp_path / "y.onnx"
    rc = export_main([str(yolo_seg), "-o", str(out), "--gamma", "0.5", "--table",
                      str(table_file(tmp_path / "t80.json", YOLO_COUNTS)), "--background", "none"])
    assert rc == 0 and "converted to our outputs" in " ".join(capsys.readouterr().out.split())
    model = onnx.load(str(out))
    # a segment model: the mask coefficients and, beside them, the prototypes the host pastes with
    assert [o.name for o in model.graph.output] == [*contract.OUTPUT_NAMES, contract.MASK_PROTOS]
    assert norcal_metadata(model)[contract.LOGITS] == "cls_logits"


@pytest.mark.slow
def test_yolo_logits_at_the_sigmoid_input_calibrate_class_axis_1(yolo_seg, yolo_images):
    model = onnx.load(str(yolo_seg))
    with pytest.raises(NorcalError, match="81"):  # a background slot (81 wide) fits no axis: refused
        calibrate_graph(model, 0.5, table(YOLO_COUNTS), logits=YOLO_LOGITS)
    gamma = 0.5
    out = calibrate_graph(model, gamma, table(YOLO_COUNTS), background="none", logits=YOLO_LOGITS)
    meta = norcal_metadata(out)
    assert meta[contract.CLASS_AXIS] == "1" and meta[contract.ACTIVATION] == "sigmoid"
    assert meta[contract.LOGITS] == YOLO_LOGITS
    assert check_model(out).compatible and not check_model(out).errors  # norcal check
    raw = session(with_output(model, YOLO_LOGITS)).run(None, {"images": yolo_images})
    plain, logits = raw[0], raw[-1]
    assert logits.shape[1] == YOLO_CLASSES
    got = session(out).run(None, {"images": yolo_images})[0]
    # by hand: sigmoid(phi_c - gamma log N_c), the prior broadcast along axis 1
    expected = sigmoid(logits.astype(np.float64) - gamma * np.log(YOLO_COUNTS)[None, :, None])
    np.testing.assert_allclose(got[:, 4:4 + YOLO_CLASSES], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[:, :4], plain[:, :4])  # boxes untouched
    np.testing.assert_array_equal(got[:, 4 + YOLO_CLASSES:], plain[:, 4 + YOLO_CLASSES:])  # mask coefficients
    alone = session(out).run(None, {"images": yolo_images[1:]})[0]
    np.testing.assert_allclose(alone[0], got[1], rtol=1e-5, atol=1e-6)  # alone == batched


@pytest.mark.slow
def test_yolo_recalibrate_and_strip_keep_the_class_axis(yolo_seg, yolo_images):
    model = onnx.load(str(yolo_seg))
    once = calibrate_graph(model, 0.5, table(YOLO_COUNTS), background="none", logits=YOLO_LOGITS)
    twice = calibrate_graph(once, 1.0, table(YOLO_COUNTS), background="none")  # the node's own tensor
    assert norcal_metadata(twice)[contract.CLASS_AXIS] == "1"
    logits = session(with_output(model, YOLO_LOGITS)).run(None, {"images": yolo_images})[-1]
    got = session(twice).run(None, {"images": yolo_images})[0][:, 4:4 + YOLO_CLASSES]
    np.testing.assert_allclose(got, sigmoid(logits - np.log(YOLO_COUNTS)[None, :, None]), rtol=1e-5, atol=1e-6)
    plain = strip_norcal(twice)
    assert not has_norcal(plain) and contract.CLASS_AXIS not in norcal_metadata(plain)
    np.testing.assert_allclose(session(plain).run(None, {"images": yolo_images})[0],
                               session(model).run(None, {"images": yolo_images})[0], rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------- synthetic graphs

def attention_graph(tokens, heads=2, dim=4, constant_keys=False):
    """x [B, T, D] -> Q = x Wq; K = x Wk (or learned constant keys [T, D]) -> softmax(Q K^T) over
    the last axis, [B, H, T, T]: an attention map, not a classifier."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(dim, heads * dim)).astype(np.float32), "Wq"),
             numpy_helper.from_array(np.array([0, tokens, heads, dim], np.int64), "split_shape")]
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q_flat"], name="q"),
             helper.make_node("Reshape", ["q_flat", "split_shape"], ["q4"], name="q_split"),
             helper.make_node("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3], name="q_heads")]
    if constant_keys:
        inits.append(numpy_helper.from_array(rng.normal(size=(dim, tokens)).astype(np.float32), "Kt"))
        nodes.append(helper.make_node("MatMul", ["q", "Kt"], ["scores_in"], name="attn_matmul"))
    else:
        inits.append(numpy_helper.from_array(rng.normal(size=(dim, heads * dim)).astype(np.float32), "Wk"))
        nodes += [helper.make_node("MatMul", ["x", "Wk"], ["k_flat"], name="k"),
                  helper.make_node("Reshape", ["k_flat", "split_shape"], ["k4"], name="k_split"),
                  helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="k_heads"),
                  helper.make_node("MatMul", ["q", "kt"], ["scores_in"], name="attn_matmul")]
    nodes.append(helper.make_node("Softmax", ["scores_in"], ["attn"], axis=-1, name="attn_softmax"))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 ["B", tokens, dim])],
                              [helper.make_tensor_value_info("attn", TensorProto.FLOAT, ["B", heads, tokens, tokens])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("constant_keys", [False, True])
def test_attention_softmax_with_as_many_tokens_as_classes_is_refused(constant_keys):
    """[B, H, T, T] with T == the table's classes + 1: refused, naming the softmax and its shape."""
    model = attention_graph(tokens=6, constant_keys=constant_keys)
    assert session(model).run(None, {"x": np.ones((1, 6, 4), np.float32)})[0].shape == (1, 2, 6, 6)
    with pytest.raises(NorcalError) as e:
        calibrate_graph(model, 0.5, table([1, 2, 3, 4, 5]))
    msg = str(e.value)
    assert "found no box classifier" in msg and "'attn_softmax' on 'scores_in' [B, 2, 6, 6]" in msg, msg
    why = "cannot tell which holds the classes" if constant_keys else "multiplies two activations"
    assert why in msg and e.value.params == ("logits",)


def class_axis_graph(classes, activation, background=True):
    """logits = x [B, K, A] (K = classes, +1 background last) -> Softmax(axis=1) / Sigmoid."""
    k = classes + (1 if background else 0)
    attrs = {"axis": 1} if activation == "Softmax" else {}
    nodes = [helper.make_node("Identity", ["x"], ["logits"], name="head"),
             helper.make_node(activation, ["logits"], ["scores"], name="act", **attrs)]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", k, "A"])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", k, "A"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


COUNTS = np.array([2.0, 5.0, 40.0, 900.0])


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("mechanism", ["exp", "logit"])
def test_softmax_on_axis_1_by_hand(inline, mechanism):
    model = class_axis_graph(len(COUNTS), "Softmax")
    gamma, b = 0.7, 0.5
    out = calibrate_graph(model, gamma, table(COUNTS), logits="logits", mechanism=mechanism,
                         background_scale=b, inline=inline)
    assert norcal_metadata(out)[contract.CLASS_AXIS] == "1"
    # the node's body passes the parser check (the graph input's own dynamic dims need a profile)
    assert [f.reason for f in check_model(out).errors if "profile" not in f.reason] == []
    x = np.random.default_rng(3).normal(size=(3, len(COUNTS) + 1, 7)).astype(np.float32) * 2
    xd = x.astype(np.float64)
    a = COUNTS ** gamma  # a_c, by hand
    if mechanism == "exp":  # softmax over the classes of [phi_c - log a_c, phi_bg + log b]
        z = np.concatenate([xd[:, :-1] - np.log(a)[None, :, None], xd[:, -1:] + np.log(b)], axis=1)
    else:  # [phi_c / a_c, phi_bg + log b]
        z = np.concatenate([xd[:, :-1] / a[None, :, None], xd[:, -1:] + np.log(b)], axis=1)
    np.testing.assert_allclose(session(out).run(None, {"x": x})[0], softmax(z, axis=1), rtol=1e-5, atol=1e-6)
    plain = strip_norcal(out)
    act = next(n for n in plain.graph.node if n.op_type == "Softmax")
    assert helper.get_attribute_value(act.attribute[0]) == 1  # the Softmax comes back on its axis
    np.testing.assert_allclose(session(plain).run(None, {"x": x})[0], softmax(xd, axis=1), rtol=1e-5, atol=1e-6)


def test_sigmoid_class_axis_found_by_size_and_said():
    """A Sigmoid has no axis: the one axis of the table's size is the class axis, and the result
    says so; the anchors axis may be any size."""
    model = class_axis_graph(len(COUNTS), "Sigmoid", background=False)
    out = calibrate_graph(model, 0.5, table(COUNTS), logits="logits", background="none")
    from norcal.export.graph.surgery import placement

    assert placement(out) == ["logits (class axis 1 of [B, 4, A])"]
    x = np.random.default_rng(4).normal(size=(2, len(COUNTS), 4)).astype(np.float32)  # A == C too
    expected = sigmoid(x.astype(np.float64) - 0.5 * np.log(COUNTS)[None, :, None])
    np.testing.assert_allclose(session(out).run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_sigmoid_with_two_axes_of_the_class_count_is_refused():
    model = class_axis_graph(len(COUNTS), "Sigmoid", background=False)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = len(COUNTS)  # [B, 4, 4]
    with pytest.raises(NorcalError, match=r"'logits' \[B, 4, 4\]: axes 1, 2 all have size 4") as e:
        calibrate_graph(model, 0.5, table(COUNTS), logits="logits", background="none")
    assert e.value.params == ("logits",)


def test_several_candidates_are_listed_with_names_and_shapes():
    from onnx_graphs import classifier_graph

    with pytest.raises(NorcalError, match=r"ambiguous: 2 classifier candidates: .*'logits0' \[N, 6\].*"
                                          r"'logits1' \[N, 6\].*name the one to calibrate as logits"):
        calibrate_graph(classifier_graph(heads=2), 0.5, table(np.arange(1.0, 6.0)))
