"""One way from torch to ONNX (trace_onnx) and one opset floor, for every family's graph."""

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from norcal.core.errors import NorcalError
from norcal.export.pytorch.onnx_trace import MIN_OPSET, max_opset, require_opset, trace_onnx

ROOT = Path(__file__).parents[3]
PRODUCT = [p for d in ("norcal", "export", "runtime") for p in (ROOT / d).rglob("*.py")]


class _Two(torch.nn.Module):
    def forward(self, x):
        hidden = x * 2.0
        return hidden + 1.0, hidden


def test_an_internal_output_is_named_then_an_ordinary_tensor():
    model = trace_onnx(_Two(), (torch.ones(2, 3),), ["x"], ["y", "hidden"], MIN_OPSET,
                       {"x": {0: "batch"}, "y": {0: "batch"}}, internal=["hidden"])
    assert [o.name for o in model.graph.output] == ["y"]
    assert any("hidden" in n.output for n in model.graph.node)  # the tensor keeps its name
    assert model.producer_name == "norcal-deploy"
    assert {o.domain: o.version for o in model.opset_import}[""] == MIN_OPSET
    onnx.checker.check_model(model, full_check=True)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)  # another batch: the batch axis is dynamic
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, x * 2 + 1)


def test_the_opset_floor_and_ceiling():
    # RoiAlign's half_pixel mode is opset 16; Softmax on the last axis alone is 13; our exports are 17
    assert MIN_OPSET == 17 and max_opset() >= MIN_OPSET
    require_opset(MIN_OPSET)
    with pytest.raises(NorcalError, match="opset 16 is too old: the export needs opset >= 17") as e:
        require_opset(16)
    assert e.value.param == "opset"


def test_every_torch_export_goes_through_trace_onnx_and_the_floor_is_defined_once():
    exports = [p.relative_to(ROOT).as_posix() for p in PRODUCT if "torch.onnx.export(" in p.read_text()]
    assert exports == ["export/pytorch/onnx_trace.py"]
    floors = [p.relative_to(ROOT).as_posix() for p in PRODUCT if re.search(r"^MIN_OPSET\s*=", p.read_text(), re.M)]
    assert floors == ["export/pytorch/onnx_trace.py"]


def test_export_help_states_the_floor(capsys):
    from norcal.cli import main

    assert main(["export", "--help"]) == 0
    assert f"ONNX opset (default {MIN_OPSET})" in " ".join(capsys.readouterr().out.split())
