"""norcal tune beyond the FPN Mask R-CNN: Cascade, C4, DC5 and RetinaNet; Ultralytics' best-class decodings.

The cached re-scoring must give what the deployed graph gives at each gamma: checked against
full ONNX Runtime runs of each architecture's export calibrated at that gamma, against
detectron2's own NorCal detections (the fixtures' goldens), and end to end (the sweep's AP
at each gamma is the AP of the exported model at that gamma, run and scored separately).
A Cascade caches every stage's logits and averages the stages' calibrated probabilities, as
the graph's three NorCal nodes do; a RetinaNet caches, per gamma, the levels' candidates that
the calibrated scores select.
"""

import numpy as np
import pytest

import golden as G
from conftest import FIXTURES
from golden import match_detections, manifest_table

pytestmark = pytest.mark.slow  # caches four architectures' head outputs and sweeps gamma


ARCHS = {"cascade": "d2_cascade_tiny", "c4": "d2_c4_tiny", "dc5": "d2_dc5_tiny",
         "retinanet": "d2_retinanet_tiny"}
IMAGES = range(3)
# (gamma, mechanism, factor) compared with the calibrated export
VARIANTS = [(0.0, "exp", "cdt"), (0.5, "exp", "cdt"), (0.1, "logit", "cdt"), (0.999, "exp", "ens")]


class Arch:
    """One fixture: the detector, its plain export, the cache and the re-scored detections."""

    def __init__(self, name: str):
        from norcal.export.rcnn.export import export_detector
        from norcal.export.families.detectron2.loader import load_model
        from norcal.export.families.detectron2.family import detector_of

        self.name, self.fixture = name, FIXTURES / ARCHS[name]
        self.pairs = [(k, self.fixture / "images" / f"img{k}.png") for k in IMAGES]
        self.spec, self.model = load_model(self.fixture / "model_final.pth", self.fixture / "config.yaml")
        self.table = manifest_table(self.fixture)
        self.retina = name == "retinanet"
        self.plain = export_detector(self.model, self.spec)
        self.detector = detector_of(self.spec, self.model)
        self._caches: dict = {}
        self._onnx: dict = {}
        self._rescored: dict = {}

    def prior(self, gamma: float, factor: str):
        from norcal.core.calibration.formula import log_prior

        if gamma == 0:
            return None
        return log_prior(self.table.counts(), gamma, factor, background="none" if self.retina else "last")

    def cache(self, mechanism: str = "exp"):
        """R-CNNs: one cache for every gamma; RetinaNet: one per mechanism, holding the
        candidates of every variant's prior."""
        from norcal.workflows.tune_cache import cache_images

        key = mechanism if self.retina else "all"
        if key not in self._caches:
            priors = [self.prior(g, f) for g, m, f in VARIANTS if m == mechanism] if self.retina else [None]
            self._caches[key] = cache_images(self.detector, self.pairs, priors, mechanism,
                                             batch_size=2)  # a partial last batch
        return self._caches[key]

    def rescored(self, gamma: float, mechanism: str = "exp", factor: str = "cdt"):
        from norcal.workflows.tune_cache import rescore_images

        key = (gamma, mechanism, factor)
        if key not in self._rescored:
            cache = self.cache(mechanism)
            # a RetinaNet's cache holds each variant's candidates; an R-CNN's serves every prior
            index = [(g, f) for g, m, f in VARIANTS if m == mechanism].index((gamma, factor)) if self.retina else 0
            self._rescored[key] = rescore_images(self.detector, cache, index, self.prior(gamma, factor),
                                                 mechanism, batch_size=2)
        return self._rescored[key]

    def onnx_detections(self, gamma: float, mechanism: str, factor: str, tmp_path):
        key = (gamma, mechanism, factor)
        if key not in self._onnx:
            self._onnx[key] = self._run_onnx(gamma, mechanism, factor, tmp_path)
        return self._onnx[key]

    def _run_onnx(self, gamma: float, mechanism: str, factor: str, tmp_path):
        from norcal.core.files.onnx_io import save_onnx
        from norcal.export.graph.calibrate import calibrate_graph
        from norcal.runtime.inference import run_images
        from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner

        model = self.plain if gamma == 0 else calibrate_graph(self.plain, gamma, self.table, factor=factor,
                                                              mechanism=mechanism)
        path = tmp_path / f"{self.name}.onnx"
        save_onnx(model, path)
        return [d for _, d in run_images(OnnxRuntimeRunner(path), [p for _, p in self.pairs], 2)]


_ARCHS: dict[str, Arch] = {}


@pytest.fixture(scope="module", params=list(ARCHS))
def arch(request) -> Arch:
    return _arch(request.param)


def _arch(name: str) -> Arch:
    if name not in _ARCHS:
        _ARCHS[name] = Arch(name)
    return _ARCHS[name]


# C4 and DC5 at gamma 0 and 0.5 only: what is their own is the cache (C4: res5 on each pooled box;
# DC5: one dilated map), which both exercise; the logit and ENS variants re-score the cached
# predictor inputs by the same code for every R-CNN, checked on Cascade (and RetinaNet's own)
RESCORING_CASES = [(name, *v) for name in ARCHS for v in VARIANTS
                   if name not in ("c4", "dc5") or v[1:] == ("exp", "cdt")]


@pytest.mark.parametrize("name, gamma, mechanism, factor", RESCORING_CASES)
def test_rescoring_equals_exported_model(name, gamma, mechanism, factor, tmp_path):
    arch = _arch(name)
    full = arch.onnx_detections(gamma, mechanism, factor, tmp_path)
    ours = arch.rescored(gamma, mechanism, factor)
    for k, a, b in zip(IMAGES, full, ours):
        assert len(a) > 50
        frac, _ = match_detections(a.boxes, a.scores, a.classes, b.boxes, b.scores, b.classes)
        assert frac >= 0.99, f"{arch.name} gamma {gamma} {mechanism} {factor} img{k}: {frac:.3f}"
        assert abs(len(a) - len(b)) <= max(1, len(a) // 100)


@pytest.mark.parametrize("setting", ["baseline", "cdt_g0.5", "ens_g0.999"])
def test_rescoring_matches_detectron2(setting, arch):
    """At the fixture's NorCal settings the re-scored detections are detectron2's (original
    image coordinates)."""
    factor, gamma = G.GAMMAS[setting]
    for k, det in zip(IMAGES, arch.rescored(gamma, factor=factor)):
        g = G.golden(k, arch.fixture)
        frac, _ = match_detections(g[f"{setting}/boxes_orig"], g[f"{setting}/scores"],
                                   g[f"{setting}/classes"], det.boxes, det.scores, det.classes)
        assert frac >= 0.99, f"{arch.name} {setting} img{k}: {frac:.3f}"


def test_rescoring_differs_between_gammas(arch):
    a = arch.rescored(0.0)[0]
    b = arch.rescored(0.5)[0]
    frac, _ = match_detections(a.boxes, a.scores, a.classes, b.boxes, b.scores, b.classes)
    assert frac < 0.9


def test_cache_estimate_bounds_the_real_cache(arch):
    from norcal.export.families.detectron2.family import estimate_cache_bytes

    cache = arch.cache()
    gammas = sum(m == "exp" for _, m, _ in VARIANTS) if arch.retina else 1
    assert 0 < cache.nbytes <= estimate_cache_bytes(arch.spec, len(IMAGES), gammas)


# --------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def gt_files(tmp_path_factory):
    """Per fixture, a GT made from detectron2's baseline detections (top 15 per image)."""
    d = tmp_path_factory.mktemp("gt")
    return {name: G.gt_from_golden(FIXTURES / folder, d / f"{name}.json") for name, folder in ARCHS.items()}


def test_sweep_ap_is_the_exported_models_ap(arch, gt_files, tmp_path):
    """tune()'s AP at each gamma equals the AP of the export calibrated at that gamma, run by
    ONNX Runtime and scored by the evaluation on its own."""
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.workflows.tune import tune
    from norcal.workflows.tune_cache import to_eval_detections

    gammas = [0.0, 0.5]  # the ONNX runs of test_rescoring_equals_exported_model
    result = tune(arch.fixture / "model_final.pth", gt_files[arch.name], arch.fixture / "images", gammas,
                  arch.table, config=arch.fixture / "config.yaml", batch_size=2)
    assert [p.gamma for p in result.points] == gammas and result.num_images == len(IMAGES)
    gt = prepare_gt(gt_files[arch.name], arch.table)
    for point in result.points:
        dets = arch.onnx_detections(point.gamma, "exp", "cdt", tmp_path)
        ev = to_eval_detections([k + 1 for k in IMAGES], dets, arch.table.category_ids)
        stats = evaluate(gt, ev, "bbox", 300).stats
        # measured: the sweep's AP is the export's exactly (0.0 difference, all four,
        # both gammas). Bound 1e-9: room for summation order only; one detection lost moves AP
        # by 2e-3 and more
        for key in ("AP", "AP50", "APr", "APc", "APf"):
            assert point.stats[key] == pytest.approx(stats[key], abs=1e-9), (arch.name, point.gamma, key)
    assert len({round(p.stats["AP"], 6) for p in result.points}) > 1  # gamma moves the AP


# --------------------------------------------------------------------------- Ultralytics, best-class

# the best-class decodings (norcal.core.decoding): the YOLO's predictor NMS, class-wise and agnostic,
# and RT-DETR's best class per query; conf yolo_models.BEST_CLASS_CONF (0.05), given in the test
BEST_CLASS = {"yolo": ("det", False), "yolo_agnostic": ("det", True), "rtdetr": ("rtdetr", False),
              "yolo_seg": ("seg", False)}  # the predictor drops detections whose mask is empty


@pytest.mark.parametrize("case", list(BEST_CLASS))
def test_best_class_sweep_ap_is_the_exported_models_ap(case, yolo_work, tmp_path):
    """As test_sweep_ap_is_the_exported_models_ap, for the best-class decodings: each gamma's
    argmax, conf and NMS re-run from the cache give the AP of the best-class export calibrated
    at that gamma, run by ONNX Runtime (the session's export, test_ultralytics_decodings.py's)."""
    from yolo_models import BEST_CLASS_CONF, IMAGES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR
    from test_tune_yolo import _gt

    from norcal.core.decoding import Decoding
    from norcal.core.files.onnx_io import save_onnx
    from norcal.core.calibration.tables import load_table
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
    from norcal.runtime.inference import run_images
    from norcal.workflows.export_job import NorCal, calibrate_onnx
    from norcal.workflows.tune import tune
    from norcal.workflows.tune_cache import to_eval_detections

    kind, agnostic = BEST_CLASS[case]
    decoding = Decoding("best-class", agnostic, BEST_CLASS_CONF)
    gt_path, table = _gt(tmp_path / "gt.json"), load_table(yolo_work.table)
    if kind in ("det", "seg"):  # the hand-written boxes are none of the random-init YOLO's: AP 0 at every gamma
        _ultralytics_gt(gt_path, yolo_work, kind)
    result = tune(getattr(yolo_work, kind), gt_path, IMAGES[0].parent, [0.0, 0.5], yolo_work.table, batch_size=3,
                  decoding=decoding)
    assert [p.gamma for p in result.points] == [0.0, 0.5] and result.num_images == len(IMAGES)
    _, plain = yolo_work.plain(kind, decoding)
    gt = prepare_gt(gt_path, table)
    for point in result.points:
        path = tmp_path / f"{case}_{point.gamma}.onnx"
        save_onnx(calibrate_onnx(plain, NorCal(gamma=point.gamma, table=str(yolo_work.table))), path)
        dets = [d for _, d in run_images(OnnxRuntimeRunner(path), sorted(IMAGES), 2)]  # the GT's ids 1.. by name
        stats = evaluate(gt, to_eval_detections(range(1, len(IMAGES) + 1), dets, table.category_ids), "bbox",
                         300).stats
        # measured: the sweep's AP is the export's exactly (0.0 difference on every key, the three
        # cases, both gammas; YOLO AP 0.62-0.69). Bound 1e-9: room for summation order only; the
        # multi-label export's AP is 8e-4 to 0.047 away on the YOLO cases (RT-DETR 6e-4 at gamma 0)
        for key in ("AP", "AP50", "APr", "APc", "APf"):
            assert point.stats[key] == pytest.approx(stats[key], abs=1e-9), (case, point.gamma, key)
    assert len({round(p.stats["AP"], 6) for p in result.points}) > 1  # gamma moves the AP


def _ultralytics_gt(path, yolo_work, kind: str = "det", top: int = 4):
    """The GT file at ``path`` with its annotations replaced by the ``top`` best of Ultralytics'
    own predictor detections of the YOLO per image (gamma 0, best-class), in original pixels
    clipped to the image."""
    import json

    from family_cases import yolo_reference
    from norcal.runtime.images import read_rgb

    doc = json.loads(path.read_text())
    by_name = {im["file_name"]: im for im in doc["images"]}
    from yolo_models import IMAGES

    images = [read_rgb(p) for p in IMAGES]
    dets, pads, _, _ = yolo_reference(getattr(yolo_work, kind), images, 0.0, yolo_work.counts, seg=kind == "seg",
                                      multi_label=False)
    anns = []
    for p, im, d, pad in zip(IMAGES, images, dets, pads):
        scale = min(yolo_work.size / im.shape[0], yolo_work.size / im.shape[1])
        for x0, y0, x1, y1, _, c in d[:top, :6]:
            # clipped to the image, as the host clips the detections
            x0, y0, x1, y1 = np.clip((np.array([x0, y0, x1, y1]) - pad) / scale, 0, np.tile(im.shape[1::-1], 2))
            anns.append({"id": len(anns) + 1, "image_id": by_name[p.name]["id"], "category_id": int(c) + 1,
                         "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                         "area": float((x1 - x0) * (y1 - y0)), "iscrowd": 0})
    doc["annotations"] = anns
    path.write_text(json.dumps(doc))


# --------------------------------------------------------------------------- Cascade only

@pytest.fixture(scope="module")
def cascade() -> Arch:
    if "cascade" not in _ARCHS:
        _ARCHS["cascade"] = Arch("cascade")
    return _ARCHS["cascade"]


def test_cascade_cache_holds_every_stage(cascade):
    spec, cache = cascade.spec, cascade.cache()
    p = cache.proposals.shape[1]
    assert cache.cls_logits.shape == (3, p, 3, spec.num_classes + 1)
    assert cache.box_deltas.shape == (3, p, 4)


def test_cascade_cached_stage_logits_are_the_models(cascade):
    """img0's three stages' logits and the last stage's boxes, against detectron2's goldens."""
    g, cache = G.golden(0, cascade.fixture), cascade.cache()
    valid = cache.valid[0].numpy()
    j = G.box_iou(g["stage2/proposal_boxes"], cache.proposals[0].numpy()[valid]).argmax(1)
    for k in range(3):
        assert np.abs(cache.cls_logits[0, :, k].numpy()[valid][j] - g[f"stage{k}/cls_logits"]).max() <= 1e-3


# --------------------------------------------------------------------------- RetinaNet only

def test_retinanet_candidate_cache_refuses_another_sweep():
    """A candidate cache is tied to the priors (gammas, counts) and mechanism it was made with."""
    from norcal.core.errors import NorcalError
    from norcal.workflows.tune_sweep import sweep

    retina = _ARCHS.get("retinanet") or Arch("retinanet")
    with pytest.raises(NorcalError, match="other gammas"):
        sweep(retina.detector, retina.cache("exp"), {}, retina.table, [0.0, 0.7])


def test_cli_tune_on_retinanet(gt_files, tmp_path, capsys):
    """`norcal tune` end to end on RetinaNet, with the prob mechanism (its candidates come from
    the calibrated probabilities themselves); an undefined AP prints as "-", not -100."""
    import json

    from norcal.cli import main

    fixture = FIXTURES / ARCHS["retinanet"]
    manifest_table(fixture).save(tmp_path / "table.json")
    rc = main(["tune", str(fixture / "model_final.pth"), "--config", str(fixture / "config.yaml"),
               "--gt", str(gt_files["retinanet"]), "--images", str(fixture / "images"),
               "--table", str(tmp_path / "table.json"), "--mechanism", "prob", "--gammas", "0:1:0.5",
               "--json", str(tmp_path / "sweep.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "recommended gamma" in out and "-100" not in out
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["mechanism"] == "prob" and [p["gamma"] for p in doc["sweep"]] == [0.0, 0.5, 1.0]
