"""norcal demo checks every file it reads before the long work (tuning, export, inference)."""

import json

from conftest import SYNTH
from norcal.cli import main


def test_bad_validation_gt_is_refused_before_tuning(tmp_path, capsys, monkeypatch):
    from norcal.workflows import tune

    data = tmp_path / "data"
    data.mkdir()
    for f in SYNTH.iterdir():
        if f.name != "val.json":
            (data / f.name).symlink_to(f.resolve())
    gt = json.loads((SYNTH / "val.json").read_text())
    gt["annotations"][0]["category_id"] = 10 ** 6  # no such category
    (data / "val.json").write_text(json.dumps(gt))

    def long_work(*args, **kwargs):
        raise AssertionError("the long work started before the GT was checked")

    monkeypatch.setattr(tune, "tune", long_work)
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "out"
    assert main(["demo", "--data", str(data), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "val.json" in err and "category_id" in err, err
    assert not out.exists()
