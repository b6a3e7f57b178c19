"""The Ultralytics family's YOLO checkpoints: loading (model.save and trainer files, names),
safe loading (a pickled global is refused by name, nothing runs), other tasks and options refused
in one line, an end-to-end head's settings, and the CLI's export, verify, infer and check."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from yolo_models import IMAGES, IMGSZ, NUM_CLASSES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

import torch  # noqa: E402

from norcal.core import contract  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.export.families import FAMILIES, family_of, load_detector  # noqa: E402
from norcal.export.families.ultralytics.family import UltralyticsFamily  # noqa: E402

S = IMGSZ  # the test checkpoints' trained-at size: their exports' input


@pytest.fixture(scope="module")
def work(yolo_work):
    """The session's checkpoints and table (tests/conftest.py YoloWork)."""
    return yolo_work


# --- loading -------------------------------------------------------------------------------

def test_model_save_checkpoints_load_and_are_claimed(work, tmp_path):
    from ultralytics import YOLO

    v8 = tmp_path / "yolov8n.pt"
    YOLO("yolov8n.yaml").save(str(v8))  # 80 classes, as Ultralytics writes it
    assert any(isinstance(f, UltralyticsFamily) for f in FAMILIES)
    for path, task, nc, size in ((work.det, "detect", NUM_CLASSES, S), (v8, "detect", 80, 640)):
        assert isinstance(family_of(path), UltralyticsFamily)
        det = load_detector(path)
        assert (det.task, det.num_classes, det.has_masks) == (task, nc, task == "segment")
        assert det.classifier == load_detector(path).classifier
        assert det.classifier.background == "none" and det.classifier.activation == "sigmoid"
        # the size the model records (its args' imgsz), else the yaml default 640
        assert det.preprocessing.resize == "letterbox" and det.preprocessing.input_size == size
    # not ours: a plain state dict, a detectron2 pickle, a non-zip file
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "d2.pth")
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    fam = UltralyticsFamily()
    assert not fam.claims(tmp_path / "d2.pth", None) and not fam.claims(tmp_path / "junk.pt", None)
    assert not fam.claims(work.det, tmp_path / "config.yaml")


def test_loading_leaves_pil_image_open_alone(work):
    from PIL import Image

    load_detector(work.det)
    assert Image.open.__module__ == "PIL.Image"  # Ultralytics' import-time patches undone
    assert np.get_printoptions()["formatter"] is None and np.get_printoptions()["linewidth"] == 75


def test_trainer_checkpoint_loads(work, tmp_path):
    """last.pt / best.pt as the trainer writes them: model None, the EMA, train_args, numpy
    metrics, the optimizer state, the model's args as IterableSimpleNamespace."""
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG_DICT, IterableSimpleNamespace

    model = DetectionModel("yolo11n.yaml", nc=3, verbose=False)
    model.names = {0: "a", 1: "b", 2: "c"}
    model.args = IterableSimpleNamespace(**{**DEFAULT_CFG_DICT, "imgsz": 320})
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    path = tmp_path / "last.pt"
    torch.save({"epoch": 3, "best_fitness": np.float64(0.25), "model": None, "ema": model.half(), "updates": 7,
                "optimizer": opt.state_dict(), "train_args": {**DEFAULT_CFG_DICT, "imgsz": 320},
                "train_metrics": {"metrics/mAP50(B)": np.float64(0.1), "fitness": np.float32(0.2)},
                "train_results": {"epoch": [1.0, 2.0]}, "date": "2026-01-01", "version": "8.4.190",
                "git": {"root": None}, "license": "AGPL-3.0", "docs": "x"}, path)
    det = load_detector(path)
    assert det.num_classes == 3 and det.imgsz == 320 and det.names == ["a", "b", "c"]
    # the export records the model's names: runners check annotation categories against them
    assert json.loads(det.runtime_metadata()[contract.CLASS_NAMES]) == ["a", "b", "c"]


def test_yaml_placeholder_names_are_not_recorded(work):
    from ultralytics.nn.tasks import DetectionModel

    from norcal.export.families.ultralytics.yolo import YoloDetector

    model = DetectionModel("yolo11n.yaml", nc=2, verbose=False)
    assert model.names == {0: "0", 1: "1"}  # Ultralytics' placeholders: they name no category
    assert contract.CLASS_NAMES not in YoloDetector(model.eval(), "yolo11n.yaml").runtime_metadata()
    # yolo_models names the test checkpoints' classes class0, class1, ...
    assert json.loads(load_detector(work.det).runtime_metadata()[contract.CLASS_NAMES]) == [
        f"class{i}" for i in range(NUM_CLASSES)]


class _System:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["det", "rtdetr"])
@pytest.mark.parametrize("payload,global_name", [
    ("system", "posix.system"), ("eval", "builtins.eval"), ("optimizer", "torch.optim.sgd.SGD")])
def test_malicious_checkpoint_is_refused_naming_the_global(work, tmp_path, payload, global_name, kind):
    marker = tmp_path / "pwned"
    path = tmp_path / "best.pt"
    ckpt = torch.load(getattr(work, kind), weights_only=False)  # our own file: a real YOLO / RT-DETR checkpoint
    # the payload rides along the real model, so the file still looks like an Ultralytics one
    ckpt["train_args"] = {"system": _System(marker), "eval": eval, "optimizer": torch.optim.SGD}[payload]
    torch.save(ckpt, path)
    assert isinstance(family_of(path), UltralyticsFamily)  # it looks like one of Ultralytics' files
    with pytest.raises(NorcalError) as e:
        load_detector(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and f"'{global_name}'" in msg and "refused" in msg
    assert not marker.exists()


def test_plain_pickle_with_pt_suffix_is_not_loaded(tmp_path):
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(_System(tmp_path / "pwned")))
    assert not UltralyticsFamily().claims(path, None)  # no Ultralytics classes named: not its file
    with pytest.raises(NorcalError, match="evil.pt: refused to load"):
        load_detector(path)  # detectron2's safe loader takes what no other family claims; nothing unpickled
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("yaml, task", [("yolo11n-pose.yaml", "PoseModel"), ("yolo11n-obb.yaml", "OBBModel"),
                                        ("yolo11n-cls.yaml", "ClassificationModel")])
def test_other_ultralytics_tasks_are_refused_by_name(tmp_path, yaml, task):
    from ultralytics import YOLO

    f = tmp_path / "other.pt"
    YOLO(yaml).save(str(f))
    with pytest.raises(NorcalError) as e:
        load_detector(f)
    assert str(e.value) == (f"{f}: an Ultralytics {task}; only DetectionModel, SegmentationModel, "
                            "RTDETRDetectionModel checkpoints are exported")


def test_end_to_end_head_loads_as_its_one_to_one_branch(work):
    """A YOLO26 saved with its one-to-one head selected (Ultralytics then predicts without NMS)
    loads as that branch with a top-k, recorded in its settings; an NMS threshold is refused in
    one line naming the file; the same file with end2end False is the one-to-many NMS graph."""
    from ultralytics import YOLO

    e2e = work.y26e2e  # work.y26 with head.end2end = True
    assert YOLO(str(e2e)).model.model[-1].end2end  # as Ultralytics reads the file back
    det = load_detector(e2e)
    assert det.model.end2end and det.model.branch == "one2one"
    settings = det.settings()
    assert settings["selection"] == "one-to-one top-k" and "nms_thresh_test" not in settings
    assert not load_detector(work.y26).model.end2end and load_detector(work.y26).settings()["multi_label"]
    with pytest.raises(NorcalError) as e:
        load_detector(e2e, nms_thresh=0.5)
    assert str(e.value).startswith(f"{e2e}: an end-to-end YOLO head") and "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_export_verify_infer_check(work, tmp_path):
    from norcal.cli import export_main, main

    out = tmp_path / "best.norcal.onnx"
    best = tmp_path / "best.pt"
    best.write_bytes(work.det.read_bytes())
    # verify: the family's PyTorch runner against ONNX Runtime on the letterboxed images, fp32 tolerances
    assert export_main([str(best), "--gamma", "0.5", "--table", str(work.table), "--height", str(S),
                        "--width", str(S), "-o", str(out), "--verify", *map(str, IMAGES)]) == 0
    results = tmp_path / "results.json"
    assert main(["infer", str(out), *map(str, IMAGES), "-o", str(results)]) == 0
    rows = json.loads(results.read_text())
    assert rows and {r["category_id"] for r in rows} <= set(range(1, NUM_CLASSES + 1))
    assert main(["check", str(out)]) == 0
    # the C++ host's sidecar reader and a size override refuse a letterbox model in one line
    assert main(["infer", str(out), str(IMAGES[0]), "--min-size", "100", "-o", str(tmp_path / "r2.json")]) == 2


@pytest.mark.slow
def test_export_options_a_yolo_checkpoint_cannot_take(work, tmp_path):
    """Refused by the family in one line naming the parameter, before anything is written."""
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    out = tmp_path / "m.onnx"
    cases = [(CheckpointExport(mask_head_rois="static"), NorCal(gamma=0.5), "mask_head_rois does not apply to ultralytics"),
             (CheckpointExport(config=tmp_path / "c.yaml"), NorCal(gamma=0.5), "takes no config"),
             (CheckpointExport(), NorCal(gamma=None), "gamma is required (0 gives the plain sigmoid)"),
             (CheckpointExport(height=S, width=2 * S), NorCal(gamma=0.5), "square letterbox input")]
    (tmp_path / "c.yaml").write_text("MODEL: {}\n")
    for options, norcal, message in cases:
        with pytest.raises(NorcalError) as e:
            export_checkpoint(work.det, out, norcal, options)
        assert message in str(e.value) and "\n" not in str(e.value)
        assert not out.exists()
