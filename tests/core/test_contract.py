"""The ONNX contract: one owner for every metadata key, node keys and runtime keys kept apart."""

import pytest

from norcal.core import contract
from norcal.core.errors import NorcalError


def _keys():
    return {name: v for name, v in vars(contract).items()
            if name.isupper() and isinstance(v, str) and v.startswith(contract.PREFIX) and v != contract.PREFIX}


def test_every_key_is_defined_once_and_grouped():
    keys = _keys()
    values = [v for name, v in keys.items() if name != "PRIOR_NAME"]
    assert len(values) == len(set(values))  # no two constants share a key
    grouped = contract.NODE_KEYS | contract.RUNTIME_KEYS | contract.GRAPH_KEYS | contract.PRECISION_KEYS
    assert set(values) == grouped  # every key belongs to exactly one group
    assert not contract.NODE_KEYS & contract.RUNTIME_KEYS
    assert not contract.GRAPH_KEYS & (contract.NODE_KEYS | contract.RUNTIME_KEYS)
    assert not contract.PRECISION_KEYS & (contract.NODE_KEYS | contract.RUNTIME_KEYS | contract.GRAPH_KEYS)


def test_runtime_keys_are_the_runners_contract():
    assert contract.RUNTIME_KEYS == {
        "norcal.min_size_test", "norcal.max_size_test", "norcal.input_format", "norcal.size_divisibility",
        "norcal.num_classes", "norcal.table", "norcal.category_ids", "norcal.detector", "norcal.resize",
        "norcal.input_size", "norcal.pad_value", "norcal.class_names", "norcal.clip_boxes", "norcal.drop_empty_masks"}
    assert {contract.TABLE, contract.NUM_CLASSES} <= contract.RUNTIME_KEYS  # stripping keeps them
    assert contract.GAMMA in contract.NODE_KEYS and contract.TABLE_SHA256 in contract.NODE_KEYS


def test_input_spec_reads_runtime_keys_with_defaults():
    spec = contract.input_spec({contract.MIN_SIZE_TEST: "640", contract.INPUT_FORMAT: "rgb"})
    assert (spec.min_size, spec.max_size, spec.input_format, spec.divisibility) == (640, 1333, "RGB", 32)
    assert contract.metadata_category_ids({contract.CATEGORY_IDS: "[3, 1]"}) == [3, 1]
    with pytest.raises(NorcalError, match="norcal.size_divisibility"):
        contract.input_spec({contract.SIZE_DIVISIBILITY: "0"})


def test_letterbox_preprocessing_round_trips_through_metadata():
    spec = contract.letterbox_preprocessing(160)
    meta = spec.metadata()
    assert meta[contract.RESIZE] == "letterbox" and meta[contract.INPUT_SIZE] == "160"
    back = contract.input_spec(meta)
    assert back == spec and back.resize == "letterbox" and (back.pad_value, back.input_format) == (114, "RGB")
    # the size checks see ResizeShortestEdge at S/S: the same scale as a letterbox to S
    assert (back.min_size, back.max_size, back.divisibility) == (160, 160, 160)
    # no key: today's rule, byte for byte
    assert contract.input_spec({}).resize == "shortest_edge" and contract.input_spec({}).pad_value == 0


def test_letterbox_metadata_is_checked():
    with pytest.raises(NorcalError, match="norcal.resize=stretch needs norcal.input_size"):
        contract.input_spec({contract.RESIZE: "stretch"})
    with pytest.raises(NorcalError, match="needs norcal.input_size"):
        contract.input_spec({contract.RESIZE: "letterbox"})
    with pytest.raises(NorcalError, match="norcal.pad_value='300'"):
        contract.input_spec({contract.RESIZE: "letterbox", contract.INPUT_SIZE: "64", contract.PAD_VALUE: "300"})
    with pytest.raises(NorcalError, match="cannot change a letterbox model"):
        contract.input_spec(contract.letterbox_preprocessing(64).metadata(), min_size=32)


def test_fixed_square_shortest_edge_refuses_a_resize_beyond_its_square():
    """A ViTDet graph's input is fixed at its square_pad: a max_size override above it would make
    a batch the graph cannot take (ONNX Runtime's shape error, a traceback before this check)."""
    meta = {contract.MIN_SIZE_TEST: "320", contract.MAX_SIZE_TEST: "320", contract.SIZE_DIVISIBILITY: "320",
            contract.INPUT_SIZE: "320"}
    spec = contract.input_spec(meta)
    assert (spec.resize, spec.input_size, spec.square) == ("shortest_edge", 320, False)
    assert contract.input_spec(spec.metadata()) == spec
    assert contract.input_spec(meta, min_size=200, max_size=320).max_size == 320  # fits: allowed
    with pytest.raises(NorcalError, match=r"^max_size 400 exceeds the model's fixed 320x320 input "
                                          r"\(norcal.input_size=320\)"):
        contract.input_spec(meta, min_size=400, max_size=400)
    # without the key (every other R-CNN) an override is taken as it is
    del meta[contract.INPUT_SIZE]
    assert contract.input_spec(meta, max_size=400).max_size == 400


def test_class_names_round_trip_and_placeholders_are_not_recorded():
    meta = contract.class_names_metadata(["person", "traffic light"])
    assert meta == {"norcal.class_names": '["person", "traffic light"]'}
    assert contract.metadata_class_names({**meta, contract.NUM_CLASSES: "2"}) == ["person", "traffic light"]
    # Ultralytics' placeholders for a model built from yaml name no category; unknown names neither
    assert contract.class_names_metadata(["0", "1", "2"]) == {} and contract.class_names_metadata(None) == {}
    assert contract.metadata_class_names({}) is None


@pytest.mark.parametrize("raw, problem", [
    ("not json", "is not a JSON list of class names"), ('{"0": "a"}', "is not a JSON list of class names"),
    ("[]", "is not a JSON list of class names"), ('["a", 3]', "is not a JSON list of class names"),
    ('["a", "b"]', "lists 2 names but norcal.num_classes is 3"),
])
def test_malformed_class_names_are_one_line_naming_the_key(raw, problem):
    with pytest.raises(NorcalError) as e:
        contract.metadata_class_names({contract.CLASS_NAMES: raw, contract.NUM_CLASSES: "3"})
    assert str(e.value) == f"model metadata norcal.class_names {problem}"


def test_check_class_names_refuses_another_order_or_other_names():
    model = ["cat", "traffic_light", "dog"]
    # the same names as the calibration-table check compares them (case, '_' and spaces ignored)
    contract.check_class_names(model, ["Cat", "traffic  light", "dog"], [1, 2, 3], "ann.json")
    contract.check_class_names(None, ["dog", "cat", "x"], [1, 2, 3], "ann.json")  # names unknown: not judged
    with pytest.raises(NorcalError) as e:
        contract.check_class_names(model, ["cat", "dog", "traffic light"], [4, 7, 9], "ann.json")
    assert str(e.value) == ("ann.json: its categories are the model's classes in another order: class 1 of "
                            "the model is 'traffic_light' but category 7 (the 2nd by id) has 'dog'; its "
                            "detections would be written under another category")
    with pytest.raises(NorcalError, match=r"^ann.json: its categories are not the model's classes: class 2 "
                                          r"of the model is 'dog' but category 9 \(the 3rd by id\) has 'zebra';"):
        contract.check_class_names(model, ["cat", "traffic light", "zebra"], [4, 7, 9], "ann.json")
    with pytest.raises(NorcalError, match="class 0 of the model is 'cat' but category 4 .* has no name"):
        contract.check_class_names(model, [None, "traffic light", "dog"], [4, 7, 9], "ann.json")
