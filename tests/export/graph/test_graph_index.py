"""GraphIndex: one pass over a graph's nodes for who writes and who reads each tensor; the
graph tools build it there and nowhere by hand."""

import re
from pathlib import Path

from onnx import TensorProto, helper

from norcal.export.graph.onnx_helpers import GraphIndex

ROOT = Path(__file__).parents[3]


def _graph():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"),
             helper.make_node("Add", ["a", "a"], ["b"], name="add"),  # reads a twice
             helper.make_node("Split", ["b"], ["c", "d"], name="split", axis=0, num_outputs=2),
             helper.make_node("Mul", ["c", "x"], ["y"], name="mul")]
    vi = helper.make_tensor_value_info
    return helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [2])],
                             [vi("y", TensorProto.FLOAT, [1]), vi("d", TensorProto.FLOAT, [1])])


def test_producers_positions_and_readers_by_hand():
    index = GraphIndex.of(_graph())
    assert {t: n.name for t, n in index.producer.items()} == {"a": "r", "b": "add", "c": "split", "d": "split",
                                                              "y": "mul"}
    assert index.position == {"a": 0, "b": 1, "c": 2, "d": 2, "y": 3}
    assert [n.name for n in index.readers("a")] == ["add", "add"]
    assert [n.name for n in index.readers("x")] == ["r", "mul"]  # graph order
    assert index.readers("y") == [] and "x" not in index.producer  # a graph input has no producer


def test_no_module_builds_the_maps_by_hand():
    hand = re.compile(r"\{\s*\w+\s*:\s*\w+\s+for\s+(?:\w+,\s*)?\w+\s+in\s+(?:enumerate\()?[\w.]+\.node\)?\s+for\s+\w+\s+in\s+\w+\.output\s*\}"
                      r"|setdefault\(\w+, \[\]\)\.append\(n\)")
    found = [f"{p.relative_to(ROOT)}" for d in ("norcal", "export", "runtime") for p in (ROOT / d).rglob("*.py")
             if hand.search(p.read_text())]
    assert found == []
    assert hand.search("producer = {o: n for n in g.node for o in n.output}")
    assert hand.search("producer = {o: i for i, n in enumerate(g.node) for o in n.output}")
