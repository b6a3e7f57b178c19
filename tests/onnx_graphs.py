"""Small hand-built ONNX graphs for surgery and checker tests."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def classifier_graph(num_classes=5, features=8, heads=1, activation="Softmax", dynamic=True, seed=0):
    """x [N, features] -> Gemm -> Softmax/Sigmoid -> scores_i, with ``heads`` parallel classifiers."""
    rng = np.random.default_rng(seed)
    n = "N" if dynamic else 4
    nodes, inits, outputs = [], [], []
    for h in range(heads):
        w = rng.normal(size=(num_classes + 1, features)).astype(np.float32)
        b = rng.normal(size=(num_classes + 1,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{h}"), numpy_helper.from_array(b, f"B{h}")]
        nodes.append(helper.make_node("Gemm", ["x", f"W{h}", f"B{h}"], [f"logits{h}"], name=f"cls{h}", transB=1))
        attrs = {"axis": -1} if activation == "Softmax" else {}
        nodes.append(helper.make_node(activation, [f"logits{h}"], [f"scores{h}"], name=f"act{h}", **attrs))
        outputs.append(helper.make_tensor_value_info(f"scores{h}", TensorProto.FLOAT, [n, num_classes + 1]))
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, features])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def gemm_weights(model, head=0):
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return inits[f"W{head}"], inits[f"B{head}"]
