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
        "norcal.input_size", "norcal.pad_value", "norcal.class_names"}
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
    assert back == spec and back.letterbox and (back.pad_value, back.input_format) == (114, "RGB")
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
