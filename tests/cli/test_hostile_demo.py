"""``norcal demo --data D`` checks its inputs before its long work: a validation GT whose masks
are missing (segm and boundary AP need them) was found only after both tuning sweeps."""

from __future__ import annotations

import json

import pytest

from conftest import SYNTH
from norcal.cli import main

LINKED = ("model_final.pth", "config.yaml", "train_annotations.json", "val", "train_subset.json", "train_subset")


@pytest.mark.parametrize("drop", ["all", "one"])
def test_demo_refuses_a_gt_without_masks_before_tuning(tmp_path, capsys, monkeypatch, drop):
    data = tmp_path / "data"
    data.mkdir()
    for name in LINKED:
        (data / name).symlink_to(SYNTH / name)
    gt = json.loads((SYNTH / "val.json").read_text())
    for a in gt["annotations"] if drop == "all" else gt["annotations"][5:6]:
        del a["segmentation"]
    (data / "val.json").write_text(json.dumps(gt))
    index = 0 if drop == "all" else 5

    import norcal.workflows.tune

    def tuned(*args, **kwargs):
        raise AssertionError("tuned before the GT's masks were checked")

    monkeypatch.setattr(norcal.workflows.tune, "tune", tuned)
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "out"
    assert main(["demo", "--data", str(data), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    ann = gt["annotations"][index]
    assert err.splitlines()[-1] == (f"error: {data / 'val.json'}: annotations[{index}] (id {ann['id']}): segmentation: "
                                    "missing (segm evaluation needs every GT mask)")
    assert not out.exists()
