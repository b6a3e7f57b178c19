"""RetinaNet (detectron2's meta architecture: sigmoid head on FPN P3-P7, no background) against
the real detectron2's goldens (tests/fixtures/d2_retinanet_tiny): the head's tensors, eager
PyTorch and ONNX Runtime on all three fixture images in one zero-padded batch, at every
NorCal setting, from the config and from the weights alone; NorCal as one node on the
concatenated class logits, replaced on a re-run, removed by strip.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import golden as G
from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core import contract
from norcal.core.calibration.formula import log_prior
from norcal.core.errors import NorcalError
from norcal.export.graph.calibrate import calibrate_graph
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import model_from_state
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.spec import RETINANET, arch_name
from norcal.export.graph.surgery import has_norcal, strip_norcal
from norcal.export.trt_check import check_model
from norcal.export.trt_check.support import NMS_BOXES_PER_BATCH_ITEM, TOPK_K_LIMIT
from test_c4_dc5 import HOST_ONLY, Arch, check_detections, manifest_table
from test_onnx_export import run

pytestmark = pytest.mark.slow  # RetinaNet exports and golden parity at every setting

torch.set_num_threads(2)

FIXTURE = FIXTURES / "d2_retinanet_tiny"
WEIGHTS, CONFIG = FIXTURE / "model_final.pth", FIXTURE / "config.yaml"
IMAGES = range(3)
LEVELS = ("p3", "p4", "p5", "p6", "p7")
A, C = 9, 1203


class Retina(Arch):
    """The fixture's model, exported graph and cached outputs (each computed once); the ONNX
    side is test_c4_dc5's, NorCal enters the eager model through the model itself."""

    def __init__(self):  # Arch's fields, for the RetinaNet fixture
        self.fixture, self._onnx = FIXTURE, None
        self.spec, state = load_detector_spec(WEIGHTS, CONFIG)
        self.model = model_from_state(self.spec, state)
        self.images, self.sizes = G.batch(IMAGES, fixture=FIXTURE)
        self.table = manifest_table(FIXTURE)
        self.eager, self.ort = {}, {}

    def eager_outputs(self, setting: str) -> dict:
        if setting not in self.eager:
            factor, gamma = G.GAMMAS[setting]
            lp = log_prior(self.table.counts(), gamma, factor, background="none")
            self.model.set_log_prior(None if gamma == 0 else lp)
            try:
                with torch.no_grad():
                    out = self.model.inference(torch.from_numpy(self.images), torch.from_numpy(self.sizes))
            finally:
                self.model.set_log_prior(None)
            self.eager[setting] = {k: v.numpy() for k, v in out.items()}
        return self.eager[setting]

    def calibrated(self, setting: str) -> onnx.ModelProto:
        factor, gamma = G.GAMMAS[setting]
        # no background argument: the export recorded that this classifier has none
        return self.onnx if gamma == 0 else calibrate_graph(self.onnx, gamma, self.table, factor=factor)

    def ort_outputs(self, setting: str) -> dict:
        if setting not in self.ort:
            self.ort[setting] = run(session(self.calibrated(setting)), self.images, self.sizes)
        return self.ort[setting]


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    """test_onnx_export's session without the memory arena: the dense [B, N, C] scores of a
    batch take GBs, which go back when the run ends instead of staying with the session."""
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.enable_cpu_mem_arena = False
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_img0(proto: onnx.ModelProto) -> dict:
    return run(session(proto), *G.batch([0], fixture=FIXTURE))


_RETINA: list[Retina] = []


@pytest.fixture(scope="module")
def retina() -> Retina:
    if not _RETINA:
        _RETINA.append(Retina())
    return _RETINA[0]


# ---------------------------------------------------------------- what the config and weights say

def test_config_gives_the_retinanet_spec():
    spec, _ = load_detector_spec(WEIGHTS, CONFIG)
    assert (arch_name(spec), spec.meta_architecture, spec.mask_on) == ("RetinaNet", RETINANET, False)
    assert (spec.num_classes, spec.retinanet_num_convs, spec.retinanet_topk_candidates) == (1203, 4, 1000)
    assert (spec.score_thresh_test, spec.nms_thresh_test, spec.detections_per_image) == (1e-4, 0.5, 300)
    assert spec.bbox_reg_weights == (1.0, 1.0, 1.0, 1.0)
    assert len(spec.anchor_sizes) == 5
    assert spec.anchor_sizes[0] == pytest.approx((32, 32 * 2 ** (1 / 3), 32 * 2 ** (2 / 3)))


def test_weights_alone_give_the_config_model():
    """Without a config the inferred spec equals the config's in every field the model reads
    (the config's test thresholds are the LVIS ones the inference assumes); the assumptions
    are recorded and the weights load strictly."""
    inferred, state = load_detector_spec(WEIGHTS)
    configured, _ = load_detector_spec(WEIGHTS, CONFIG)
    unused = {f for f in configured.__dataclass_fields__
              if f.startswith(("rpn_", "box_head_", "mask_", "pooler_", "roi_", "cls_agnostic", "backbone_out"))}
    for field in configured.__dataclass_fields__:
        if field not in HOST_ONLY | unused:
            assert getattr(inferred, field) == getattr(configured, field), field
    assert inferred.provenance["source"] == "inferred from weights"
    assert "assumed" in inferred.provenance["anchor_sizes"]
    assert "assumed" in inferred.provenance["test_thresholds"]
    model_from_state(inferred, state)


def test_config_refusals_name_the_key(tmp_path):
    text = CONFIG.read_text()
    bad = tmp_path / "config.yaml"
    bad.write_text(text.replace("    NORM: ''\n    NUM_CLASSES: 1203\n    NUM_CONVS",
                                "    NORM: GN\n    NUM_CLASSES: 1203\n    NUM_CONVS"))
    with pytest.raises(NorcalError, match="MODEL.RETINANET.NORM"):
        load_detector_spec(WEIGHTS, bad)


# ---------------------------------------------------------------- eager PyTorch

def test_head_matches_golden_img0(retina):
    """Every level's box deltas, the coarse levels' logits in full and the finer levels' 1000
    largest logits (value and flat (H, W, A, C) index), baseline, img0 alone."""
    images, sizes = G.batch([0], fixture=FIXTURE)
    with torch.no_grad():
        out = retina.model.inference(torch.from_numpy(images), torch.from_numpy(sizes), intermediates=True)
    logits, deltas = out["cls_logits"][0].numpy(), out["box_deltas"][0].numpy()
    g = G.golden(0, FIXTURE)
    start = 0
    for level in LEVELS:
        gd = g[f"head/{level}/box_deltas"]  # [A*4, H, W]
        h, w = gd.shape[1:]
        n = h * w * A
        ours_d = deltas[start:start + n]
        ref_d = gd.reshape(A, 4, h, w).transpose(2, 3, 0, 1).reshape(-1, 4)
        assert np.abs(ours_d - ref_d).max() <= 1e-3, level
        ours_l = logits[start:start + n]
        if f"head/{level}/cls_logits" in g:
            ref_l = g[f"head/{level}/cls_logits"].reshape(A, C, h, w).transpose(2, 3, 0, 1).reshape(-1, C)
            assert np.abs(ours_l - ref_l).max() <= 1e-3, level
        flat = ours_l.reshape(-1)
        np.testing.assert_allclose(flat[g[f"head/{level}/top_index"]], g[f"head/{level}/top_logits"], atol=1e-3)
        assert np.sort(flat)[::-1][:1000] == pytest.approx(g[f"head/{level}/top_logits"], abs=1e-3)
        start += n
    assert start == len(logits)


@pytest.mark.parametrize("setting", G.SETTINGS)
def test_eager_detections_match_golden(retina, setting):
    check_detections(retina.eager_outputs(setting), setting, FIXTURE)


def test_cached_rescoring_matches_golden_at_every_setting(retina):
    """tune's re-scoring: one pass caches each prior's candidates, NMS over them at each
    setting gives detectron2's NorCal detections (each prior selects its own candidates)."""
    from types import SimpleNamespace

    from norcal.export.rcnn.retinanet_detector import cache_candidates, rescore_candidates

    priors = []
    for setting in G.SETTINGS:
        factor, gamma = G.GAMMAS[setting]
        priors.append(None if gamma == 0 else log_prior(retina.table.counts(), gamma, factor, background="none"))
    b = SimpleNamespace(images=retina.images, image_sizes=retina.sizes, original_sizes=retina.sizes)
    cache = cache_candidates(retina.model, [(list(IMAGES), b)], priors, "exp")
    for index, setting in enumerate(G.SETTINGS):
        check_detections(rescore_candidates(retina.model, cache, index, batch_size=2), setting, FIXTURE)


# ---------------------------------------------------------------- ONNX

def test_graph_contract_and_tensorrt_check(retina):
    g = retina.onnx.graph
    assert [i.name for i in g.input] == ["images", "image_sizes"]
    assert [o.name for o in g.output] == ["num_detections", "boxes", "scores", "classes"]
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in g.output}
    assert dims["boxes"] == ["batch", 300, 4]
    nodes = list(g.node)
    assert not {n.op_type for n in nodes} & {"Loop", "If", "Scan"}
    report = check_model(retina.onnx)
    assert report.compatible
    assert not [f for f in report.findings if f.op_type == "TopK"]  # 1000 per level: K < 3840
    assert retina.spec.retinanet_topk_candidates < TOPK_K_LIMIT
    # one NMS over every level's candidates: 5 x 1000 boxes per batch item, TensorRT's limit
    nms = [n for n in nodes if n.op_type == "NonMaxSuppression"]
    assert len(nms) == 1 and len(LEVELS) * retina.spec.retinanet_topk_candidates <= NMS_BOXES_PER_BATCH_ITEM
    # one Sigmoid, on the concatenated logits the metadata names
    meta = {p.key: p.value for p in retina.onnx.metadata_props}
    assert meta[contract.CLASSIFIER_LOGITS] == contract.CLS_LOGITS_TENSOR
    assert meta[contract.CLASSIFIER_BACKGROUND] == "none"
    sig = [n for n in nodes if n.op_type == "Sigmoid"]
    assert [n.input[0] for n in sig] == [contract.CLS_LOGITS_TENSOR]
    assert_tensorrt_compatible(retina.calibrated("cdt_g0.5"))


@pytest.mark.parametrize("setting", G.SETTINGS)
def test_onnxruntime_batch_matches_golden(retina, setting):
    check_detections(retina.ort_outputs(setting), setting, FIXTURE)


def test_image_alone_equals_image_in_a_larger_batch(retina):
    """img0 (320x427) alone, padded to 320x448, vs in the batch padded to 480x512 by larger ones."""
    batched = retina.ort_outputs("baseline")
    images, sizes = G.batch([0], fixture=FIXTURE)
    assert images.shape[-2:] != retina.images.shape[-2:]
    G.assert_same_first_image(run(session(retina.onnx), images, sizes), batched)


def test_norcal_node_replaced_on_rerun_and_stripped(retina):
    once = retina.calibrated("cdt_g1.0")
    twice = calibrate_graph(once, 0.5, retina.table)
    for model, gamma in ((once, "1.0"), (twice, "0.5")):
        nodes = [n for n in model.graph.node if n.domain == contract.NODE_DOMAIN]
        assert len(nodes) == 1 and list(nodes[0].input)[0] == contract.CLS_LOGITS_TENSOR
        meta = {p.key: p.value for p in model.metadata_props}
        assert (meta[contract.GAMMA], meta[contract.ACTIVATION], meta[contract.BACKGROUND]) == \
            (gamma, "sigmoid", "none")
        assert meta[contract.BACKGROUND_INDEX] == "-1"
    # the re-run equals a calibration of the plain graph at 0.5 (img0 alone: less memory)
    direct = run_img0(calibrate_graph(retina.onnx, 0.5, retina.table))
    rerun = run_img0(twice)
    for k in direct:
        np.testing.assert_array_equal(direct[k], rerun[k])
    plain = strip_norcal(twice)
    assert not has_norcal(plain)
    assert not [n for n in plain.graph.node if n.domain == contract.NODE_DOMAIN or
                n.name.startswith(contract.INLINE_PREFIX)]
    assert [n.input[0] for n in plain.graph.node if n.op_type == "Sigmoid"] == [contract.CLS_LOGITS_TENSOR]
    meta = {p.key: p.value for p in plain.metadata_props}
    assert meta[contract.CLASSIFIER_BACKGROUND] == "none" and contract.GAMMA not in meta
    stripped, baseline = run_img0(plain), run_img0(retina.onnx)
    for k, v in baseline.items():
        np.testing.assert_array_equal(stripped[k], v)


def test_weights_only_export_matches_golden_img0():
    """The config-less path, exported and run: img0 at the baseline setting."""
    spec, state = load_detector_spec(WEIGHTS)
    proto = export_onnx(model_from_state(spec, state), spec, batch=1, height=320, width=448)
    assert_tensorrt_compatible(proto)
    check_detections(run_img0(proto), "baseline", FIXTURE, images=[0])


def test_checkpoint_export_job_records_the_calibrated_tensor(tmp_path):
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    out = tmp_path / "retina.onnx"
    result = export_checkpoint(WEIGHTS, out, NorCal(gamma=0.5, table=manifest_table(FIXTURE)),
                               CheckpointExport(config=CONFIG))
    assert result.tensorrt.compatible
    assert dict(result.description)["architecture"].startswith("RetinaNet R50-RetinaNet, ")
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert meta[contract.CLASSIFIER_LOGITS] == meta[contract.LOGITS] == contract.CLS_LOGITS_TENSOR
    assert (meta[contract.ACTIVATION], meta[contract.BACKGROUND]) == ("sigmoid", "none")
