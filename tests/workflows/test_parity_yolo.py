"""norcal parity with an Ultralytics checkpoint: the family's PyTorch runner (the reference)
against ONNX Runtime on the checkpoint's NorCal export passes the fp32 preset, segment masks
included."""

from __future__ import annotations

import json

import pytest

from yolo_models import IMAGES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR


@pytest.mark.slow
def test_parity_yolo_checkpoint_against_its_export_passes_fp32(yolo_work, tmp_path):
    from norcal.cli import export_main, main
    from norcal.core import contract
    from norcal.export.families import checkpoint_runner
    from norcal.workflows.parity import ParityRequest, build_runners

    best, onnx_path = tmp_path / "best.pt", tmp_path / "best.norcal.onnx"
    # the segment model: its mask coefficients and prototypes are judged at fp32 as well
    best.write_bytes(yolo_work.seg.read_bytes())
    assert export_main([str(best), "--gamma", "0.5", "--table", str(yolo_work.table), "-o", str(onnx_path)]) == 0
    runners = build_runners(ParityRequest(onnx_path, checkpoint=best, batch_size=2))
    assert [r.name for r in runners.runners] == ["pytorch", "onnxruntime-cpu"]
    assert runners.spec.resize == "letterbox" and runners.calibration is not None  # the ONNX's NorCal, given to PyTorch
    assert runners.reference.output_names == runners.onnx.output_names
    # the library's own loader goes through the family as well: the letterbox model's runner
    runner = checkpoint_runner(best)
    assert runner.metadata[contract.RESIZE] == "letterbox" and "masks" in runner.output_names
    report = tmp_path / "parity.json"
    assert main(["parity", str(onnx_path), *map(str, IMAGES), "--checkpoint", str(best), "--batch", "2",
                 "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    text = json.dumps(data)
    assert '"fp32"' in text and '"passed": true' in text and '"passed": false' not in text
    (comparison,) = data["comparisons"]
    assert comparison["tolerances"]["precision"] == "fp32"
    masks = {d["name"]: d for d in comparison["outputs"]}["masks"]
    assert masks["gating"] and masks["passed"] and masks["atol"] == 1e-3 and masks["count"] > 0
    assert masks["max_abs"] <= 1e-3
