"""`norcal eval --rules` and `--score-thresh`: the first line, the refusal, the JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from test_coco_rules import _two_boxes  # noqa: E402


def _files(tmp_path, federated):
    gt, res = _two_boxes(federated)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(res))
    return str(tmp_path / "gt.json"), str(tmp_path / "res.json")


def test_eval_says_the_rules_first_and_writes_them(tmp_path, capsys):
    from norcal.cli import main

    gt, res = _files(tmp_path, federated=False)
    out_json = tmp_path / "m.json"
    assert main(["eval", "--gt", gt, "--results", res, "--score-thresh", "0.5", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"rules: COCO (exhaustive labels: {gt} has no neg_category_ids or "
                      "not_exhaustive_category_ids)")
    assert any("AR@100" in line for line in out) and not any("APr" in line for line in out)
    assert any(line.startswith("deployment at score >= 0.5 (IoU >= 0.5)") for line in out)
    doc = json.loads(out_json.read_text())
    assert doc["rules"] == "coco" and doc["stats"]["AP"] == 0.75  # pycocotools: 0.750
    assert doc["deployment"]["groups"]["all"] == {"tp": 2, "fp": 1, "num_gt": 2,
                                                  "precision": 2 / 3, "recall": 1.0}


def test_eval_refuses_lvis_rules_without_federated_lists(tmp_path, capsys):
    from norcal.cli import main

    gt, res = _files(tmp_path, federated=False)
    out_json = tmp_path / "m.json"
    assert main(["eval", "--gt", gt, "--results", res, "--rules", "lvis", "--json", str(out_json)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --rules lvis: {gt} has no neg_category_ids") and err.count("\n") == 1
    assert "use --rules coco" in err and not out_json.exists()


def test_eval_with_federated_lists_applies_lvis_rules(tmp_path, capsys):
    from norcal.cli import main

    gt, res = _files(tmp_path, federated=True)
    out_json = tmp_path / "m.json"
    assert main(["eval", "--gt", gt, "--results", res, "--no-fixed", "--json", str(out_json)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"rules: LVIS federated ({gt}'s images carry neg_category_ids)"
    assert json.loads(out_json.read_text())["stats"]["AP"] == 1.0
