"""bench/widen_detectron2_graph.py: detectron2's own traced graph of d2_lvis_tiny carried to other
weights of the same topology (the bench's full-width detectron2 reference).

At the fixture's own width it must give back detectron2's export (the sources of its weights
are the fixture store's recipe list, packed from the real export); at another width the graph
must run and give the detections of our export of the same weights."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import golden as G

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "bench"))
import widen_detectron2_graph as widen_mod  # noqa: E402

D2_ONNX = G.FIXTURE / "detectron2_export_800x1216.onnx"
RECIPES = G.FIXTURE / "packed" / "onnx" / "recipes.json"


@pytest.fixture(scope="module")
def d2_graph() -> onnx.ModelProto:
    return onnx.load(D2_ONNX)


def test_same_width_gives_back_detectron2s_graph(d2_graph):
    state = G.tiny_state_dict()
    recipes = json.loads(RECIPES.read_text())
    sources = widen_mod.initializer_sources(d2_graph, state)
    want = {name: ("checkpoint", key) if src == "checkpoint" else ("fold", f"{key}.{part}")
            for name, (src, key, part) in recipes.items()}
    assert sources == want
    out = widen_mod.widen(d2_graph, state)
    theirs = {t.name: numpy_helper.to_array(t) for t in d2_graph.graph.initializer}
    for t in out.graph.initializer:
        # torch's fold (the exporter's) rounds some elements an ulp away from numpy's
        np.testing.assert_allclose(numpy_helper.to_array(t), theirs[t.name], rtol=1e-6, atol=1e-7)
    # apart from the weights' last bits, the very graph detectron2 wrote (pooler widths: 64)
    same = onnx.ModelProto()
    same.CopyFrom(d2_graph)
    for a, b in zip(same.graph.initializer, out.graph.initializer):
        a.CopyFrom(b)
    assert same.SerializeToString() == out.SerializeToString()
    assert [int(numpy_helper.to_array(c.attribute[0].t)[0])
            for c in widen_mod._pooler_channel_constants(out)] == [64, 64]


def test_module_of_reads_the_traced_scope():
    assert widen_mod.module_of("/backbone/bottom_up/res2/res2.0/conv1/Conv") == \
        "backbone.bottom_up.res2.0.conv1"
    assert widen_mod.module_of("/backbone/bottom_up/stem/conv1/Conv") == "backbone.bottom_up.stem.conv1"


@pytest.mark.slow
def test_other_width_matches_our_export(d2_graph):
    """Half the fixture's widths (FPN 32, fc 128, ...), weights conditioned like a trained
    model (1000 proposals, 300 detections): detectron2's graph with them must give our
    export's detections and masks, from the same 1000 proposals."""
    from bench_vs_detectron2 import proposals, session
    from full_size_model import H, W, full_size_spec, image_800x1216, trained_like
    from norcal.export.rcnn.export import export_detector
    from norcal.export.rcnn.modeling.build import model_from_state

    spec = dataclasses.replace(full_size_spec(), stem_out_channels=8, res2_out_channels=32,
                               width_per_group=8, fpn_out_channels=32, box_head_fc_dim=128,
                               mask_head_conv_dim=32)
    image = image_800x1216()
    torch.manual_seed(0)
    state = trained_like(spec, image).many
    graph = widen_mod.widen(d2_graph, state)
    assert [int(numpy_helper.to_array(c.attribute[0].t)[0])
            for c in widen_mod._pooler_channel_constants(graph)] == [32, 32]
    d2_feeds = {"x.1": image}
    d2_out = session(graph, 2).run(None, d2_feeds)
    ours = export_detector(model_from_state(spec, state).eval(), spec)
    feeds = {"images": image[None], "image_sizes": np.array([[H, W]], np.int64)}
    our_out = session(ours, 2).run(None, feeds)
    got = widen_mod.compare_detections(d2_out, our_out, min_iou=0.99, max_score_diff=1e-4)
    assert got["detectron2"] == got["ours"] == 300, got
    # left unpaired only: the 300th place (a near tie in score), or one of two same-class
    # boxes overlapping at the NMS threshold (0.5), which float32 class offsets decide
    cut = d2_out[3].min() + 1e-4
    assert all(score <= cut or abs(iou - 0.5) < 2e-3 for score, iou in got["unpaired"]), got
    assert got["matched"] >= 297 and got["max_mask_diff"] < 2e-3, got
    assert proposals(graph, d2_feeds, 2) == proposals(ours, feeds, 2) == 1000
