"""Every family's exported graph through NVIDIA's own parser (TensorRT for RTX 1.7.1.116), beside
our table, and ``norcal build --target rtx`` on each: an engine where the graph holds no
data-dependent layer and no plugin, a one-line refusal naming the nodes for the rest.

Our table and NVIDIA's parser must agree outside the listed RTX-only gaps: a graph with none
of them parses whole; one with them stops at a listed gap, and never elsewhere."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import pytest

from norcal.cli import main
from norcal.core.tensorrt_targets import rtx_gaps
from norcal.export.trt_check import check_model

TESTS = Path(__file__).parents[2]
sys.path.insert(0, str(TESTS))
FIXTURES = TESTS / "fixtures"

D2 = ("d2_lvis_tiny", "d2_cascade_tiny", "d2_retinanet_tiny", "d2_vitdet_tiny", "d2_c4_tiny", "d2_mvit_cascade_tiny",
      "d2_regnetx_tiny")


def _d2(name, folder):
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    src = FIXTURES / name
    config = src / "config.yaml"
    out = folder / f"{name}.onnx"
    export_checkpoint(src / "model_final.pth", out, NorCal(gamma=0.5, table="lvis_v1" if name == "d2_lvis_tiny"
                                                          else _manifest_table(src)),
                      CheckpointExport(config=config if config.is_file() else None))
    return out


def _manifest_table(src: Path):
    from golden import manifest_table

    return manifest_table(src)


def _yolo(yaml, folder):
    from norcal.workflows.export_job import NorCal, export_checkpoint

    from yolo_models import make_checkpoint, write_table

    ckpt = make_checkpoint(folder / yaml.replace(".yaml", ".pt"), yaml)
    table, _ = write_table(folder / "table.json")
    out = folder / yaml.replace(".yaml", ".onnx")
    export_checkpoint(ckpt, out, NorCal(gamma=0.5, table=str(table)))
    return out


def _rtdetr(folder):
    from norcal.workflows.export_job import NorCal, export_checkpoint

    from yolo_models import make_rtdetr_checkpoint, write_table

    ckpt = make_rtdetr_checkpoint(folder / "rtdetr.pt")
    table, _ = write_table(folder / "table.json")
    out = folder / "rtdetr.onnx"
    export_checkpoint(ckpt, out, NorCal(gamma=0.5, table=str(table)))
    return out


def _torchvision(kind, folder):
    import torch

    from norcal.workflows.export_job import NorCal, export_checkpoint
    from torchvision_models import table_file, tiny_rcnn, tiny_retinanet

    model = {"faster": lambda: tiny_rcnn(), "mask": lambda: tiny_rcnn(masks=True), "retinanet": tiny_retinanet}[kind]()
    ckpt = folder / f"tv_{kind}.pth"
    torch.save(model.state_dict(), ckpt)
    out = folder / f"tv_{kind}.onnx"
    export_checkpoint(ckpt, out, NorCal(gamma=0.5, table=str(table_file(folder / "tv_table.json"))))
    return out


def _foreign(folder):
    from family_cases import CASES

    from norcal.workflows.export_job import NorCal, export_onnx_file

    ckpt = CASES["foreign"].make(folder)
    out = folder / "foreign.norcal.onnx"
    export_onnx_file(ckpt.path, out, NorCal(gamma=0.5, table=str(ckpt.table), background="first"))
    return out


def _quantized(form, folder):
    from norcal.workflows.quantize import QuantizeOptions, quantize_model

    fp32 = _yolo("yolo11n.yaml", folder)
    out = folder / f"yolo11n.{form}.onnx"
    images = FIXTURES / "d2_lvis_tiny" / "images" if form == "int8" else None
    quantize_model(QuantizeOptions(fp32, out, precision=form, images=images, num_images=2))
    return out


GRAPHS = {
    **{name: (lambda f, n=name: _d2(n, f)) for name in D2},
    "yolo11n": lambda f: _yolo("yolo11n.yaml", f),
    "yolo11n-seg": lambda f: _yolo("yolo11n-seg.yaml", f),
    "rtdetr": _rtdetr,
    "tv_faster": lambda f: _torchvision("faster", f),
    "tv_mask": lambda f: _torchvision("mask", f),
    "tv_retinanet": lambda f: _torchvision("retinanet", f),
    "foreign": _foreign,
    "yolo11n_fp16": lambda f: _quantized("fp16", f),
    "yolo11n_int8": lambda f: _quantized("int8", f),
}


@pytest.fixture(scope="module", params=sorted(GRAPHS))
def graph(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, GRAPHS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.mark.slow
def test_nvidias_parser_agrees_with_our_table_outside_the_listed_gaps(graph, capsys):
    name, path = graph
    model = onnx.load(path)
    report = check_model(model, nvidia=True)
    verdict = report.nvidia
    assert verdict is not None and verdict.library == "TensorRT for RTX 1.7.1.116"
    assert verdict.unexplained() == [], [(r.node, r.op_type, r.reason) for r in verdict.refusals]
    gaps = rtx_gaps(model)
    if not verdict.parsed:  # it stops at a listed gap, and only there
        assert verdict.refusals[0].op_type in gaps, name
    # no listed gap: NVIDIA's parser takes the whole graph (NonMaxSuppression alone parses too:
    # RTX's builder, not its parser, has no layer for it)
    assert verdict.parsed == (not set(gaps) - {"NonMaxSuppression"}), (name, sorted(gaps))
    assert verdict.no_importer == []


@pytest.mark.slow
def test_build_for_rtx_writes_an_engine_or_names_the_nodes(graph, tmp_path, capsys):
    name, path = graph
    gaps = rtx_gaps(onnx.load(path, load_external_data=False))
    engine = tmp_path / "m.engine"
    int8 = ["--int8"] if name.endswith("_int8") else []
    rc = main(["build", str(path), "--target", "rtx", "--batch", "1:1:2", "-o", str(engine), *int8])
    out, err = capsys.readouterr()
    if name == "foreign":  # torchvision's own inputs: norcal build takes the detector contract
        assert rc == 2 and "norcal build expects the detector contract" in err
    elif gaps:
        assert rc == 2 and err.count("\n") == 1 and "cannot be built for TensorRT for RTX" in err, err
        assert all(f"{op} (" in err for op in gaps)
        assert not engine.exists()
    else:
        assert rc == 0, err[-2000:]
        side = json.loads(engine.with_name("m.engine.json").read_text())
        assert side["library"] == "TensorRT for RTX" and engine.stat().st_size > 0
        print(f"{name}: built {engine.stat().st_size} bytes")
