"""What every registered detector family must do, one tiny model each (tests/family_cases.py):
a family is done when it joins this suite.

Each family's checkpoint goes through the public export job with a NorCal node (gamma 0.5; the
written file re-calibrated to gamma 0 by ``norcal export`` on ONNX), passes ``norcal check``,
runs in ``norcal infer``, matches its upstream reference with NorCal by hand at both gammas
(same class, IoU >= 0.99, score within 1e-4, >= 99% paired: the parity package's one-to-one
matcher), gives an image in a batch beside a different-size one the detections it has alone,
and records every runtime key, its classifier's as its Detector says.

A family of ONNX graphs only (foreign) goes through ``export_onnx_file`` instead, its graph's own
inputs and outputs (``FamilyCase.graph_io``); checks that need our I/O contract or a Detector do
not apply to it, and each case says why for every check it leaves out (``not_applicable``). Its
NorCal node is checked against the classifier search and the graph instead.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from family_cases import CASES, Checkpoint, FamilyCase, read_images
from norcal.core import contract
from norcal.export.families import FAMILIES, Detector, graph_family, load_detector
from norcal.workflows.parity.matching import match_detections

GAMMAS = (0.0, 0.5)
MIN_IOU, MAX_SCORE_DIFF, MIN_PAIRED = 0.99, 1e-4, 0.99  # the project's matching rule
# checks that apply only to some cases: batch, infer (our I/O contract), detector (a checkpoint's
# Detector), search (a graph's NorCal node against the classifier search)
CHECKS = ("batch", "infer", "detector", "search")


def cases_for(check: str) -> list[str]:
    """The cases ``check`` runs over: those not declaring it not applicable."""
    return sorted(name for name, case in CASES.items() if check not in case.not_applicable)


def test_every_family_has_a_case():
    registered = {f.name for f in FAMILIES}
    missing, stale = sorted(registered - set(CASES)), sorted(set(CASES) - registered)
    assert not missing, f"families with no conformance case in tests/family_cases.py: {', '.join(missing)}"
    assert not stale, f"conformance cases for no registered family: {', '.join(stale)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_check_left_out_says_why(name):
    """No case drops out of a check silently: each one it leaves out is a known check, with a
    one-line reason; a graph without our I/O contract leaves out the checks that need it, and a
    family reads checkpoints exactly when its Detector is checked."""
    case = CASES[name]
    for check, why in case.not_applicable.items():
        assert check in CHECKS, f"{name}: unknown check {check!r}"
        assert why.strip() and "\n" not in why, f"{name}: {check} needs a one-line reason"
    if case.graph_io is not None:
        assert {"batch", "infer"} <= set(case.not_applicable), name
    family = next(f for f in FAMILIES if f.name == name)
    assert (name in cases_for("detector")) == family.reads_checkpoints
    assert (name in cases_for("search")) != family.reads_checkpoints


@dataclass
class Exported:
    """One family's export (gamma 0.5) and its gamma-0 copy, with the graphs' outputs per image
    run alone, computed once."""

    case: FamilyCase
    ckpt: Checkpoint
    files: dict[float, Path]
    results: dict  # gamma -> norcal.workflows.export_job.ExportResult (0.5: the checkpoint export)
    detector: Detector | None  # None: a family of ONNX graphs only
    images: list[np.ndarray]
    _sessions: dict = field(default_factory=dict)
    _alone: dict = field(default_factory=dict)
    _references: dict = field(default_factory=dict)

    def meta(self, gamma: float = 0.5) -> dict[str, str]:
        return {p.key: p.value for p in self.results[gamma].model.metadata_props}

    @property
    def host_flags(self) -> list[str]:
        sizes = self.case.host_sizes
        return [] if sizes is None else ["--min-size", str(sizes[0]), "--max-size", str(sizes[1])]

    def run(self, gamma: float, images: list[np.ndarray]) -> dict[str, np.ndarray]:
        from norcal.runtime.inference import prepare

        io = self.case.graph_io
        if gamma not in self._sessions:
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
            self._sessions[gamma] = ort.InferenceSession(str(self.files[gamma]), so,
                                                         providers=["CPUExecutionProvider"])
        sess = self._sessions[gamma]
        if io is not None:  # the graph's own inputs: one image
            (image,) = images
            return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, io.feeds(image))))
        spec = contract.input_spec(self.meta(gamma), *(self.case.host_sizes or ()))
        out = sess.run(None, prepare(images, spec).feeds())
        return dict(zip([o.name for o in sess.get_outputs()], out))

    def references(self, gamma: float) -> list:
        """The upstream references at ``gamma``, every gamma of the suite computed in one call."""
        if not self._references:
            self._references = self.case.reference(self.ckpt, GAMMAS)
        return self._references[gamma]

    def alone(self, gamma: float) -> list[dict[str, np.ndarray]]:
        """Each image run alone at ``gamma``."""
        if gamma not in self._alone:
            self._alone[gamma] = [self.run(gamma, [img]) for img in self.images]
        return self._alone[gamma]

    def detections(self, out: dict, b: int = 0):
        """Image ``b``'s (boxes, scores, classes) in ``out``, the graph's outputs."""
        io = self.case.graph_io
        return _detections(out, b) if io is None else io.detections(out)


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory) -> Exported:
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint, export_onnx_file

    case = CASES[request.param]
    folder = tmp_path_factory.mktemp(case.family)
    ckpt = case.make(folder)
    files = {0.5: folder / "model.norcal.onnx", 0.0: folder / "model_g0.norcal.onnx"}
    norcal = {g: NorCal(gamma=g, table=str(ckpt.table), **case.norcal) for g in GAMMAS}
    if next(f for f in FAMILIES if f.name == case.family).reads_checkpoints:
        results = {0.5: export_checkpoint(ckpt.path, files[0.5], norcal[0.5], CheckpointExport(config=ckpt.config))}
        detector = load_detector(ckpt.path, ckpt.config)
    else:  # an ONNX graph: the public ONNX path, which asks the registry whose graph it is
        chosen = graph_family(onnx.load(ckpt.path)).name
        assert chosen == case.family, f"{ckpt.path.name}: graph_family chose {chosen}, not {case.family}"
        results, detector = {0.5: export_onnx_file(ckpt.path, files[0.5], norcal[0.5])}, None
    results[0.0] = export_onnx_file(files[0.5], files[0.0], norcal[0.0])
    return Exported(case, ckpt, files, results, detector, read_images(ckpt.images))


def _detections(out: dict, b: int = 0):
    n = int(out["num_detections"][b])
    return out["boxes"][b, :n], out["scores"][b, :n], out["classes"][b, :n]


def _paired(ref, ours) -> int:
    """How many of ``ref``'s detections (boxes, scores, classes) pair one-to-one with ``ours``."""
    ri, _, _ = match_detections(*ref, *ours, iou_threshold=MIN_IOU, max_score_diff=MAX_SCORE_DIFF)
    return len(ri)


@pytest.mark.slow
def test_export_passes_norcal_check(exported):
    from norcal.cli import main

    io = exported.case.graph_io
    profiles = [] if io is None else [a for p in io.profiles for a in ("--profile", p)]
    for gamma, path in exported.files.items():
        report = exported.results[gamma].tensorrt  # the export's check_model of what it wrote
        # a foreign graph's dynamic inputs have no default profile: only that may be missing
        errors = [f"{f.node} ({f.op_type}): {f.reason}" for f in report.errors
                  if not (profiles and "not covered by any profile" in f.reason)]
        assert not errors, errors
        assert main(["check", str(path), "--quiet", *profiles]) == 0
        assert float(exported.meta(gamma)[contract.GAMMA]) == gamma  # a NorCal node, at the gamma asked for


@pytest.mark.slow
@pytest.mark.parametrize("gamma", GAMMAS)
def test_matches_upstream_with_norcal_by_hand(exported, gamma):
    refs = exported.references(gamma)
    assert len(refs) == len(exported.images) >= 4
    for path, ref, out in zip(exported.ckpt.images, refs, exported.alone(gamma)):
        ours = exported.detections(out)
        n = len(ref.scores)
        assert n >= exported.case.min_detections, f"{path.name}: only {n} reference detections"
        assert len(ours[1]) == n, f"{path.name} at gamma {gamma}: {len(ours[1])} detections, upstream {n}"
        paired = _paired((ref.boxes, ref.scores, ref.classes), ours)
        assert paired >= MIN_PAIRED * n, f"{path.name} at gamma {gamma}: {paired} of {n} paired"


@pytest.mark.slow
@pytest.mark.parametrize("exported", cases_for("batch"), indirect=True)
def test_image_in_a_batch_equals_it_alone(exported):
    images, alone = exported.images, exported.alone(0.5)
    for i, j in ((0, 1), (2, 3)):
        assert images[i].shape != images[j].shape  # a different-size image beside it
        out = exported.run(0.5, [images[i], images[j]])
        for b, k in enumerate((i, j)):
            want, got = _detections(alone[k]), _detections(out, b)
            n = len(want[1])
            assert len(got[1]) == n and n >= exported.case.min_detections, (k, len(got[1]), n)
            assert _paired(want, got) >= MIN_PAIRED * n, f"image {k} in a batch of two"


@pytest.mark.slow
@pytest.mark.parametrize("exported", cases_for("infer"), indirect=True)
def test_norcal_infer_writes_the_graphs_detections(exported, tmp_path):
    """``norcal infer`` (batches of two) writes per image the scores and categories its graph
    gives the image alone (the boxes mapped back to the original image are the runtime's tests')."""
    from norcal.cli import main

    out = tmp_path / "results.json"
    assert main(["infer", str(exported.files[0.5]), *map(str, exported.ckpt.images), "-o", str(out),
                 "--batch", "2", "--provider", "cpu", "--threads", "2", "--no-masks", *exported.host_flags]) == 0
    results = json.loads(out.read_text())
    ids = contract.metadata_category_ids(exported.meta())
    by_image: dict = {}
    for r in results:
        assert len(r["bbox"]) == 4 and "segmentation" not in r
        by_image.setdefault(r["image_id"], []).append(r)
    assert sorted(by_image) == sorted(p.stem for p in exported.ckpt.images)
    for path, alone in zip(exported.ckpt.images, exported.alone(0.5)):
        _, scores, classes = _detections(alone)
        got = by_image[path.stem]
        assert len(got) == len(scores)
        np.testing.assert_allclose(sorted(r["score"] for r in got), np.sort(scores), atol=1e-5)
        assert Counter(r["category_id"] for r in got) == Counter(ids[c] for c in classes.tolist())


@pytest.mark.slow
@pytest.mark.parametrize("exported", cases_for("detector"), indirect=True)
@pytest.mark.parametrize("gamma", GAMMAS)
def test_metadata_carries_every_runtime_key(exported, gamma):
    """Both files (the checkpoint export, and its copy re-calibrated from ONNX) record what a
    runner needs, and the classifier where the family's Detector says it is."""
    meta, det = exported.meta(gamma), exported.detector
    missing = sorted(contract.RUNTIME_KEYS - contract.OPTIONAL_RUNTIME_KEYS - set(meta))
    assert not missing, f"runtime keys missing: {missing}"
    # how the host prepares images: exactly what the detector says
    assert {k: meta.get(k) for k in det.preprocessing.metadata()} == det.preprocessing.metadata()
    assert int(meta[contract.NUM_CLASSES]) == det.num_classes
    assert len(contract.metadata_category_ids(meta)) == det.num_classes
    names = contract.metadata_class_names(meta)  # optional; when written, one per class
    assert names is None or len(names) == det.num_classes
    cls = det.classifier
    assert contract.split_names(meta[contract.CLASSIFIER_LOGITS]) == list(cls.logits)
    assert meta.get(contract.CLASSIFIER_BACKGROUND, "last") == cls.background
    assert meta[contract.BACKGROUND] == cls.background
    assert meta[contract.ACTIVATION] == cls.activation
    assert contract.split_names(meta[contract.LOGITS]) == list(cls.logits)  # the node reads the classifier
    if cls.class_axis == -1:
        assert contract.CLASS_AXIS not in meta
    else:
        assert int(meta[contract.CLASS_AXIS]) == cls.class_axis


@pytest.mark.slow
@pytest.mark.parametrize("exported", cases_for("search"), indirect=True)
@pytest.mark.parametrize("gamma", GAMMAS)
def test_norcal_node_is_where_the_search_found_it(exported, gamma):
    """A graph of no known family: the NorCal keys name the one classifier the search finds in
    the source graph (a Softmax over C+1 logits on their last axis), the node replaces it in the
    written graph, and its log prior is the table's at the gamma asked for, background untouched
    in the slot the case gave (torchvision's first)."""
    from onnx import numpy_helper

    from classifier_lookup import find_classifiers

    meta, model = exported.meta(gamma), exported.results[gamma].model
    (found,) = find_classifiers(onnx.load(exported.ckpt.path))
    num_classes = len(contract.metadata_category_ids(meta))
    assert float(meta[contract.GAMMA]) == gamma
    assert contract.split_names(meta[contract.LOGITS]) == [found.logits]
    assert (meta[contract.NODE], meta[contract.OUTPUT]) == (found.node, found.output)
    assert found.op_type == meta[contract.ACTIVATION].capitalize() == "Softmax"
    assert found.width == int(found.shape[-1]) == num_classes + 1  # C+1 on the last axis
    assert found.axis in (None, len(found.shape) - 1)
    background = exported.case.norcal.get("background", "last")
    assert meta[contract.BACKGROUND] == background
    slot = 0 if background == "first" else num_classes
    assert int(meta[contract.BACKGROUND_INDEX]) == slot
    (node,) = [n for n in model.graph.node if found.output in n.output]  # what writes the scores now
    assert node.op_type == "NorCal" and list(node.input[:1]) == [found.logits]
    prior = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}[node.input[1]]
    counts = [c["image_count"] for c in json.loads(Path(exported.ckpt.table).read_text())["categories"]]
    want = np.insert(gamma * np.log(np.asarray(counts, np.float64)), slot, 0.0)  # NorCal divides by N_c^gamma
    np.testing.assert_allclose(prior, want, rtol=1e-6)
