"""The three walks of docs/architecture.md ("Three walks") are the routes the product takes: each
list there equals the modules traced (:mod:`walk_trace`) while the real CLI runs on the bundled
example, in order, and no module that passes the fact on is entered from two modules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import SYNTH
from walk_trace import ROOT, walk

from norcal.cli import main
from norcal.core.calibration.spec import Calibration, ResolvedCalibration

DOC = ROOT / "docs" / "architecture.md"
MODEL, CONFIG, TABLE = SYNTH / "model_final.pth", SYNTH / "config.yaml", SYNTH / "train_annotations.json"
IMAGES = sorted(p for p in (SYNTH / "val").rglob("*") if p.suffix.lower() in (".jpg", ".png"))[:2]
# the one callback a walk makes on purpose: the CLI's output check, run once the images are known
HOOKS = {("norcal/cli/commands/infer.py", "outputs")}


def documented_walks(text: str) -> dict[str, list[str]]:
    """{walk title: [module, ...]} from the numbered lists under "## Three walks"."""
    section = text.split("\n## Three walks\n", 1)[1].split("\n## ", 1)[0]
    walks = {}
    for block in section.split("\n### ")[1:]:
        title = block.split(":", 1)[0].strip()
        walks[title] = re.findall(r"^\d+\. `([^`]+)`", block, flags=re.M)
    return walks


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """The export and infer command lines of the walks, each run once before it is traced (so
    imports and first-use drawing of the example are not on the routes)."""
    tmp = tmp_path_factory.mktemp("walks")
    export = ["export", str(MODEL), "--config", str(CONFIG), "--gamma", "0.6", "--table", str(TABLE),
              "-o", str(tmp / "m.onnx")]
    infer = ["infer", str(tmp / "m.onnx"), *map(str, IMAGES), "-o", str(tmp / "results.json")]
    assert len(IMAGES) == 2 and main(export) == 0 and main(infer) == 0
    return export, infer


def _traced(commands, title):
    export, infer = commands
    if title == "File to its family":
        with walk(("norcal/cli/commands/export.py", "run"), ("export/families/__init__.py", "load"),
                  values=[MODEL]) as route:
            assert main(export) == 0
    elif title == "Gamma to the node":
        with walk(("norcal/cli/commands/export.py", "run"), types=(Calibration, ResolvedCalibration)) as route:
            assert main(export) == 0
    else:
        with walk(("norcal/cli/commands/infer.py", "run"), values=IMAGES, follows_results=True) as route:
            assert main(infer) == 0
    return route


def test_the_architecture_doc_has_the_three_walks():
    assert list(documented_walks(DOC.read_text())) == [
        "File to its family", "Gamma to the node", "Image to the results file"]


@pytest.mark.parametrize("title", ["File to its family", "Gamma to the node", "Image to the results file"])
def test_each_documented_walk_is_the_traced_route(commands, title):
    route = _traced(commands, title)
    documented = documented_walks(DOC.read_text())[title]
    assert route.modules == documented
    assert len(set(documented)) == len(documented)
    assert route.revisited(HOOKS) == {}
    assert all((ROOT / m).is_file() for m in documented)


def test_the_walks_are_short(commands):
    """Sizes measured 2026-12-06: 17, 8 and 16 modules; a walk that grows is a new detour."""
    walks = documented_walks(DOC.read_text())
    assert {t: len(m) for t, m in walks.items()} == {
        "File to its family": 17, "Gamma to the node": 8, "Image to the results file": 16}


def test_a_second_dispatch_is_seen_as_a_revisit(commands, monkeypatch):
    """The old double dispatch (the family's load asking the registry for the family again) is
    caught: the registry, which passes the path on, is then entered from two modules."""
    from norcal.export.families import family_of
    from norcal.export.families.detectron2 import loader

    load_model = loader.load_model

    def load_model_after_asking_again(path, config=None, **options):  # called by the family's load
        assert family_of(path, config).name == "detectron2"
        return load_model(path, config, **options)

    monkeypatch.setattr(loader, "load_model", load_model_after_asking_again)
    route = _traced(commands, "File to its family")
    assert route.revisited(HOOKS) == {
        "export/families/__init__.py": ["export/families/detectron2/family.py", "norcal/workflows/export_job.py"]}


def test_a_detour_is_a_route_that_differs_from_the_doc(commands, monkeypatch):
    """Detections handed through one more module on their way to the file (here the picture
    module's selection) make the traced route differ from the documented one."""
    from norcal.runtime import draw, results

    fragment = results.results_fragment

    def fragment_after_drawing(image_id, det, *args, **kwargs):
        draw.shown_indices(det, draw.DrawOptions())
        return fragment(image_id, det, *args, **kwargs)

    monkeypatch.setattr(results, "results_fragment", fragment_after_drawing)
    route = _traced(commands, "Image to the results file")
    documented = documented_walks(DOC.read_text())["Image to the results file"]
    assert route.modules != documented and set(route.modules) - set(documented) == {"runtime/draw.py"}
