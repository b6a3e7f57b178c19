"""A foreign softmax classifier's background slot, read from what the graph does with its
probabilities: a slot the graph contradicts is refused (NorCal on the wrong slot would rescale
the no-object logit as a class and leave a class unscaled: a silently wrong model)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable
from norcal.export.graph.calibrate import calibrate_graph
from classifier_lookup import find_classifiers
from norcal.export.graph.classifier_search import ClassifierView, background_in_graph

CLASSES = 3
INT64_MAX = 2**63 - 1


def _table():
    cats = [{"id": i + 1, "name": f"c{i}", "image_count": float(c), "instance_count": float(c),
             "frequency": "r"} for i, c in enumerate([1, 10, 100])]
    return CalibrationTable("t", "test", "image", cats)


def classifier_graph(drop: str | None, split_rows: bool = True) -> onnx.ModelProto:
    """features [R, 8] -> Gemm -> Softmax [R, C+1] -> (a per-row Slice) -> a Slice dropping the
    ``drop`` column ("first": [:, 1:], "last": [:, :-1], None: no Slice) -> scores."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(CLASSES + 1, 8)).astype(np.float32), "W"),
             numpy_helper.from_array(np.zeros(CLASSES + 1, np.float32), "b")]
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["logits"], transB=1, name="cls_score"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax")]
    src = "probs"
    if split_rows:  # a slice over rows (one image's boxes), as torchvision's export has first
        inits += [numpy_helper.from_array(np.array([0], np.int64), "r0"),
                  numpy_helper.from_array(np.array([INT64_MAX], np.int64), "r1"),
                  numpy_helper.from_array(np.array([0], np.int64), "r_axis")]
        nodes.append(helper.make_node("Slice", ["probs", "r0", "r1", "r_axis"], ["rows"], name="rows"))
        src = "rows"
    if drop is not None:
        start, end = (1, INT64_MAX) if drop == "first" else (0, -1)
        inits += [numpy_helper.from_array(np.array([start], np.int64), "c0"),
                  numpy_helper.from_array(np.array([end], np.int64), "c1"),
                  numpy_helper.from_array(np.array([1], np.int64), "c_axis")]
        nodes.append(helper.make_node("Slice", [src, "c0", "c1", "c_axis"], ["scores"], name="drop"))
    else:
        nodes.append(helper.make_node("Identity", [src], ["scores"], name="id"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", 8])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("drop", ["first", "last", None])
def test_the_dropped_column_names_the_slot(drop):
    model = classifier_graph(drop)
    cand = find_classifiers(model)[0]
    found = background_in_graph(ClassifierView(model), cand)
    assert (found and found[0]) == drop
    if drop is not None:
        assert found[1] == "drop"


def test_a_slice_of_rows_alone_says_nothing():
    model = classifier_graph(None, split_rows=True)
    assert background_in_graph(ClassifierView(model), find_classifiers(model)[0]) is None


@pytest.mark.parametrize("drop, given", [("first", "last"), ("first", None), ("last", "first")])
def test_a_slot_the_graph_contradicts_is_refused(drop, given):
    with pytest.raises(NorcalError) as e:
        calibrate_graph(classifier_graph(drop), 0.5, table=_table(), background=given)
    slot = drop
    assert f"puts its no-object logit {slot}" in str(e.value)
    assert f"give background {slot!r}" in str(e.value) and e.value.params == ("background",)


@pytest.mark.parametrize("drop, given", [("first", "first"), ("last", "last"), ("last", None), (None, None),
                                         (None, "first")])
def test_a_slot_the_graph_agrees_with_or_does_not_tell_is_taken(drop, given):
    out = calibrate_graph(classifier_graph(drop), 0.5, table=_table(), background=given)
    meta = {p.key: p.value for p in out.metadata_props}
    assert meta["norcal.background_index"] == ("0" if (given or "last") == "first" else str(CLASSES))
