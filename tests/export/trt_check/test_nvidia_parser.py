"""NVIDIA's own parser (TensorRT for RTX 1.7.1.116, installed by the README's line) beside our
table, and the plugin imports norcal check names. These run NVIDIA's library, not a stand-in."""

from __future__ import annotations

import sys

import onnx
from onnx import TensorProto as T
from onnx import helper as h

from norcal.cli import main
from norcal.core import tensorrt_targets
from norcal.export.trt_check import check_model
from norcal.export.trt_check.nvidia_parser import installed_parser, parse_model

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[2] / "runtime"))
from test_tensorrt import tiny_detector  # noqa: E402


def roi_align_model(extra_nodes=()) -> onnx.ModelProto:
    """One RoiAlign (named 'roi') on static inputs, as an R-CNN's box pooler holds it."""
    nodes = [h.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], name="roi", output_height=7, output_width=7,
                         sampling_ratio=2, spatial_scale=0.25, coordinate_transformation_mode="half_pixel"),
             *extra_nodes]
    outputs = [h.make_tensor_value_info("y", T.FLOAT, [5, 8, 7, 7])]
    if extra_nodes:
        outputs.append(h.make_tensor_value_info("nz", T.INT64, [1, None]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 32, 32]),
                                  h.make_tensor_value_info("rois", T.FLOAT, [5, 4]),
                                  h.make_tensor_value_info("bi", T.INT64, [5])], outputs)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_the_parser_is_nvidias_and_installed():
    trt = installed_parser()
    assert trt is not None and trt.__name__ == "tensorrt_rtx_bindings" and trt.__version__ == "1.7.1.116"


def test_a_graph_rtx_parses_whole():
    verdict = parse_model(tiny_detector(), installed_parser())
    assert verdict.parsed and verdict.refusals == [] and verdict.no_importer == []
    assert verdict.summary() == "TensorRT for RTX 1.7.1.116 parser: parsed the whole graph"


def test_roi_align_is_refused_by_rtx_in_its_own_words_and_is_a_listed_gap():
    verdict = parse_model(roi_align_model(), installed_parser())
    assert not verdict.parsed and len(verdict.refusals) == 1
    r = verdict.refusals[0]
    assert (r.node, r.op_type, r.rtx_gap) == ("roi", "RoiAlign", True)
    assert "ROIAlign plugin was not found in the plugin registry" in r.reason  # NVIDIA's message
    assert verdict.unexplained() == []


def test_check_names_the_plugin_and_prints_nvidias_verdict(tmp_path, capsys):
    path = tmp_path / "roi.onnx"
    onnx.save(roi_align_model(), path)
    assert main(["check", str(path)]) == 0  # our table: TensorRT 10/11 import it as a plugin
    out = capsys.readouterr().out
    assert "ROIAlign_TRT" in out and "libnvinfer_plugin" in out and "TensorRT 8.5" in out
    assert "initLibNvInferPlugins" in out
    verdict = [line for line in out.splitlines() if "parser: " in line]
    assert verdict == [line for line in verdict if line.startswith("TensorRT for RTX 1.7.1.116 parser: stops at roi "
                                                                   "(RoiAlign")] and len(verdict) == 1
    assert ("(an RTX-only gap: TensorRT for RTX registers ROIAlign_TRT but cannot create it" in out
            and "TensorRT 10/11 build it)" in out)
    assert check_model(path).plugins == [{"plugin": "ROIAlign_TRT", "library": "libnvinfer_plugin", "since": "8.5",
                                          "op_type": "RoiAlign", "nodes": ["roi"]}]


def test_a_refusal_no_listed_gap_explains_is_an_error(tmp_path, monkeypatch, capsys):
    """With RoiAlign taken off the RTX-only list, NVIDIA's refusal of it is an error of the check."""
    path = tmp_path / "roi.onnx"
    onnx.save(roi_align_model(), path)
    monkeypatch.setitem(tensorrt_targets.RTX_GAPS, "RoiAlign", None)
    monkeypatch.delitem(tensorrt_targets.RTX_GAPS, "RoiAlign")
    report = check_model(path)
    assert [(f.severity, f.node, f.op_type) for f in report.errors] == [("error", "roi", "RoiAlign")]
    assert "no RTX-only gap explains that" in report.errors[0].reason
    assert main(["check", str(path)]) == 1
    assert "NOT compatible" in capsys.readouterr().out


def test_every_listed_gap_is_refused_by_rtx_and_built_by_our_table():
    """The RTX-only list holds only what NVIDIA's library really refuses: each op, alone in a graph,
    passes our TensorRT 10 table (it builds there) and fails RTX's parse or build."""
    trt = installed_parser()
    nz = h.make_node("NonZero", ["x"], ["nz0"], name="nz")
    nms_inputs = [h.make_tensor_value_info("boxes", T.FLOAT, [1, 10, 4]),
                  h.make_tensor_value_info("scores", T.FLOAT, [1, 1, 10])]
    graphs = {
        "RoiAlign": roi_align_model(),
        "NonZero": h.make_model(h.make_graph([nz], "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 4])],
                                             [h.make_tensor_value_info("nz0", T.INT64, [2, None])]),
                                opset_imports=[h.make_opsetid("", 17)]),
        "NonMaxSuppression": h.make_model(h.make_graph(
            [h.make_node("NonMaxSuppression", ["boxes", "scores", "k"], ["sel"], name="nms")], "g", nms_inputs,
            [h.make_tensor_value_info("sel", T.INT64, [None, 3])], [h.make_tensor("k", T.INT64, [1], [5])]),
            opset_imports=[h.make_opsetid("", 17)]),
    }
    assert set(graphs) == set(tensorrt_targets.RTX_GAPS)
    for op, model in graphs.items():
        model.ir_version = 9
        assert check_model(model, nvidia=False).compatible, op
        verdict = parse_model(model, trt)
        if verdict.parsed:  # parsed: the builder is where it stops (no runner for the layer)
            log = trt.Logger(trt.Logger.ERROR)
            builder = trt.Builder(log)
            network = builder.create_network(0)
            parser = trt.OnnxParser(network, log)
            assert parser.parse(model.SerializeToString())
            assert builder.build_serialized_network(network, builder.create_builder_config()) is None, op
        else:
            assert [r.op_type for r in verdict.refusals] == [op]


def test_a_rank_1_softmax_our_table_passes_is_an_error_by_nvidias_parser():
    """Found by running NVIDIA's parser: it refuses Softmax over a rank-1 tensor ('at least 2
    dimensions are required for input'); our table had passed it, so the check now fails it."""
    def softmax(shape):
        g = h.make_graph([h.make_node("Softmax", ["x"], ["y"], name="sm")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, shape)],
                         [h.make_tensor_value_info("y", T.FLOAT, shape)])
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

    assert check_model(softmax([4]), nvidia=False).compatible  # our table alone
    report = check_model(softmax([4]))
    assert [(f.node, f.op_type) for f in report.errors] == [("sm", "Softmax")]
    assert "at least 2 dimensions are required" in report.errors[0].reason
    assert check_model(softmax([2, 4])).compatible and report.nvidia.refusals[0].rtx_gap is False
