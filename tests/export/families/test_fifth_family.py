"""A fifth family added the way docs/architecture.md says: its own package, one line in the
registry, and its case in the conformance suite (pyproject's package list is the one more file,
for packaging only). In a copy of the source with only the first two edits, the CLI lists it,
dispatches its file to it, exports it with the NorCal node, and `norcal infer` runs the export,
its score the paper's formula by hand; with its case appended to a copy of tests/family_cases.py,
the conformance suite runs it through every check that applies and passes."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).parents[3]
TOY = Path(__file__).parents[2] / "fifth_family" / "family.py"
TOY_CASE = TOY.with_name("case.py")
TESTS = Path(__file__).parents[2]
WEIGHT = [[2.0, -1.0, 0.5], [0.3, 1.2, -0.4], [-0.5, 0.2, 1.5], [1.0, 1.0, 1.0], [0.0, 0.5, 0.5]]  # 4 classes + bg
BIAS = [0.1, 0.2, -0.3, 0.0, 0.4]
COUNTS = [500, 50, 5, 1]  # image counts of the table's classes: the plain best is the most frequent
GAMMA = 0.7


def _source_copy(dst: Path) -> Path:
    """The import package as installed (norcal with export, runtime, tables inside), copied."""
    skip = shutil.ignore_patterns("__pycache__", "build", "*.pth", "*.npz")
    shutil.copytree(ROOT / "norcal", dst / "norcal", ignore=skip)
    for folder in ("export", "runtime", "calibration_tables"):
        shutil.copytree(ROOT / folder, dst / "norcal" / folder, ignore=skip)
    return dst / "norcal"


def _add_toy_family(pkg: Path) -> list[str]:
    """The two edits; returns the files they touched (relative to the package)."""
    toy = pkg / "export" / "families" / "toy"
    toy.mkdir()
    (toy / "__init__.py").write_text("from .family import ToyFamily\n")
    shutil.copy(TOY, toy / "family.py")
    registry = pkg / "export" / "families" / "__init__.py"
    text = registry.read_text()
    anchor = "from norcal.export.families.ultralytics import UltralyticsFamily\n"
    assert anchor in text and text.count("ForeignFamily()]") == 1
    text = text.replace(anchor, anchor + "from norcal.export.families.toy import ToyFamily\n")
    registry.write_text(text.replace("ForeignFamily()]", "ToyFamily(), ForeignFamily()]"))
    return ["export/families/__init__.py", "export/families/toy/__init__.py", "export/families/toy/family.py"]


SCRIPT = r"""
import sys
from pathlib import Path
import norcal
assert norcal.__file__.startswith(sys.argv[1]), norcal.__file__
from norcal.cli import main
from norcal.core.calibration.tables import CalibrationTable
work = Path(sys.argv[2])
counts, gamma = [int(c) for c in sys.argv[3].split(",")], sys.argv[4]
CalibrationTable("toy_table", "test", "image", [
    {"id": 10 + i, "name": f"c{i}", "image_count": n, "instance_count": n} for i, n in enumerate(counts)]
).save(work / "table.json")
print("HELP-START")
main(["export", "--help"])
print("HELP-END")
rc = main(["export", str(work / "m.toy"), "--gamma", gamma, "--table", str(work / "table.json"),
           "-o", str(work / "m.norcal.onnx")])
assert rc == 0, rc
rc = main(["infer", str(work / "m.norcal.onnx"), str(work / "img.png"), "-o", str(work / "results.json")])
assert rc == 0, rc
"""


def test_a_fifth_family_needs_its_package_and_one_registry_line(tmp_path):
    pkg = _source_copy(tmp_path / "src")
    touched = _add_toy_family(pkg)
    changed = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")
                     if not (_original(p.relative_to(pkg)).is_file()
                             and _original(p.relative_to(pkg)).read_bytes() == p.read_bytes()))
    assert changed == sorted(touched)
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.toy").write_text(json.dumps({"weight": WEIGHT, "bias": BIAS}))
    rgb = np.zeros((40, 56, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, 30, 90
    Image.fromarray(rgb).save(work / "img.png")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(pkg), str(work), ",".join(map(str, COUNTS)), str(GAMMA)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    help_text = " ".join(proc.stdout.split("HELP-START")[1].split("HELP-END")[0].split())
    assert "toy: toy .toy files" in help_text, help_text
    (det,) = json.loads((work / "results.json").read_text())
    # by hand: logits over the mean colour / 255; NorCal (CDT, exp, renormalised): foreground
    # logits minus gamma * log(N_c), the background's left alone, softmax over all five
    phi = np.array(WEIGHT) @ (np.array([200, 30, 90]) / 255.0) + np.array(BIAS)
    phi[:4] -= GAMMA * np.log(COUNTS)
    p = np.exp(phi - phi.max()) / np.exp(phi - phi.max()).sum()
    best = int(np.argmax(p[:4]))
    assert det["category_id"] == 10 + best and np.allclose(det["bbox"], [0, 0, 56, 40], atol=1e-3), det
    assert math.isclose(det["score"], p[best], rel_tol=1e-5), (det["score"], p[best])
    plain = np.array(WEIGHT) @ (np.array([200, 30, 90]) / 255.0) + np.array(BIAS)
    assert int(np.argmax(plain[:4])) != best  # NorCal changed the answer: the test sees the node


def _original(rel: Path) -> Path:
    top = rel.parts[0]
    if top in ("export", "runtime", "calibration_tables"):
        return ROOT / rel
    return ROOT / "norcal" / rel


def test_a_fifth_family_joins_the_conformance_suite_with_its_case(tmp_path):
    """The conformance suite (copied as it is) over the copy with the toy family: the registry
    check sees its case, and export, norcal check, the hand reference at both gammas, batch ==
    alone, norcal infer and the metadata checks pass for it."""
    pkg = _source_copy(tmp_path / "src")
    _add_toy_family(pkg)
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(TESTS / "export" / "families" / "test_conformance.py", tests)
    cases = (TESTS / "family_cases.py").read_text() + "\n\n" + TOY_CASE.read_text()  # the third edit
    (tests / "family_cases.py").write_text(cases)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "src"), str(tests)])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-k", "toy or every_family_has_a_case", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                           str(tests / "test_conformance.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = {line.split("::")[1].split(" ")[0] for line in proc.stdout.splitlines() if line.endswith("%]")
              and " PASSED" in line}
    # every check but the graph search (a checkpoint export's classifier is its Detector's)
    want = {"test_every_family_has_a_case", "test_every_check_left_out_says_why[toy]",
            "test_export_passes_norcal_check[toy]", "test_matches_upstream_with_norcal_by_hand[toy-0.0]",
            "test_matches_upstream_with_norcal_by_hand[toy-0.5]", "test_image_in_a_batch_equals_it_alone[toy]",
            "test_norcal_infer_writes_the_graphs_detections[toy]", "test_metadata_carries_every_runtime_key[0.0-toy]",
            "test_metadata_carries_every_runtime_key[0.5-toy]"}
    assert passed == want, proc.stdout[-4000:]
