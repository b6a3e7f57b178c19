"""The goldens script runs without detectron2 for --help and --compare (it imports detectron2
only where it runs the model), and --compare finds a planted difference."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).parent / "fixtures" / "make_goldens.py"


def _fixture(root: Path, scores: np.ndarray) -> Path:
    (root / "golden").mkdir(parents=True)
    np.savez_compressed(root / "golden" / "img0.npz", **{"baseline/scores": scores,
                                                        "baseline/classes": np.arange(3)})
    (root / "manifest.json").write_text(json.dumps({"settings": ["baseline"]}, indent=1))
    return root


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_help_runs_without_detectron2():
    out = _run("--help")
    assert out.returncode == 0 and "--compare" in out.stdout


def test_compare_reports_max_difference(tmp_path):
    old = _fixture(tmp_path / "old", np.array([0.5, 0.25, 0.125], np.float32))
    same = _fixture(tmp_path / "same", np.array([0.5, 0.25, 0.125], np.float32))
    moved = _fixture(tmp_path / "moved", np.array([0.5, 0.25, 0.375], np.float32))
    assert _run("--compare", str(same), str(old)).returncode == 0
    out = _run("--compare", str(moved), str(old))
    assert out.returncode == 1
    row = next(line.split() for line in out.stdout.splitlines() if "baseline/scores" in line)
    assert float(row[-1]) == 0.25


def _detections(root: Path, boxes, scores, classes) -> Path:
    (root / "golden").mkdir(parents=True)
    np.savez_compressed(root / "golden" / "img0.npz", **{
        "baseline/boxes": np.asarray(boxes, np.float32), "baseline/scores": np.asarray(scores, np.float32),
        "baseline/classes": np.asarray(classes, np.int64)})
    (root / "manifest.json").write_text(json.dumps({"settings": ["baseline"]}, indent=1))
    return root


def test_compare_sets_pairs_reordered_detections_by_class_and_iou(tmp_path):
    boxes = [[0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 40, 40]]
    old = _detections(tmp_path / "old", boxes, [0.5, 0.5, 0.25], [1, 2, 1])
    # the two tied detections swapped, one score moved by 2**-10, the third box moved off
    new = _detections(tmp_path / "new", [boxes[1], boxes[0], [30, 30, 50, 50]],
                      [0.5, 0.5 + 2 ** -10, 0.25], [2, 1, 1])
    out = _run("--compare", str(new), str(old), "--sets")
    assert out.returncode == 1  # position-wise the fields differ
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith("img0") and " baseline " in line
               and len(line.split()) == 6)
    assert row[1:4] == ["baseline", "3", "2"] and abs(float(row[4]) - 2 ** -10) < 1e-6 and float(row[5]) == 1.0
