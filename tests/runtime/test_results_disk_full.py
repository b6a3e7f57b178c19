"""A full disk while a results or metrics file is written: one line naming the file, and the
file that was there kept."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

import pytest

from norcal.cli import main
from test_infer import build_contract_model, write_images

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from test_coco_rules import _two_boxes  # noqa: E402

OLD = b"[]\n"  # what the output held before the run


class FullDisk:
    """A text file whose writes fail as on a full disk (the OS's error names no file)."""

    def __init__(self, *args, **kwargs):
        pass

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_infer_on_a_full_disk_names_the_results_file(tmp_path, capsys, monkeypatch):
    import norcal.runtime.results as results

    model = build_contract_model(tmp_path / "toy.onnx")
    write_images(tmp_path / "imgs")
    out = tmp_path / "existing.json"
    out.write_bytes(OLD)
    monkeypatch.setattr(results, "open", FullDisk, raising=False)
    (tmp_path / "imgs" / "broken.jpg").unlink()
    assert main(["infer", str(model), str(tmp_path / "imgs"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"error: cannot write {out}: No space left on device"
    assert [line for line in err if "error" in line] == err[-1:]
    assert out.read_bytes() == OLD and sorted(p.name for p in tmp_path.iterdir()) == ["existing.json", "imgs",
                                                                                      "toy.onnx"]


def test_eval_json_on_a_full_disk_names_the_metrics_file(tmp_path, capsys, monkeypatch):
    gt, res = _two_boxes(federated=False)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(res))
    out = tmp_path / "m.json"
    out.write_bytes(OLD)
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(".m.json."):  # the staged metrics file
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    assert main(["eval", "--gt", str(tmp_path / "gt.json"), "--results", str(tmp_path / "res.json"),
                 "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot write {out}: No space left on device\n"
    assert out.read_bytes() == OLD and sorted(p.name for p in tmp_path.iterdir()) == ["gt.json", "m.json", "res.json"]
