"""Resize rules as one table: each rule the contract names has its host resize, what a rule
implies (square, padding, empty boxes kept, mask paste) is read from the table, and no module
branches on a rule's name."""

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from norcal.core import contract
from norcal.core.contract import Preprocessing
from norcal.core.resize_rules import RESIZE_RULE_TABLE, RESIZE_RULES, resize_rule
from norcal.core.errors import NorcalError
from norcal.runtime import preprocess
from norcal.runtime.preprocess import prepare_batch, resize_problem

ROOT = Path(__file__).parents[2]
RULE_NAMES = set(RESIZE_RULES)


def test_every_rule_has_its_host_resize_and_every_paste_its_paste():
    from norcal.runtime import postprocess

    assert set(preprocess._BATCH_OF) == RULE_NAMES and set(preprocess._SIZE_OF) == RULE_NAMES
    assert set(postprocess._REGIONS_OF) == set(contract.MASK_PASTES)
    assert RESIZE_RULES[0] == "shortest_edge"  # absent norcal.resize means detectron2's rule


def test_rule_facts_are_the_upstream_ones():
    # detectron2 and torchvision drop boxes clipped to nothing; Ultralytics keeps them
    assert {r.name for r in RESIZE_RULE_TABLE.values() if r.keeps_empty_boxes} == {"letterbox", "stretch"}
    assert {r.name for r in RESIZE_RULE_TABLE.values() if r.square} == {"letterbox", "stretch"}
    assert {r.name for r in RESIZE_RULE_TABLE.values() if r.pads} == {"letterbox"}
    assert {n: r.mask_paste for n, r in RESIZE_RULE_TABLE.items()} == {
        "shortest_edge": "detectron2", "letterbox": "detectron2", "stretch": "detectron2", "torchvision": "torchvision"}
    with pytest.raises(NorcalError, match="norcal.resize='crop' is not one of shortest_edge, letterbox"):
        resize_rule("crop")


@pytest.mark.parametrize("rule", RESIZE_RULES)
def test_batch_metadata_and_spec_agree_on_the_rule(rule):
    """One answer per fact: the batch, the spec and the metadata's default mask paste."""
    spec = (contract.square_preprocessing(rule, 64) if RESIZE_RULE_TABLE[rule].square
            else Preprocessing(48, 64, resize=rule))
    batch = prepare_batch([np.full((30, 50, 3), 7, np.uint8)], spec)
    assert (batch.keep_empty_boxes, batch.mask_paste) == (RESIZE_RULE_TABLE[rule].keeps_empty_boxes,
                                                          contract.mask_paste(spec.metadata()))
    assert contract.input_spec(spec.metadata()) == spec


def test_a_letterbox_model_takes_a_strip_as_ultralytics_does():
    """A 4000x1 strip: ResizeShortestEdge at 640 would round its short side to 0 and refuse it;
    Ultralytics' LetterBox makes it a 640x1 image in the square (each side at least 1 pixel)."""
    from ultralytics.data.augment import LetterBox

    out = LetterBox((640, 640), auto=False, center=True)(image=np.zeros((1, 4000, 3), np.uint8))
    assert out.shape == (640, 640, 3)
    assert resize_problem(1, 4000, 640, 640, "letterbox") is None
    assert resize_problem(1, 4000, 640, 640, "shortest_edge") is not None
    batch = prepare_batch([np.zeros((1, 4000, 3), np.uint8)], contract.letterbox_preprocessing(640))
    assert batch.image_sizes.tolist() == [[1, 640]]


_RULE_LITERALS = {f'"{name}"' for name in (*RESIZE_RULES, *contract.MASK_PASTES)} | {"RESIZE_STRETCH", "RESIZE_TORCHVISION"}


def _rule_comparisons(path: Path) -> list[str]:
    """Comparisons (==, !=, in) of a resize or paste rule with a rule's name (alone or in a
    tuple): an if-chain on the rule. (The mask memo's proto-mask reading, runtime/results.py,
    is not a rule's paste: it stays a branch on ``mask_paste``.)"""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            values = [e for p in parts for e in (p.elts if isinstance(p, (ast.Tuple, ast.List, ast.Set)) else [p])]
            names = [ast.unparse(v).replace("'", '"') for v in values]
            if any(n in _RULE_LITERALS for n in names) and \
                    any(re.search(r"resize|rule", ast.unparse(p)) for p in parts):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_branches_on_a_rule_name():
    sources = [p for d in ("norcal", "export", "runtime") for p in (ROOT / d).rglob("*.py")]
    found = [line for p in sources for line in _rule_comparisons(p)]
    assert not found, "branch on the resize rule's name instead of its ResizeRule facts:\n" + "\n".join(found)


def test_the_branch_check_sees_an_if_chain(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    bad = tmp_path / "bad.py"
    bad.write_text('def f(spec, rule):\n    a = 1 if spec.resize == "torchvision" else 2\n'
                   '    return a, rule in ("letterbox", RESIZE_STRETCH), rule != "ultralytics"\n')
    assert len(_rule_comparisons(bad)) == 3
