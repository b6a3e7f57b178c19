"""The Python API: ``import norcal`` is cheap, every public name resolves, and the README's
example runs on the bundled example."""

import copy
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import norcal
from norcal.export.graph.surgery import norcal_metadata

from conftest import SYNTH, TINY
from onnx_graphs import classifier_graph

pytestmark = pytest.mark.slow  # exports, runs and evaluates the bundled example

README = Path(__file__).parents[2] / "README.md"


def test_import_is_cheap_and_names_resolve_lazily():
    code = ("import sys, norcal; heavy = [m for m in ('torch', 'onnx', 'onnxruntime', 'numpy', 'rich') "
            "if m in sys.modules]; assert not heavy, heavy; "
            "norcal.export_checkpoint; norcal.tune; assert 'torch' not in sys.modules; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_every_public_name_resolves_to_its_module():
    from norcal.workflows import export_job, tune

    for name in norcal.__all__:
        assert getattr(norcal, name) is not None, name
    assert norcal.export_checkpoint is export_job.export_checkpoint
    assert norcal.NorCal is export_job.NorCal and norcal.tune is tune.tune
    assert set(norcal.__all__) <= set(dir(norcal))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        norcal.nope


def test_calibrate_onnx_and_export_onnx_file_without_argparse(tmp_path):
    from norcal.core.calibration.tables import CalibrationTable

    table = CalibrationTable("toy", "test", "image", [
        {"id": i + 1, "name": f"c{i}", "image_count": n, "instance_count": n} for i, n in enumerate([1, 5, 50, 500])])
    model = norcal.calibrate_onnx(classifier_graph(num_classes=4), norcal.NorCal(gamma=0.5, table=table))
    meta = norcal_metadata(model)
    assert meta["norcal.gamma"] == "0.5" and meta["norcal.table"] == "toy"
    src = tmp_path / "det.onnx"
    onnx.save(classifier_graph(num_classes=4), str(src))
    result = norcal.export_onnx_file(src, tmp_path / "out.onnx", norcal.NorCal(gamma=1.0, table=table, inline=True))
    assert result.output.is_file() and result.description == ()
    assert "Sub" in result.tensorrt.op_types  # checked as written: the inlined NorCal ops
    assert result.norcal["norcal.gamma"] == "1.0" and result.norcal["norcal.inline"] == "true"
    assert norcal_metadata(onnx.load(str(result.output))) == result.norcal
    stripped = norcal.export_onnx_file(result.output, tmp_path / "plain.onnx", strip=True)
    assert stripped.norcal == {}
    with pytest.raises(norcal.NorcalError, match="strip=True") as e:
        norcal.export_onnx_file(src, tmp_path / "x.onnx")
    assert e.value.param == "strip=True"


def test_checkpoint_export_refuses_logits_naming_the_parameter(tmp_path):
    with pytest.raises(norcal.NorcalError, match="^logits applies to ONNX input") as e:
        norcal.export_checkpoint(TINY / "model_final.pth", tmp_path / "o.onnx", norcal.NorCal(gamma=0.5, logits="x"))
    assert e.value.param == "logits" and not (tmp_path / "o.onnx").exists()


@pytest.mark.slow
def test_export_checkpoint_returns_data_and_reports_its_steps(tmp_path, capsys):
    steps = []
    result = norcal.export_checkpoint(TINY / "model_final.pth", tmp_path / "tiny.norcal.onnx", norcal.NorCal(gamma=0.5),
                                      norcal.CheckpointExport(config=TINY / "config.yaml", batch=1),
                                      triton_repo=tmp_path / "triton", progress=steps.append)
    assert steps == ["loading checkpoint", "exporting to ONNX", "inserting the NorCal node", "checking and writing"]
    # the fixture's config: LVIS classes, short edge 320, long edge 512, a mask head
    rows = dict(result.description)
    assert rows["architecture"].endswith("1203 classes, mask head"), rows
    assert rows["test settings"].startswith("short edge 320, max 512,"), rows
    assert result.tensorrt.compatible and result.verification is None
    assert result.triton_dir == tmp_path / "triton" / "tiny" and (result.triton_dir / "config.pbtxt").is_file()
    written = onnx.load(str(result.output))
    assert written.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1  # batch=1 fixed
    assert norcal_metadata(written) == result.norcal and result.norcal["norcal.gamma"] == "0.5"
    assert capsys.readouterr().out == ""  # the library prints nothing


def _readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_readme_example_runs_on_the_bundled_example(tmp_path, monkeypatch, capsys):
    for name in ("model_final.pth", "config.yaml", "train_annotations.json", "val.json", "val"):
        (tmp_path / name).symlink_to(SYNTH / name)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_readme_example(), str(README), "exec"), scope)
    out = capsys.readouterr().out
    assert "gamma 0.5 TensorRT-compatible: True" in out
    meta = norcal_metadata(onnx.load(str(tmp_path / "model.norcal.onnx")))
    assert meta["norcal.gamma"] == "0.5" and meta["norcal.num_classes"] == "60"
    metrics = scope["metrics"]
    assert len(scope["results"]) > 0 and 0 < metrics.stats["AP"] <= 1
    assert f"AP {100 * metrics.stats['AP']:.1f}  APr {100 * metrics.stats['APr']:.1f}" in out
    # the numbers of the official lvis-api on the same results
    import numpy as np

    monkeypatch.setattr(np, "float", float, raising=False)  # lvis 0.5.3 still uses np.float
    from lvis import LVIS, LVISEval, LVISResults

    gt = LVIS(str(SYNTH / "val.json"))
    ref = LVISEval(gt, LVISResults(gt, copy.deepcopy(scope["results"])), "bbox")
    ref.run()
    for key in ("AP", "AP50", "APr", "APc", "APf"):
        assert metrics.stats[key] == pytest.approx(ref.results[key], abs=1e-4), key
