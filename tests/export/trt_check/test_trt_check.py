"""The static TensorRT check: expectations come from the TensorRT 10.15 support matrix
(docs/tensorrt_onnx_support.md), written here by hand."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.export.trt_check import check_model
from norcal.cli.options import parse_profile
from norcal.export.trt_check.support import OPERATORS, TENSORRT_VERSION


def _model(nodes, inputs, outputs, inits=(), opset=17, functions=(), extra_opsets=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, functions=list(functions),
                     opset_imports=[h.make_opsetid("", opset), *extra_opsets])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def _runs_in_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _errors(report):
    return [(f.node, f.op_type) for f in report.errors]


def _vi(name, dtype, shape):
    return h.make_tensor_value_info(name, dtype, shape)


def test_table_is_tensorrt_10_15_matrix():
    assert TENSORRT_VERSION == "10.15"
    # 42 operators are marked N in the 10.15 matrix (reference section 2)
    assert sum(not o.supported for o in OPERATORS.values()) == 42
    assert not OPERATORS["Unique"].supported and not OPERATORS["Compress"].supported
    assert OPERATORS["RoiAlign"].types == {"FP32", "FP16"}
    assert "INT64" not in OPERATORS["MatMul"].types and "INT64" in OPERATORS["Add"].types


def test_supported_small_graph_passes():
    w = h.make_tensor("w", T.FLOAT, [4, 3, 3, 3], np.ones(108, np.float32))
    axes = h.make_tensor("axes", T.INT64, [2], [2, 3])
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"], name="relu"),
        h.make_node("ReduceMean", ["r", "axes"], ["m"], name="mean", keepdims=0),
        h.make_node("Softmax", ["m"], ["y"], name="softmax", axis=-1),
    ]
    m = _model(nodes, [_vi("x", T.FLOAT, [1, 3, 8, 8])], [_vi("y", T.FLOAT, [1, 4])], [w, axes], opset=18)
    _runs_in_ort(m, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    r = check_model(m)
    assert r.compatible, [str(f) for f in r.findings]
    assert r.findings == []
    assert r.op_types == ["Conv", "ReduceMean", "Relu", "Softmax"]


def _norcal_function():
    return h.make_function(
        "ai.norcal", "NorCal", ["logits", "log_prior"], ["probs"],
        [h.make_node("Sub", ["logits", "log_prior"], ["z"], name="sub"),
         h.make_node("Softmax", ["z"], ["probs"], name="softmax", axis=-1)],
        opset_imports=[h.make_opsetid("", 17)])


def test_model_local_function_is_expanded_and_passes():
    prior = h.make_tensor("norcal.log_prior", T.FLOAT, [4], [0.5, 1.0, 2.0, 0.0])
    node = h.make_node("NorCal", ["logits", "norcal.log_prior"], ["scores"], domain="ai.norcal", name="norcal")
    m = _model([node], [_vi("logits", T.FLOAT, [10, 4])], [_vi("scores", T.FLOAT, [10, 4])], [prior],
               functions=[_norcal_function()], extra_opsets=[h.make_opsetid("ai.norcal", 1)])
    _runs_in_ort(m, {"logits": np.zeros((10, 4), np.float32)})
    r = check_model(m)
    assert r.compatible, [str(f) for f in r.findings]
    assert r.op_types == ["Softmax", "Sub"]  # the body's ops, not "NorCal"


def test_function_with_its_own_opset_is_expanded():
    """A function importing another (compatible) default opset than the model is expanded like
    TensorRT does; onnx.inliner (onnx 1.23) leaves such a call as it is, which is why the
    checker keeps its own flattener."""
    from onnx.inliner import inline_local_functions

    fn = h.make_function("ai.norcal", "NorCal", ["logits", "log_prior"], ["probs"],
                         [h.make_node("Sub", ["logits", "log_prior"], ["z"], name="sub"),
                          h.make_node("Softmax", ["z"], ["probs"], name="softmax", axis=-1)],
                         opset_imports=[h.make_opsetid("", 14)])
    prior = h.make_tensor("norcal.log_prior", T.FLOAT, [4], [0.5, 1.0, 2.0, 0.0])
    node = h.make_node("NorCal", ["logits", "norcal.log_prior"], ["scores"], domain="ai.norcal", name="norcal")
    m = _model([node], [_vi("logits", T.FLOAT, [10, 4])], [_vi("scores", T.FLOAT, [10, 4])], [prior],
               functions=[fn], extra_opsets=[h.make_opsetid("ai.norcal", 1)])
    _runs_in_ort(m, {"logits": np.zeros((10, 4), np.float32)})
    r = check_model(m)
    assert r.compatible, [str(f) for f in r.findings]
    assert r.op_types == ["Softmax", "Sub"]
    assert [n.op_type for n in inline_local_functions(m).graph.node] == ["NorCal"]


def test_unsupported_op_inside_local_function_names_the_path():
    fn = h.make_function("ai.norcal", "Dedup", ["x"], ["y"],
                         [h.make_node("Unique", ["x"], ["y"], name="uniq", sorted=1)],
                         opset_imports=[h.make_opsetid("", 17)])
    node = h.make_node("Dedup", ["x"], ["y"], domain="ai.norcal", name="dedup")
    m = _model([node], [_vi("x", T.FLOAT, [5])], [_vi("y", T.FLOAT, ["U"])], functions=[fn],
               extra_opsets=[h.make_opsetid("ai.norcal", 1)])
    r = check_model(m)
    assert not r.compatible
    assert _errors(r) == [("dedup > uniq", "Unique")]


def test_unique_fails_naming_the_node():
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("Unique", ["r"], ["y"], name="dedupe_scores")]
    m = _model(nodes, [_vi("x", T.FLOAT, [5])], [_vi("y", T.FLOAT, ["U"])])
    _runs_in_ort(m, {"x": np.array([1, 1, 2, 3, 3], np.float32)})
    r = check_model(m)
    assert _errors(r) == [("dedupe_scores", "Unique")]
    assert "not supported" in r.errors[0].reason


def _topk_model(k, sorted_=1, n=6000):
    kt = h.make_tensor("k", T.INT64, [1], [k])
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], name="topk_scores", sorted=sorted_)
    return _model([node], [_vi("x", T.FLOAT, [1, n])],
                  [_vi("v", T.FLOAT, [1, k]), _vi("i", T.INT64, [1, k])], [kt])


def test_topk_k_5000_fails_and_k_300_passes():
    big = _topk_model(5000)
    _runs_in_ort(big, {"x": np.random.rand(1, 6000).astype(np.float32)})
    r = check_model(big)
    assert _errors(r) == [("topk_scores", "TopK")]
    assert "K=5000" in r.errors[0].reason and "3840" in r.errors[0].reason
    assert check_model(_topk_model(3839)).compatible
    assert _errors(check_model(_topk_model(3840))) == [("topk_scores", "TopK")]
    assert check_model(_topk_model(300)).compatible


def test_topk_k_through_constant_folding_and_sorted_0():
    # K = Unsqueeze(Constant 4000): resolvable at build time, so the limit applies
    nodes = [h.make_node("Constant", [], ["k0"], value=h.make_tensor("k0v", T.INT64, [], [4000])),
             h.make_node("Unsqueeze", ["k0", "ax"], ["k"]),
             h.make_node("TopK", ["x", "k"], ["v", "i"], name="tk")]
    ax = h.make_tensor("ax", T.INT64, [1], [0])
    m = _model(nodes, [_vi("x", T.FLOAT, [1, 5000])], [_vi("v", T.FLOAT, [1, "K"]), _vi("i", T.INT64, [1, "K"])], [ax])
    assert _errors(check_model(m)) == [("tk", "TopK")]
    unsorted = check_model(_topk_model(10, sorted_=0))
    assert _errors(unsorted) == [("topk_scores", "TopK")] and "sorted" in unsorted.errors[0].reason


def _roialign_model(**attrs):
    node = h.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="box_pooler",
                       output_height=7, output_width=7, spatial_scale=0.25, **attrs)
    return _model([node], [_vi("x", T.FLOAT, [1, 8, 32, 32]), _vi("rois", T.FLOAT, [1, 4]),
                           _vi("idx", T.INT64, [1])], [_vi("y", T.FLOAT, [1, 8, 7, 7])],
                  opset=16)


def test_roialign_needs_sampling_ratio():
    m = _roialign_model(coordinate_transformation_mode="half_pixel")
    _runs_in_ort(m, {"x": np.zeros((1, 8, 32, 32), np.float32),
                     "rois": np.array([[0, 0, 8, 8]], np.float32), "idx": np.zeros(1, np.int64)})
    r = check_model(m)
    assert _errors(r) == [("box_pooler", "RoiAlign")]
    assert "sampling_ratio" in r.errors[0].reason
    ok = check_model(_roialign_model(coordinate_transformation_mode="half_pixel", sampling_ratio=0))
    assert ok.compatible, [str(f) for f in ok.findings]


def test_dynamic_dim_without_profile_fails_and_profile_fixes_it():
    m = _model([h.make_node("Relu", ["x"], ["y"], name="relu")],
               [_vi("x", T.FLOAT, ["N", 16])], [_vi("y", T.FLOAT, ["N", 16])])
    r = check_model(m)
    assert _errors(r) == [("graph input 'x'", "-")]
    assert "dim 0 (N)" in r.errors[0].reason and "a profile (x:MIN:OPT:MAX)" in r.errors[0].reason
    assert check_model(m, [parse_profile("x:1x16:4x16:8x16")]).compatible
    # a profile that changes a fixed dim is wrong
    bad = check_model(m, [parse_profile("x:1x8:4x16:8x16")])
    assert not bad.compatible and "fixes at 16" in bad.errors[0].reason
    with pytest.raises(NorcalError, match="no such input"):
        check_model(m, [parse_profile("y:1x16:1x16:1x16")])


def test_detector_inputs_get_a_stated_default_profile():
    nodes = [h.make_node("ReduceMax", ["images"], ["m"], name="rm", keepdims=0),
             h.make_node("Cast", ["image_sizes"], ["s"], name="cast", to=T.FLOAT),
             h.make_node("Add", ["m", "s"], ["y"], name="add")]
    m = _model(nodes, [_vi("images", T.FLOAT, ["B", 3, "H", "W"]), _vi("image_sizes", T.INT64, ["B", 2])],
               [_vi("y", T.FLOAT, ["B", 2])])
    r = check_model(m)
    assert r.compatible, [str(f) for f in r.findings]
    assert r.profiles["images"].source == "default"
    # detectron2 800/1333, padded to 32: H and W in [32, 1344]
    assert r.profiles["images"].max[2:] == (1344, 1344) and r.profiles["images"].min[2:] == (32, 32)
    assert any("default profile assumes" in n for n in r.notes)


def test_other_static_restrictions():
    nodes = [
        h.make_node("Resize", ["x", "", "scales"], ["r"], name="up", mode="cubic"),
        h.make_node("ScatterND", ["r", "ind", "upd"], ["s"], name="scatter", reduction="add"),
        h.make_node("Cast", ["s"], ["c"], name="to_u16", to=T.UINT16),
    ]
    inits = [h.make_tensor("scales", T.FLOAT, [4], [1, 1, 2, 2]),
             h.make_tensor("ind", T.INT64, [1, 4], [0, 0, 0, 0]),
             h.make_tensor("upd", T.FLOAT, [1], [1.0])]
    m = _model(nodes, [_vi("x", T.FLOAT, [1, 1, 4, 4])], [_vi("c", T.UINT16, [1, 1, 8, 8])], inits)
    r = check_model(m)
    assert set(_errors(r)) >= {("up", "Resize"), ("scatter", "ScatterND"), ("to_u16", "Cast")}


def test_uint8_inside_network_and_reduce_axes_computed():
    nodes = [h.make_node("Cast", ["x"], ["u"], name="to_u8", to=T.UINT8),
             h.make_node("Cast", ["u"], ["f"], name="back", to=T.FLOAT),
             h.make_node("Shape", ["f"], ["sh"], name="shape"),
             h.make_node("Gather", ["sh", "zero"], ["axes"], name="g"),
             h.make_node("ReduceSum", ["f", "axes"], ["y"], name="rsum", keepdims=1)]
    m = _model(nodes, [_vi("x", T.FLOAT, ["N"])], [_vi("y", T.FLOAT, [1])],
               [h.make_tensor("zero", T.INT64, [1], [0])], opset=17,)
    r = check_model(m, [parse_profile("x:1:2:4")])
    errs = _errors(r)
    assert ("to_u8", "Cast") in errs  # UINT8 only at network I/O
    assert ("rsum", "ReduceSum") in errs  # axes must be an initializer


def test_nms_warns_over_5000_candidates_with_shape():
    nodes = [h.make_node("NonMaxSuppression", ["boxes", "scores", "mob", "iou"], ["sel"], name="nms")]
    inits = [h.make_tensor("mob", T.INT64, [1], [100]), h.make_tensor("iou", T.FLOAT, [1], [0.5])]
    m = _model(nodes, [_vi("boxes", T.FLOAT, [1, 1000, 4]), _vi("scores", T.FLOAT, [1, 1203, 1000])],
               [_vi("sel", T.INT64, ["S", 3])], inits)
    r = check_model(m)
    assert r.compatible
    [w] = r.warnings
    assert (w.node, w.op_type) == ("nms", "NonMaxSuppression")
    assert "[1, 1203, 1000]" in w.reason and "1203000" in w.reason and "5000" in w.reason
    folded = _model(nodes, [_vi("boxes", T.FLOAT, [1203, 1000, 4]), _vi("scores", T.FLOAT, [1203, 1, 1000])],
                    [_vi("sel", T.INT64, ["S", 3])], inits)
    assert check_model(folded).warnings == []


def test_opset_out_of_range():
    m = _model([h.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", T.FLOAT, [2])],
               [_vi("y", T.FLOAT, [2])], opset=8)
    assert not check_model(m).compatible


def test_double_is_warned_not_failed():
    nodes = [h.make_node("Cast", ["x"], ["d"], name="to_double", to=T.DOUBLE),
             h.make_node("Cast", ["d"], ["y"], name="to_float", to=T.FLOAT)]
    m = _model(nodes, [_vi("x", T.FLOAT, [2])], [_vi("y", T.FLOAT, [2])])
    r = check_model(m)
    assert r.compatible and r.warnings
    assert all(w.node == "to_double" for w in r.warnings)


def test_cli_exit_codes(tmp_path, capsys):
    ok = _model([h.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", T.FLOAT, ["N", 4])],
                [_vi("y", T.FLOAT, ["N", 4])])
    path = tmp_path / "ok.onnx"
    onnx.save(ok, path)
    assert main(["check", str(path), "--profile", "x:1x4:2x4:8x4"]) == 0
    assert "compatible" in capsys.readouterr().out
    assert main(["check", str(path)]) == 1  # dynamic N, no profile
    out = capsys.readouterr().out
    assert "graph input 'x'" in out
    bad = tmp_path / "bad.onnx"
    onnx.save(_topk_model(5000), bad)
    assert main(["check", str(bad)]) == 1
    assert "topk_scores" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "missing.onnx")]) == 2
    assert main(["check", str(path), "--profile", "x:1x4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "error:" in err


def test_default_profile_keeps_dims_the_model_fixes():
    nodes = [h.make_node("ReduceMax", ["images"], ["m"], name="rm", keepdims=0),
             h.make_node("Cast", ["image_sizes"], ["s"], name="cast", to=T.FLOAT),
             h.make_node("Add", ["m", "s"], ["y"], name="add")]
    m = _model(nodes, [_vi("images", T.FLOAT, [1, 3, "H", 640]), _vi("image_sizes", T.INT64, [1, 2])],
               [_vi("y", T.FLOAT, [1, 2])])
    r = check_model(m)
    assert r.compatible, [str(f) for f in r.findings]
    p = r.profiles["images"]
    assert (p.min, p.opt, p.max) == ((1, 3, 32, 640), (1, 3, 800, 640), (1, 3, 1344, 640))
    assert r.profiles["image_sizes"].max == (1, 2)


def test_subgraph_nodes_are_checked():
    then_g = h.make_graph([h.make_node("Unique", ["x"], ["u"], name="uniq")], "then", [],
                          [_vi("u", T.FLOAT, ["U"])])
    else_g = h.make_graph([h.make_node("Identity", ["x"], ["e"], name="ident")], "else", [],
                          [_vi("e", T.FLOAT, [4])])
    node = h.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)
    m = _model([node], [_vi("c", T.BOOL, []), _vi("x", T.FLOAT, [4])], [_vi("y", T.FLOAT, ["U"])])
    assert _errors(check_model(m)) == [("branch > then_branch > uniq", "Unique")]


def test_custom_domains_and_function_name_clash():
    # a local function named like a built-in op is never used by TensorRT (its importer wins)
    fn = h.make_function("ai.norcal", "Softmax", ["x"], ["y"], [h.make_node("Relu", ["x"], ["y"])],
                         opset_imports=[h.make_opsetid("", 17)])
    nodes = [h.make_node("Softmax", ["x"], ["a"], domain="ai.norcal", name="custom_softmax"),
             h.make_node("Frobnicate", ["a"], ["b"], domain="com.example", name="frob"),
             h.make_node("EfficientNMS_TRT", ["b"], ["y"], domain="trt.plugins", name="nms_plugin")]
    # [1, 4]: NVIDIA's parser refuses a Softmax over a rank-1 tensor (test_nvidia_parser.py)
    g = h.make_graph(nodes, "g", [_vi("x", T.FLOAT, [1, 4])], [_vi("y", T.FLOAT, [1, 4])])
    m = h.make_model(g, functions=[fn], opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.norcal", 1),
                                                      h.make_opsetid("com.example", 1),
                                                      h.make_opsetid("trt.plugins", 1)])
    r = check_model(m)
    assert set(_errors(r)) == {("function ai.norcal.Softmax", "Softmax"), ("frob", "Frobnicate")}
    assert {(w.node, w.op_type) for w in r.warnings} == {("custom_softmax", "Softmax"),
                                                         ("nms_plugin", "EfficientNMS_TRT")}


def _qdq_conv_model(act_scale, w_scale, w_axis=0, zp_type=T.INT8, scale_from_input=False):
    """x -Q/DQ-> Conv(DQ(int8 weight)): explicit quantization as TensorRT takes it, with the
    scales and zero point's type given."""
    w = h.make_tensor("w_q", T.INT8, [4, 3, 3, 3], np.ones(108, np.int8))
    inits = [w, h.make_tensor("w_scale", T.FLOAT, [len(w_scale)], w_scale),
             h.make_tensor("w_zp", T.INT8, [len(w_scale)], [0] * len(w_scale)),
             h.make_tensor("x_zp", zp_type, [len(act_scale)] if len(act_scale) > 1 else [], [0] * len(act_scale))]
    if scale_from_input:
        nodes = [h.make_node("Identity", ["s"], ["x_scale"], name="computed_scale")]
    else:
        inits.append(h.make_tensor("x_scale", T.FLOAT, [len(act_scale)] if len(act_scale) > 1 else [], act_scale))
        nodes = []
    axis = {"axis": 1} if len(act_scale) > 1 else {}
    nodes += [h.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q_x", **axis),
              h.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="dq_x", **axis),
              h.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], name="dq_w", axis=w_axis),
              h.make_node("Conv", ["xd", "w"], ["y"], name="conv")]
    inputs = [_vi("x", T.FLOAT, [1, 3, 8, 8])] + ([_vi("s", T.FLOAT, [])] if scale_from_input else [])
    return _model(nodes, inputs, [_vi("y", T.FLOAT, [1, 4, 6, 6])], inits, opset=17)


def test_qdq_as_tensorrt_wants_passes_and_each_departure_fails():
    good = _qdq_conv_model([0.1], [0.5, 0.25, 0.125, 1.0])
    _runs_in_ort(good, {"x": np.ones((1, 3, 8, 8), np.float32)})
    assert check_model(good).compatible, [str(f) for f in check_model(good).findings]
    # uint8 activations (asymmetric ONNX Runtime default for CPUs): TensorRT quantizes to INT8
    assert ("q_x", "QuantizeLinear") in _errors(check_model(_qdq_conv_model([0.1], [0.5] * 4, zp_type=T.UINT8)))
    # one scale per channel of an activation: TensorRT's INT8 scales activations per tensor (warned)
    per_channel_act = check_model(_qdq_conv_model([0.1, 0.2, 0.3], [0.5] * 4))
    assert per_channel_act.compatible
    assert {(f.node, f.op_type) for f in per_channel_act.warnings} == {("q_x", "QuantizeLinear"),
                                                                       ("dq_x", "DequantizeLinear")}
    # a scale computed in the graph: TensorRT needs it at build time
    computed = check_model(_qdq_conv_model([0.1], [0.5] * 4, scale_from_input=True))
    assert {("q_x", "QuantizeLinear"), ("dq_x", "DequantizeLinear")} <= set(_errors(computed))
    assert "build-time constant" in computed.errors[0].reason


def test_qdq_per_channel_scale_must_match_the_axis():
    w = h.make_tensor("w_q", T.INT8, [4, 3], np.ones(12, np.int8))
    inits = [w, h.make_tensor("s", T.FLOAT, [3], [0.5, 0.25, 0.125]), h.make_tensor("zp", T.INT8, [3], [0, 0, 0])]
    nodes = [h.make_node("DequantizeLinear", ["w_q", "s", "zp"], ["w"], name="dq_w", axis=0)]
    g = h.make_graph(nodes, "g", [], [_vi("w", T.FLOAT, [4, 3])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])  # ONNX's checker does not catch it
    r = check_model(m)
    assert _errors(r) == [("dq_w", "DequantizeLinear")]
    assert "axis=0 has 4 channels but the scale has 3 values" in r.errors[0].reason
