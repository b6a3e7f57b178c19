"""The NorCal node: placement, ONNX Runtime parity with norcal.core.calibration.formula, replace and strip."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from norcal.core.calibration.formula import calibrate, log_prior
from norcal.core.errors import NorcalError
from norcal.export.graph.calibrate import calibrate_graph
from norcal.core import contract
from norcal.core.contract import NODE_DOMAIN as DOMAIN, PRIOR_NAME
from norcal.core.calibration.spec import Calibration
from classifier_lookup import find_classifiers
from norcal.export.graph.classifier_search import classifier_candidates
from norcal.export.graph.surgery import has_norcal, insert_norcal, norcal_metadata, strip_norcal

from onnx_graphs import classifier_graph, gemm_weights

COUNTS = np.array([1.0, 3.0, 10.0, 250.0, 4000.0])


def run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def settings(gamma, **kw):
    """The calibration with COUNTS as its table, resolved (what the surgery takes)."""
    return Calibration(gamma=gamma, table=kw.pop("table", None) or _table_file_free(), background="last",
                       **kw).resolve(None)


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("variant", [dict(), dict(mechanism="prob", renormalize=False),
                                     dict(mechanism="logit"), dict(factor="ens")])
def test_onnxruntime_matches_calibration(inline, variant):
    model = classifier_graph()
    factor = variant.get("factor", "cdt")
    gamma = 0.9 if factor == "ens" else 0.8
    lp = log_prior(COUNTS, gamma, factor)
    out = insert_norcal(model, settings(gamma, **variant, inline=inline))
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(1).normal(size=(7, 8)).astype(np.float32) * 3
    w, b = gemm_weights(model)
    logits = x @ w.T + b
    expected = calibrate(logits, lp, variant.get("mechanism", "exp"), variant.get("renormalize", True))
    np.testing.assert_allclose(run(out, x)[0], expected, atol=1e-6)
    kinds = [(n.op_type, n.domain) for n in out.graph.node]
    if inline:
        assert ("NorCal", DOMAIN) not in kinds and not out.functions
    else:
        assert kinds.count(("NorCal", DOMAIN)) == 1 and len(out.functions) == 1
    assert "act0" not in [n.name for n in out.graph.node]  # the plain activation is replaced


def test_node_spec_metadata_and_input_untouched():
    model = classifier_graph()
    before = model.SerializeToString()
    out = calibrate_graph(model, 0.5, _table_file_free())
    assert model.SerializeToString() == before  # pure function
    node = [n for n in out.graph.node if n.domain == DOMAIN][0]
    assert node.op_type == "NorCal" and list(node.input) == ["logits0", PRIOR_NAME]
    assert list(node.output) == ["scores0"]
    prior = [i for i in out.graph.initializer if i.name == PRIOR_NAME][0]
    assert list(prior.dims) == [len(COUNTS) + 1]
    meta = norcal_metadata(out)
    assert meta["norcal.gamma"] == "0.5" and meta["norcal.factor"] == "cdt"
    assert meta["norcal.mechanism"] == "exp" and meta["norcal.background_index"] == str(len(COUNTS))
    assert meta["norcal.num_classes"] == str(len(COUNTS)) and len(meta["norcal.table_sha256"]) == 64
    assert meta["norcal.tool_version"]
    # dynamic batch dimension kept
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def _table_file_free():
    from norcal.core.calibration.tables import CalibrationTable

    cats = [{"id": i + 1, "name": f"c{i}", "image_count": c, "instance_count": c, "frequency": "r"}
            for i, c in enumerate(COUNTS)]
    return CalibrationTable("toy", "test", "image", cats)


def test_rerun_replaces_never_stacks_and_strip_restores():
    model = classifier_graph()
    x = np.random.default_rng(2).normal(size=(5, 8)).astype(np.float32)
    once = insert_norcal(model, settings(0.2))
    twice = insert_norcal(once, settings(1.1))
    assert sum(n.op_type == "NorCal" for n in twice.graph.node) == 1
    assert len(twice.functions) == 1
    assert sum(i.name == PRIOR_NAME for i in twice.graph.initializer) == 1
    assert norcal_metadata(twice)["norcal.gamma"] == "1.1"
    w, b = gemm_weights(model)
    np.testing.assert_allclose(run(twice, x)[0], calibrate(x @ w.T + b, log_prior(COUNTS, 1.1)), atol=1e-6)
    plain = strip_norcal(twice)
    # the table's runtime keys (class order) stay; no node key does
    assert not has_norcal(plain) and set(norcal_metadata(plain)) <= contract.RUNTIME_KEYS and not plain.functions
    np.testing.assert_allclose(run(plain, x)[0], run(model, x)[0], atol=1e-7)
    onnx.checker.check_model(plain, full_check=True)
    inl = insert_norcal(once, settings(0.3, inline=True))
    assert not any(n.op_type == "NorCal" for n in inl.graph.node)
    np.testing.assert_allclose(run(strip_norcal(inl), x)[0], run(model, x)[0], atol=1e-7)


def test_rerun_and_strip_keep_runtime_metadata():
    """Resize sizes and other runtime keys of an exported model survive a new gamma and --strip."""
    model = classifier_graph()
    onnx.helper.set_model_props(model, {"norcal.min_size_test": "320", "norcal.max_size_test": "512"})
    once = insert_norcal(model, settings(0.2))
    twice = insert_norcal(once, settings(0.9))
    plain = strip_norcal(twice)
    for m in (once, twice, plain):
        meta = norcal_metadata(m)
        assert meta["norcal.min_size_test"] == "320" and meta["norcal.max_size_test"] == "512"
    assert "norcal.gamma" not in norcal_metadata(plain)


def test_sigmoid_logit_without_renormalisation():
    """A valid variant for sigmoid heads (no renormalisation exists there); settings not mutated."""
    model = classifier_graph(activation="Sigmoid")
    lp = log_prior(COUNTS, 0.7)
    s = settings(0.7, mechanism="logit", renormalize=False)
    out = insert_norcal(model, s)
    assert s.activation is None  # the caller's calibration is left alone
    x = np.random.default_rng(4).normal(size=(4, 8)).astype(np.float32)
    w, b = gemm_weights(model)
    np.testing.assert_allclose(run(out, x)[0], calibrate(x @ w.T + b, lp, "logit", activation="sigmoid"),
                               atol=1e-6)


def test_sigmoid_classifier():
    model = classifier_graph(activation="Sigmoid")
    lp = log_prior(COUNTS, 0.7)
    out = insert_norcal(model, settings(0.7))
    x = np.random.default_rng(3).normal(size=(4, 8)).astype(np.float32)
    w, b = gemm_weights(model)
    np.testing.assert_allclose(run(out, x)[0], calibrate(x @ w.T + b, lp, activation="sigmoid"), atol=1e-6)
    assert norcal_metadata(out)["norcal.activation"] == "sigmoid"


def test_ambiguous_lists_candidates_and_logits_option_resolves():
    model = classifier_graph(heads=2)
    assert len(find_classifiers(model)) == 2
    with pytest.raises(NorcalError, match="ambiguous.*act0.*act1"):
        insert_norcal(model, settings(0.5))
    out = insert_norcal(model, settings(0.5, logits="logits1"))
    assert [n.name for n in out.graph.node if n.op_type == "NorCal"] == ["NorCal"]
    assert norcal_metadata(out)["norcal.logits"] == "logits1"
    with pytest.raises(NorcalError, match="feeds no Softmax"):
        insert_norcal(model, settings(0.5, logits="x"))


def test_class_count_mismatch_is_an_error():
    model = classifier_graph(num_classes=7)
    with pytest.raises(NorcalError, match="5 classes.*6 outputs.*8 classes"):
        insert_norcal(model, settings(0.5))


def test_node_writes_exactly_its_keys_and_calibration_adds_runtime_keys():
    """The node owns contract.NODE_KEYS; table, class count, category ids and class names are
    runtime keys (written with the calibration, which fixes the class order)."""
    model = classifier_graph()
    out = insert_norcal(model, settings(0.5))
    always = contract.NODE_KEYS - contract.OPTIONAL_NODE_KEYS
    assert set(norcal_metadata(out)) == always | {contract.TABLE, contract.NUM_CLASSES, contract.CATEGORY_IDS, contract.CLASS_NAMES}
    cal = calibrate_graph(model, 0.5, _table_file_free())
    assert set(norcal_metadata(cal)) == always | {contract.TABLE, contract.NUM_CLASSES, contract.CATEGORY_IDS, contract.CLASS_NAMES}
    clamped = calibrate_graph(model, 0.5, _table_file_free(), min_count=2)
    # every key but the class axis, which is written only for a class axis other than the last
    assert set(norcal_metadata(clamped)) == contract.NODE_KEYS - {contract.CLASS_AXIS} | {
        contract.TABLE, contract.NUM_CLASSES, contract.CATEGORY_IDS, contract.CLASS_NAMES}
    # the table's names in class order (_table_file_free names class i "c{i}")
    assert contract.metadata_class_names(norcal_metadata(cal)) == ["c0", "c1", "c2", "c3", "c4"]


def test_strip_removes_only_node_keys():
    """Every runtime key of a model survives calibration + strip with its value."""
    model = classifier_graph()
    runtime = {contract.MIN_SIZE_TEST: "320", contract.MAX_SIZE_TEST: "512", contract.INPUT_FORMAT: "BGR",
               contract.SIZE_DIVISIBILITY: "32", contract.NUM_CLASSES: str(len(COUNTS)),
               contract.TABLE: "toy", contract.CATEGORY_IDS: "[1, 2, 3, 4, 5]",
               contract.DETECTOR: '{"depth": 50}', contract.RESIZE: "letterbox", contract.INPUT_SIZE: "320",
               contract.PAD_VALUE: "114", contract.CLASS_NAMES: '["c0", "c1", "c2", "c3", "c4"]',
               contract.CLIP_BOXES: "false", contract.CLASSIFIER_LOGITS: "logits0",
               contract.DROP_EMPTY_MASKS: "true", "user.key": "kept"}
    assert contract.RUNTIME_KEYS <= set(runtime)
    onnx.helper.set_model_props(model, runtime)
    for inline in (False, True):
        cal = calibrate_graph(model, 0.5, _table_file_free(), inline=inline)
        plain = strip_norcal(cal)
        assert {p.key: p.value for p in plain.metadata_props} == runtime
        assert not has_norcal(plain) and not plain.functions
        assert [o.domain for o in plain.opset_import] == [""]


def test_recorded_classifier_is_taken_by_name_before_a_decoy():
    """A model that records its classifier (as checkpoint exports do) needs no search: the decoy
    Softmax head before it, which makes the heuristic ambiguous, is left alone."""
    model = classifier_graph(heads=2)
    onnx.helper.set_model_props(model, {contract.CLASSIFIER_LOGITS: "logits1"})
    assert [c.logits for c in classifier_candidates(model)] == ["logits1"]
    out = insert_norcal(model, settings(0.5))
    assert norcal_metadata(out)[contract.LOGITS] == "logits1"
    assert [n.name for n in out.graph.node if n.op_type == "Softmax"] == ["act0"]
    x = np.random.default_rng(5).normal(size=(3, 8)).astype(np.float32)
    w, b = gemm_weights(model, head=1)
    np.testing.assert_allclose(run(out, x)[1], calibrate(x @ w.T + b, log_prior(COUNTS, 0.5)), atol=1e-6)
    np.testing.assert_allclose(run(out, x)[0], run(model, x)[0], atol=1e-7)
    onnx.helper.set_model_props(model, {contract.CLASSIFIER_LOGITS: "x"})
    with pytest.raises(NorcalError, match="norcal.classifier_logits.*feeds no Softmax"):
        insert_norcal(model, settings(0.5))


def test_graphsurgeon_round_trip_keeps_model_fields(tmp_path):
    """What graphsurgeon does not carry itself survives surgery: metadata, doc string, domain,
    model version, opset imports, the model-local function, and external data left unloaded."""
    model = classifier_graph(num_classes=len(COUNTS), features=64)
    model.doc_string, model.domain, model.model_version = "a detector", "org.example", 7
    onnx.helper.set_model_props(model, {"user.key": "v"})
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=256)
    lazy = onnx.load(str(path), load_external_data=False)
    out = insert_norcal(lazy, settings(0.5))
    assert (out.doc_string, out.domain, out.model_version) == ("a detector", "org.example", 7)
    assert {p.key: p.value for p in out.metadata_props}["user.key"] == "v"
    assert [(o.domain, o.version) for o in out.opset_import] == [("", 17), (DOMAIN, 1)]
    w = next(i for i in out.graph.initializer if i.name == "W0")
    assert w.data_location == onnx.TensorProto.EXTERNAL and not w.raw_data
    assert out.functions[0] == make_function_proto(0.5)
    onnx.save(out, str(tmp_path / "out.onnx"))  # external references stay valid next to w.bin
    x = np.random.default_rng(6).normal(size=(2, 64)).astype(np.float32)
    sess = ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"])
    full = onnx.load(str(path))
    wt, bt = gemm_weights(full)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], calibrate(x @ wt.T + bt, log_prior(COUNTS, 0.5)),
                               atol=1e-5)


def make_function_proto(gamma):
    """The function as onnx.helper writes it: what graphsurgeon must reproduce exactly."""
    from onnx import helper

    from norcal.export.graph.norcal_node import _body

    return helper.make_function(
        DOMAIN, "NorCal", inputs=["logits", "log_prior"], outputs=["probs"],
        nodes=_body(settings(gamma), "logits", "log_prior", "probs", ""),
        opset_imports=[helper.make_opsetid("", 17)],
        doc_string="NorCal calibration (NeurIPS 2021): scores from logits with per-class log prior "
                   "subtracted; see metadata_props norcal.* for the variant.")


def test_model_with_control_flow_and_function():
    """A subgraph (If) beside the NorCal function: insert, replace and strip all work (graphsurgeon
    0.6.1's full toposort recursed without end on such models)."""
    from onnx import TensorProto, helper

    model = classifier_graph()
    branch = [helper.make_graph([helper.make_node("Identity", ["x"], [f"{b}_out"], name=f"{b}_id")], b, [],
                                [helper.make_tensor_value_info(f"{b}_out", TensorProto.FLOAT, None)])
              for b in ("then", "else")]
    model.graph.initializer.append(helper.make_tensor("cond", TensorProto.BOOL, [], [True]))
    model.graph.node.append(helper.make_node("If", ["cond"], ["branch"], name="if0",
                                             then_branch=branch[0], else_branch=branch[1]))
    model.graph.output.append(helper.make_tensor_value_info("branch", TensorProto.FLOAT, ["N", 8]))
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(7).normal(size=(3, 8)).astype(np.float32)
    once = insert_norcal(model, settings(0.2))
    twice = insert_norcal(once, settings(0.6))
    w, b = gemm_weights(model)
    scores, passed = run(twice, x)
    np.testing.assert_allclose(scores, calibrate(x @ w.T + b, log_prior(COUNTS, 0.6)), atol=1e-6)
    np.testing.assert_allclose(passed, x)
    plain = strip_norcal(twice)
    assert not plain.functions
    np.testing.assert_allclose(run(plain, x)[0], run(model, x)[0], atol=1e-7)


def test_recalibrating_a_checkpoint_export_without_a_table():
    """``norcal-export model.norcal.onnx --gamma G`` with no table: the class count that picks
    the built-in table is read through the NorCal node already there (it was looked for on a
    plain Softmax reading the recorded logits, which the node had replaced: refused)."""
    from norcal.core.calibration.tables import load_table
    from norcal.export.graph.calibrate import classifier_classes

    model = classifier_graph(num_classes=1203, features=4)
    onnx.helper.set_model_props(model, {contract.CLASSIFIER_LOGITS: "logits0"})
    first = calibrate_graph(model, 0.6)
    assert classifier_classes(first, "last") == 1203
    again = calibrate_graph(first, 0.3)
    assert norcal_metadata(again)["norcal.gamma"] == "0.3"
    x = np.random.default_rng(7).normal(size=(2, 4)).astype(np.float32)
    w, b = gemm_weights(model)
    z = x.astype(np.float64) @ w.T.astype(np.float64) + b
    n = np.array([c["image_count"] for c in load_table("lvis_v1").categories], dtype=np.float64)
    z = z - np.r_[0.3 * np.log(n), 0.0]  # NorCal by hand: foreground logits minus gamma log N_c
    ref = np.exp(z - z.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(run(again, x)[0], ref, atol=1e-6)


def _named_table(names, counts=(1, 10, 100)):
    from norcal.core.calibration.tables import CalibrationTable

    return CalibrationTable(name="named", source="test", count_type="image", categories=[
        {"id": i + 1, "name": n, "image_count": c, "instance_count": c, "frequency": "r"}
        for i, (n, c) in enumerate(zip(names, counts))])


def test_table_listing_the_models_classes_in_another_order_is_refused():
    """An Ultralytics export records its class names (norcal.detector): a table holding the same
    classes in another order would put each class's prior on another class, silently. Refused,
    naming the first class that differs; the same order (up to case, '_' for ' ') is taken."""
    import json

    model = classifier_graph(num_classes=3)
    onnx.helper.set_model_props(model, {contract.DETECTOR: json.dumps({"names": ["cat", "traffic light", "dog"]})})
    with pytest.raises(NorcalError, match=r"^table 'named': its categories are the model's classes in another "
                                          r"order: class 0 of the model is 'cat' but category 1 \(the 1st by id\) "
                                          r"has 'dog'; each class's prior would go to another class$") as e:
        calibrate_graph(model, 0.5, _named_table(["dog", "traffic light", "cat"]))
    assert e.value.param == "table"
    out = calibrate_graph(model, 0.5, _named_table(["Cat", "traffic_light", "dog"]))
    assert norcal_metadata(out)["norcal.gamma"] == "0.5"


def test_table_of_other_class_names_is_refused_as_infer_refuses_it():
    """A table whose names are not the model's at all (generic class0..) is refused by the same
    rule infer applies to its table: a prior per class of another dataset is no calibration."""
    import json

    model = classifier_graph(num_classes=3)
    onnx.helper.set_model_props(model, {contract.DETECTOR: json.dumps({"names": ["cat", "traffic light", "dog"]})})
    with pytest.raises(NorcalError, match=r"^table 'named': its categories are not the model's classes: class 0 of "
                                          r"the model is 'cat' but category 1 \(the 1st by id\) has 'class0'") as e:
        calibrate_graph(model, 0.5, _named_table(["class0", "class1", "class2"]))
    assert e.value.param == "table"


def test_recalibrating_with_the_recorded_names_in_another_order_is_refused():
    """A model calibrated once records its table's names (norcal.class_names, kept by strip): a
    later table with those classes in another order is refused as an export's names are."""
    model = classifier_graph(num_classes=3)
    once = strip_norcal(calibrate_graph(model, 0.5, _named_table(["cat", "traffic light", "dog"])))
    assert norcal_metadata(once)[contract.CLASS_NAMES] == '["cat", "traffic light", "dog"]'
    with pytest.raises(NorcalError, match=r"class 1 of the model is 'traffic light' but category 2 \(the 2nd by id\) "
                                          r"has 'dog'"):
        calibrate_graph(once, 0.5, _named_table(["cat", "dog", "traffic light"]))
    bad = classifier_graph(num_classes=3)
    onnx.helper.set_model_props(bad, {contract.CLASS_NAMES: "cat, dog"})
    with pytest.raises(NorcalError, match=r"^model metadata norcal.class_names is not a JSON list of class names$"):
        calibrate_graph(bad, 0.5, _named_table(["cat", "traffic light", "dog"]))
