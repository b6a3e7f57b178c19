"""int8 / fp16 on a hand-built detector head (fast): which nodes stay fp32, and the quantized
graphs computed by ONNX Runtime against the fp32 graph (the slow module does the trained model)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from conftest import assert_tensorrt_compatible
from cpu_kernels import INT8_SATURATES
from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.export.graph.fp32_region import fp32_nodes, name_nodes
from norcal.export.graph.quantize import convert_fp16, quantize_int8

C = 4  # classes; logits have C + 1 entries (background last)


def head_model(metadata=True) -> onnx.ModelProto:
    """images [B,3,8,8] -> conv -> relu -> flatten -> fc -> relu -> {cls (logits) -> softmax,
    bbox deltas -> boxes = deltas * 2}: a backbone, a box head, a box predictor, and what
    follows the classifier."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32) * 0.3, f"w{len(shape)}_{shape[0]}")

    inits = [w(8, 3, 3, 3), w(16, 8 * 36), w(C + 1, 16), w(4, 16),
             numpy_helper.from_array(np.zeros(16, np.float32), "fc_b"),
             numpy_helper.from_array(np.array([2.0], np.float32), "two")]
    conv_w, fc_w, cls_w, box_w = (i.name for i in inits[:4])
    nodes = [
        h.make_node("Conv", ["images", conv_w], ["c"], name="backbone/conv"),
        h.make_node("Relu", ["c"], ["r"], name="backbone/relu"),
        h.make_node("Flatten", ["r"], ["f"], name="head/flatten"),
        h.make_node("Gemm", ["f", fc_w, "fc_b"], ["fc"], name="head/fc", transB=1),
        h.make_node("Relu", ["fc"], ["fr"], name="head/relu"),
        h.make_node("Gemm", ["fr", cls_w], ["cls_logits"], name="predictor/cls", transB=1),
        h.make_node("Gemm", ["fr", box_w], ["deltas"], name="predictor/bbox", transB=1),
        h.make_node("Softmax", ["cls_logits"], ["probs"], name="post/softmax", axis=-1),
        h.make_node("Mul", ["deltas", "two"], ["boxes"], name="post/decode"),
    ]
    g = h.make_graph(nodes, "head", [h.make_tensor_value_info("images", T.FLOAT, ["B", 3, 8, 8])],
                     [h.make_tensor_value_info("probs", T.FLOAT, ["B", C + 1]),
                      h.make_tensor_value_info("boxes", T.FLOAT, ["B", 4])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    if metadata:
        h.set_model_props(m, {contract.CLASSIFIER_LOGITS: "cls_logits", contract.MIN_SIZE_TEST: "8",
                              contract.MAX_SIZE_TEST: "8"})
    onnx.checker.check_model(m)
    return m


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"images": x})


def _batches(n=8, seed=1):
    rng = np.random.default_rng(seed)
    return [{"images": rng.uniform(0, 1, size=(2, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def test_fp32_region_is_the_predictor_and_everything_after_the_logits():
    m = head_model()
    name_nodes(m)
    # the bbox layer reads the classifier's features: kept with it (its decoding Mul is no
    # layer int8 quantizes, and fp16 converts only what reads fp16 values)
    assert fp32_nodes(m) == {"predictor/cls", "predictor/bbox", "post/softmax"}


def test_a_model_without_the_contract_metadata_is_refused():
    with pytest.raises(NorcalError, match="no norcal.classifier_logits metadata"):
        fp32_nodes(head_model(metadata=False))
    m = head_model()
    m.metadata_props[0].value = "nowhere"
    with pytest.raises(NorcalError, match="names nowhere, which no node"):
        fp32_nodes(m)


def test_int8_quantizes_the_backbone_and_head_only_and_stays_close():
    m = head_model()
    q, n = quantize_int8(m, iter(_batches()))
    assert n == 16  # 8 batches of 2 images
    nodes = {x.name: x for x in q.graph.node}
    producer = {o: x for x in q.graph.node for o in x.output}
    for name in ("backbone/conv", "head/fc"):
        assert [producer[i].op_type for i in nodes[name].input[:2]] == ["DequantizeLinear"] * 2, name
    for name in ("predictor/cls", "predictor/bbox"):
        assert all(i not in producer or producer[i].op_type != "DequantizeLinear" for i in nodes[name].input)
    assert_tensorrt_compatible(q)
    x = _batches(1, seed=7)[0]["images"]
    (p32, b32), (p8, b8) = _run(m, x), _run(q, x)
    # int8 activations and weights over a 0..1 input: within a few percent of the range
    np.testing.assert_allclose(p8, p32, atol=0.05)
    np.testing.assert_allclose(b8, b32, atol=0.05 * np.abs(b32).max())


def test_int8_without_calibration_images_is_one_error():
    with pytest.raises(NorcalError, match="no calibration images"):
        quantize_int8(head_model(), iter([]))


def test_fp16_converts_the_layers_and_keeps_io_and_the_predictor_fp32():
    m = head_model()
    half = convert_fp16(m)
    inits = {i.name: i.data_type for i in half.graph.initializer}
    nodes = {x.name: x for x in half.graph.node}
    assert inits[nodes["backbone/conv"].input[1]] == T.FLOAT16 and inits[nodes["head/fc"].input[1]] == T.FLOAT16
    assert inits[nodes["predictor/cls"].input[1]] == T.FLOAT and inits["two"] == T.FLOAT
    assert [o.type.tensor_type.elem_type for o in half.graph.output] == [T.FLOAT, T.FLOAT]
    assert_tensorrt_compatible(half)
    x = _batches(1, seed=7)[0]["images"]
    for got, want in zip(_run(half, x), _run(m, x)):
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3)
    assert {p.key: p.value for p in half.metadata_props}[contract.PRECISION] == "fp16"


def _optimized_op_types(model, tmp_path) -> list[str]:
    """The op types ONNX Runtime's CPU provider runs after its optimizer (default level)."""
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]


def deep_head_model() -> onnx.ModelProto:
    """head_model with a second fc (head/fc2, then a ReLU) between head/fc and the predictor."""
    m = head_model()
    g = m.graph
    rng = np.random.default_rng(3)
    g.initializer.append(numpy_helper.from_array(rng.normal(size=(16, 16)).astype(np.float32) * 0.3, "fc2_w"))
    for n in g.node:
        if n.name.startswith("predictor/"):
            n.input[0] = "fr2"
    at = next(i for i, n in enumerate(g.node) if n.name == "head/relu") + 1
    g.node.insert(at, h.make_node("Gemm", ["fr", "fc2_w"], ["fc2"], name="head/fc2", transB=1))
    g.node.insert(at + 1, h.make_node("Relu", ["fc2"], ["fr2"], name="head/relu2"))
    onnx.checker.check_model(m)
    return m


def test_ort_form_runs_int8_kernels_in_onnxruntime(tmp_path):
    """The ort form: ONNX Runtime fuses the backbone's conv into QLinearConv and the box head's
    first fc into QGemm (int8 kernels); the tensorrt form leaves the conv in float (the reason
    for the ort form). The last fc (its result feeds the box predictor only) and the predictor
    stay float Gemms."""
    m = deep_head_model()
    ort_form, _ = quantize_int8(m, iter(_batches()), form="ort")
    trt_form, _ = quantize_int8(m, iter(_batches()))
    ops = _optimized_op_types(ort_form, tmp_path)
    assert ops.count("QLinearConv") == 1 and "Conv" not in ops and ops.count("QGemm") == 1, ops
    assert sum(op in ("Gemm", "FusedGemm") for op in ops) == 3, ops  # head/fc2, predictor/cls, /bbox
    trt_ops = _optimized_op_types(trt_form, tmp_path)
    # its convolutions have no Q on their outputs: float kernels (Gemms fuse either way: QGemm
    # may write float)
    assert not {"QLinearConv", "ConvInteger"} & set(trt_ops) and "FusedConv" in trt_ops, trt_ops
    # uint8 activations with a zero point, int8 weights with none, int32 biases
    inits = {t.name: t for t in ort_form.graph.initializer}
    nodes = {x.name: x for x in ort_form.graph.node}
    producer = {o: x for x in ort_form.graph.node for o in x.output}
    conv = nodes["backbone/conv"]
    x_dq, w_dq = producer[conv.input[0]], producer[conv.input[1]]
    assert inits[x_dq.input[2]].data_type == T.UINT8 and inits[w_dq.input[0]].data_type == T.INT8
    assert not numpy_helper.to_array(inits[w_dq.input[2]]).any()
    assert inits[producer[nodes["head/fc"].input[2]].input[0]].data_type == T.INT32
    assert [c.op_type for c in ort_form.graph.node if conv.output[0] in c.input] == ["QuantizeLinear"]
    # the fp32 graph's numbers to int8's rounding: measured 0.001 on the probabilities, 6.7% of
    # the box range (the fc's output is quantized too, to a range 16 calibration images saw;
    # the tensorrt form: 1%)
    x = _batches(1, seed=7)[0]["images"]
    (p32, b32), (p8, b8) = _run(m, x), _run(ort_form, x)
    np.testing.assert_allclose(p8, p32, atol=0.05)
    # on a CPU without VNNI (AVX2 only) the ort form measured 12.8 % of the box range
    np.testing.assert_allclose(b8, b32, atol=(0.15 if INT8_SATURATES else 0.1) * np.abs(b32).max())


def test_ort_form_is_recorded_and_fails_the_tensorrt_check_in_its_first_line():
    from norcal.export.trt_check import check_model

    m = head_model()
    q, _ = quantize_int8(m, iter(_batches(2)), form="ort")
    meta = {p.key: p.value for p in q.metadata_props}
    assert meta[contract.PRECISION] == "int8" and meta[contract.INT8_FORM] == "ort"
    assert "(ort form)" in meta[contract.QUANTIZATION]
    report = check_model(q)
    assert not report.compatible and "norcal.int8_form=ort" in report.errors[0].reason
    t, _ = quantize_int8(m, iter(_batches(2)))
    assert {p.key: p.value for p in t.metadata_props}[contract.INT8_FORM] == "tensorrt"
    with pytest.raises(NorcalError, match="int8 form 'qop': choose one of tensorrt, ort"):
        quantize_int8(m, iter(_batches(2)), form="qop")


def test_ort_form_gives_a_shared_bias_to_each_conv_and_fuses_both(tmp_path):
    """The exporter writes a bias two convolutions share through Identity nodes; ONNX Runtime
    fuses a Conv into QLinearConv only with an int32 bias initializer of its own."""
    m = head_model()
    g = m.graph
    g.initializer.append(numpy_helper.from_array(np.full(8, 0.1, np.float32), "shared_b"))
    conv = next(n for n in g.node if n.name == "backbone/conv")
    conv.input.append("b1")
    g.node.insert(0, h.make_node("Identity", ["shared_b"], ["b1"], name="id1"))
    onnx.checker.check_model(m)
    q, _ = quantize_int8(m, iter(_batches(2)), form="ort")
    assert "Identity" not in [n.op_type for n in q.graph.node]
    assert _optimized_op_types(q, tmp_path).count("QLinearConv") == 1
    x = _batches(1, seed=7)[0]["images"]
    np.testing.assert_allclose(_run(q, x)[0], _run(m, x)[0], atol=0.05)


def mask_model() -> onnx.ModelProto:
    """head_model with a mask branch: the backbone's features, selected by the classifier's
    probabilities (as RoIAlign pools the kept detections' boxes) -> conv -> masks."""
    m = head_model()
    g = m.graph
    g.initializer.append(numpy_helper.from_array(np.full((2, 8, 3, 3), 0.1, np.float32), "mask_w"))
    g.node.extend([
        h.make_node("ReduceMax", ["probs"], ["pmax"], name="mask/select", axes=[1], keepdims=1),
        h.make_node("Unsqueeze", ["pmax", "axes23"], ["pmax4"], name="mask/unsq"),
        h.make_node("Mul", ["r", "pmax4"], ["mask_in"], name="mask/pool"),
        h.make_node("Conv", ["mask_in", "mask_w"], ["masks"], name="mask/conv", pads=[1, 1, 1, 1])])
    g.initializer.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes23"))
    g.output.append(h.make_tensor_value_info("masks", T.FLOAT, ["B", 2, 6, 6]))
    onnx.checker.check_model(m)
    return m


def test_mask_only_layers_are_the_layers_feeding_masks_alone():
    from norcal.export.graph.fp32_region import mask_only_layers

    m = mask_model()
    name_nodes(m)
    assert mask_only_layers(m) == {"mask/conv"}
    assert mask_only_layers(head_model()) == set()  # no masks output


def test_int8_mask_head_quantizes_the_mask_layer_only_when_asked():
    m = mask_model()
    producer = lambda q: {o: x for x in q.graph.node for o in x.output}  # noqa: E731
    for mask_head in (False, True):
        q, _ = quantize_int8(m, iter(_batches(2)), form="ort", mask_head=mask_head)
        conv = next(x for x in q.graph.node if x.name == "mask/conv")
        dq = producer(q).get(conv.input[1])
        got = dq is not None and dq.op_type == "DequantizeLinear"
        assert got == mask_head
        assert ("mask head int8 (1 layers)" in {p.key: p.value for p in q.metadata_props}[contract.QUANTIZATION]) \
            == mask_head


def test_cli_refuses_int8_form_options_for_fp16_in_one_line(tmp_path, capsys):
    from norcal.cli import main

    onnx.save(head_model(), str(tmp_path / "m.onnx"))
    for extra in (["--form", "ort"], ["--int8-mask-head"]):
        assert main(["quantize", str(tmp_path / "m.onnx"), "--precision", "fp16", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "fp16 takes neither" in err, err
    assert not (tmp_path / "m.fp16.onnx").exists()


def decoder_model() -> onnx.ModelProto:
    """A transformer decoder's tail as torch exports it: x -> a residual block (MatMul + bias
    Add, then x + it) -> the class head (MatMul + Add of a bias shared through an Identity, as
    the exporter writes equal biases) and a box layer on the same features -> each layer's
    logits stacked (Unsqueeze, Concat) and the last one gathered: cls_logits -> Sigmoid."""
    rng = np.random.default_rng(0)
    f = lambda name, *shape: numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)  # noqa: E731
    inits = [f("w_ff", 8, 8), f("b_ff", 8), f("w_cls", 8, C), f("b_cls", C), f("w_box", 8, 4),
             numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             numpy_helper.from_array(np.array(0, np.int64), "last")]
    nodes = [
        h.make_node("MatMul", ["x", "w_ff"], ["ff"], name="layer/ff"),
        h.make_node("Add", ["ff", "b_ff"], ["ffb"], name="layer/ff_bias"),
        h.make_node("Add", ["x", "ffb"], ["feat"], name="layer/residual"),
        h.make_node("MatMul", ["feat", "w_cls"], ["cls_mm"], name="score_head/MatMul"),
        h.make_node("Identity", ["b_cls"], ["b_cls_copy"], name="score_head/bias_copy"),
        h.make_node("Add", ["b_cls_copy", "cls_mm"], ["cls"], name="score_head/Add"),
        h.make_node("MatMul", ["feat", "w_box"], ["box"], name="box_head/MatMul"),
        h.make_node("Unsqueeze", ["cls", "axis0"], ["stacked1"], name="stack/unsqueeze"),
        h.make_node("Concat", ["stacked1"], ["stacked"], name="stack/concat", axis=0),
        h.make_node("Gather", ["stacked", "last"], ["cls_logits"], name="last/gather", axis=0),
        h.make_node("Sigmoid", ["cls_logits"], ["scores"], name="post/sigmoid"),
    ]
    g = h.make_graph(nodes, "decoder", [h.make_tensor_value_info("x", T.FLOAT, ["B", 8])],
                     [h.make_tensor_value_info("scores", T.FLOAT, ["B", C]),
                      h.make_tensor_value_info("box", T.FLOAT, ["B", 4])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    h.set_model_props(m, {contract.CLASSIFIER_LOGITS: "cls_logits"})
    onnx.checker.check_model(m)
    return m


def test_fp32_region_reaches_a_decoder_class_head_through_gather_and_its_bias_add():
    """The walk back from the logits passes the Gather of the last layer, the stacking and the
    class head's bias Add (one input a constant), not the residual Add (both inputs computed):
    the feed-forward layer before stays int8."""
    m = decoder_model()
    assert fp32_nodes(m) == {"post/sigmoid", "last/gather", "stack/concat", "stack/unsqueeze", "score_head/Add",
                             "score_head/MatMul", "box_head/MatMul"}


def test_layers_feeding_the_prototypes_are_mask_layers_too():
    """A YOLO segment graph's prototypes (the mask_protos output) come from their own convs:
    those feed the masks alone as well; a conv feeding both masks outputs is one too."""
    from norcal.export.graph.fp32_region import mask_only_layers

    m = mask_model()
    g = m.graph
    g.initializer.append(numpy_helper.from_array(np.full((2, 2, 1, 1), 0.1, np.float32), "proto_w"))
    g.node.append(h.make_node("Conv", ["masks", "proto_w"], ["mask_protos"], name="proto/conv"))
    g.output.append(h.make_tensor_value_info("mask_protos", T.FLOAT, ["B", 2, 6, 6]))
    onnx.checker.check_model(m)
    name_nodes(m)
    assert mask_only_layers(m) == {"mask/conv", "proto/conv"}
    assert mask_only_layers(m, ["masks"]) == set()  # mask/conv reaches the prototypes too
