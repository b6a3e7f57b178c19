"""Hostile input, second pass: numbers out of range, files built to exhaust the parsers (deep
nesting, YAML alias bombs), and messages that must name the cause. Each case is checked as in
test_hostile.py: exit 2, one line naming the file, field or flag, nothing written."""

import functools
import json

import pytest
from PIL import Image

from conftest import SYNTH
from norcal.cli import main
from test_hostile import (GT, PNG, RESULTS, SENTINEL, TABLE2, _digest, _json, _run, bad,  # noqa: F401
                          check_hostile_case, register_case, world)

DEEP = "[" * 100_000 + "]" * 100_000


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" detectron2 config: 9 aliases per level, 10**9 strings expanded."""
    text = 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    return text + f"MODEL: *a{levels - 1}\n"


CASES = {}
case = functools.partial(register_case, CASES)


# ---------------------------------------------------------------- files built to exhaust parsers
case("table-show-deep-json")(lambda w, t: (
    ["table", "show", str(bad(t, "json:" + DEEP, "tab.json"))], "tab.json: not valid JSON", []))
case("table-build-deep-json")(lambda w, t: (
    ["table", "build", str(bad(t, 'json:{"categories": ' + DEEP + "}", "ann.json")), "-o", str(t / "t.json")],
    "ann.json: not valid JSON", [t / "t.json"]))
case("table-build-yaml-bomb")(lambda w, t: (
    ["table", "build", str(bad(t, "json:" + _bomb(), "ann.json")), "-o", str(t / "t.json")],
    "ann.json: not valid JSON", [t / "t.json"]))
case("export-table-deep-json")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(bad(t, "json:" + DEEP, "tab.json")),
     "-o", str(t / "o.onnx")], "tab.json: not valid JSON", [t / "o.onnx"]))
case("eval-gt-deep-json")(lambda w, t: (
    ["eval", "--gt", str(bad(t, "json:" + DEEP, "g.json")), "--results", str(w / "results.json"),
     "--json", str(t / "m.json")], "g.json: not valid JSON", [t / "m.json"]))
case("eval-results-deep-json")(lambda w, t: (
    ["eval", "--gt", str(w / "gt.json"), "--results", str(bad(t, "json:" + DEEP, "r.json")),
     "--json", str(t / "m.json")], "r.json: not valid JSON", [t / "m.json"]))
case("infer-image-ids-deep-json")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--image-ids", str(bad(t, "json:" + DEEP, "ids.json")),
     "-o", str(t / "r.json")], "ids.json: not valid JSON", [t / "r.json"]))
case("export-config-yaml-bomb")(lambda w, t: (
    ["export", str(w / "model_final.pth"), "--config", str(bad(t, "json:" + _bomb(), "c.yaml")),
     "--gamma", "0.5", "-o", str(t / "o.onnx")], "c.yaml: not a detectron2 config: expands to more than",
    [t / "o.onnx"]))
case("export-config-deep-yaml")(lambda w, t: (
    ["export", str(w / "model_final.pth"), "--config", str(bad(t, "json:MODEL: " + DEEP, "c.yaml")),
     "--gamma", "0.5", "-o", str(t / "o.onnx")], "c.yaml: not a detectron2 config: nested too deeply",
    [t / "o.onnx"]))



# ---------------------------------------------------------------- numbers in range
def _thin(t):
    """A folder with one image that resizes to 0 pixels on its short side (10000x1)."""
    d = t / "thin"
    d.mkdir()
    Image.new("RGB", (10000, 1)).save(d / "thin.png")
    return d


THIN = "thin.png: cannot read the image (10000x1 pixels would resize to 512x0"
case("infer-image-resizes-to-nothing")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(_thin(t)), "-o", str(t / "r.json")], THIN, [t / "r.json"]))
case("quantize-image-resizes-to-nothing")(lambda w, t: (
    ["quantize", str(w / "tiny.onnx"), "--images", str(_thin(t)), "-o", str(t / "o.onnx")], THIN,
    [t / "o.onnx"]))
case("parity-image-resizes-to-nothing")(lambda w, t: (
    ["parity", str(w / "tiny.onnx"), str(_thin(t)), "--checkpoint", str(w / "model_final.pth"),
     "--config", str(w / "config.yaml"), "--json", str(t / "p.json")],
    "thin.png: cannot run this image: 10000x1 pixels would resize to 512x0", [t / "p.json"]))

case("tune-cache-huge")(lambda w, t: (
    ["tune", str(w / "model_final.pth"), "--config", str(w / "config.yaml"), "--gt", str(w / "gt.json"),
     "--images", str(w / "images"), "--max-cache-gb", "1e308", "--json", str(t / "s.json")],
    "--max-cache-gb must be a finite number > 0 and <= 1024, got 1e+308", [t / "s.json"]))
case("export-detections-per-image-huge")(lambda w, t: (
    ["export", str(w / "model_final.pth"), "--config", str(w / "config.yaml"), "--gamma", "0.5",
     "--detections-per-image", "100000", "-o", str(t / "o.onnx")],
    "--detections-per-image must be a whole number >= 1 and <= 3839", [t / "o.onnx"]))
case("infer-threads-huge")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--threads", "100000000", "-o", str(t / "r.json")],
    "--threads must be a whole number >= 0 and <= 1024, got 100000000", [t / "r.json"]))
case("build-workspace-huge")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "--workspace", "1e308", "-o", str(t / "e.engine")],
    "--workspace must be a finite number >= 0 and <= 4096", [t / "e.engine", t / "e.engine.json"]))
case("build-int8-workspace-huge")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--int8", "--trtexec-only", "--workspace", "1e308", "-o", str(t / "e.engine")],
    "--workspace must be", [t / "e.engine", t / "e.engine.json"]))
case("simulate-bias-huge")(lambda w, t: (
    ["simulate", "--images", "2", "--train-images", "2", "--bias", "1e308", "--json", str(t / "sim.json")],
    "--bias must be a finite number >= -100 and <= 100", [t / "sim.json"]))
case("simulate-images-huge")(lambda w, t: (
    ["simulate", "--images", "100000000000", "--train-images", "2", "--json", str(t / "sim.json")],
    "--images must be a whole number >= 1 and <= 1e+06", [t / "sim.json"]))
BIG_BOX = "[1e308, 10, 1e308, 50]"
case("eval-gt-box-huge")(lambda w, t: (
    ["eval", "--gt", str(bad(t, "json:" + json.dumps(GT).replace("[10, 10, 50, 50]", BIG_BOX), "g.json")),
     "--results", str(w / "results.json"), "--json", str(t / "m.json")],
    "g.json: annotations[0] (id 1): bbox[0]: must be <= 16777216, got 1e+308", [t / "m.json"]))
case("eval-results-box-huge")(lambda w, t: (
    ["eval", "--gt", str(w / "gt.json"), "--results",
     str(bad(t, "json:" + json.dumps(RESULTS).replace("[10, 10, 50, 50]", BIG_BOX), "r.json")),
     "--json", str(t / "m.json")], "r.json: [0]: bbox[0]: must be <= 16777216, got 1e+308", [t / "m.json"]))
case("eval-gt-height-huge")(lambda w, t: (
    ["eval", "--gt", str(bad(t, "json:" + json.dumps(GT).replace('"height": 240', '"height": 10000000000'),
                             "g.json")), "--results", str(w / "results.json"), "--json", str(t / "m.json")],
    "images[0] (id 1): height: must be <= 1048576", [t / "m.json"]))
for v, msg in (("-1", "--min-count must be a finite number > 0, got -1"),
               ("2.5x", "argument --min-count: expected a number, got '2.5x'"),
               ("1e9", "--min-count 1e+09 is above every training count (the largest is 5)")):
    case(f"export-min-count-{v}")(lambda w, t, v=v, msg=msg: (
        ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"), "--min-count", v,
         "-o", str(t / "o.onnx")], msg, [t / "o.onnx"]))

# ---------------------------------------------------------------- quantize's images
case("quantize-images-non-image-file")(lambda w, t: (
    (t / "imgs").mkdir(), (t / "imgs" / "notes.png").write_text("not an image"),
    ["quantize", str(w / "tiny.onnx"), "--images", str(t / "imgs"), "-o", str(t / "o.onnx")],
    "notes.png: cannot read the image", [t / "o.onnx"])[2:])
case("quantize-images-only-other-files")(lambda w, t: (
    (t / "imgs").mkdir(), (t / "imgs" / "readme.txt").write_text("x"),
    ["quantize", str(w / "tiny.onnx"), "--images", str(t / "imgs"), "-o", str(t / "o.onnx")],
    "no image files in it", [t / "o.onnx"])[2:])
case("quantize-images-is-a-file")(lambda w, t: (
    ["quantize", str(w / "tiny.onnx"), "--images", str(w / "images" / "img0.png"), "-o", str(t / "o.onnx")],
    "--images", [t / "o.onnx"]))

# ---------------------------------------------------------------- Ray options (refused before Ray starts)
case("infer-ray-workers-huge")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--ray", "--num-workers", "100000", "-o", str(t / "r.json")],
    "--num-workers must be a whole number >= 1 and <= 4096", [t / "r.json"]))
case("tune-ray-retries-huge")(lambda w, t: (
    ["tune", str(w / "model_final.pth"), "--config", str(w / "config.yaml"), "--gt", str(w / "gt.json"),
     "--images", str(w / "images"), "--ray", "--max-retries", "1000", "--json", str(t / "s.json")],
    "--max-retries must be a whole number >= 0 and <= 100", [t / "s.json"]))
case("infer-ray-address-bad")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--ray-address", "head-node", "-o", str(t / "r.json")],
    "--ray-address 'head-node': expected HOST:PORT", [t / "r.json"]))

# ---------------------------------------------------------------- messages that name the cause
NOT_DETECTOR = "cls.onnx: not a norcal detector graph: it has no inputs images, image_sizes (it takes x)"
case("infer-not-a-detector")(lambda w, t: (
    ["infer", str(w / "cls.onnx"), str(w / "images"), "-o", str(t / "r.json")], NOT_DETECTOR, [t / "r.json"]))
case("parity-not-a-detector")(lambda w, t: (
    ["parity", str(w / "cls.onnx"), str(w / "images"), "--checkpoint", str(w / "model_final.pth"),
     "--json", str(t / "p.json")], NOT_DETECTOR, [t / "p.json"]))
case("parity-other-checkpoint")(lambda w, t: (
    ["parity", str(w / "tiny.onnx"), str(w / "images"), "--checkpoint", str(SYNTH / "model_final.pth"),
     "--config", str(SYNTH / "config.yaml"), "--json", str(t / "p.json")],
    "model_final.pth has 60 classes but tiny.onnx has 1203", [t / "p.json"]))
case("export-count-instance-without-instance-counts")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"), "--count", "instance",
     "-o", str(t / "o.onnx")], "table 'two' has no instance counts (no category has instance_count): "
                               "use --count image", [t / "o.onnx"]))

@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input_is_one_line_and_writes_nothing(name, world, tmp_path, capsys, monkeypatch):
    line = check_hostile_case(CASES[name], world, tmp_path, capsys, monkeypatch)
    assert len(line) < 300, line  # echoed values are cut short


def test_echoed_config_value_is_cut_short(tmp_path):
    """A config value an error quotes is cut to a few dozen characters, never built whole."""
    from norcal.core.errors import NorcalError
    from norcal.export.families.detectron2.yacs_config.file import load_yaml_with_base

    (tmp_path / "base.yaml").write_text("MODEL: [" + ", ".join(["'" + "x" * 1000 + "'"] * 50) + "]\n")
    (tmp_path / "c.yaml").write_text("_BASE_: base.yaml\nMODEL:\n  META_ARCHITECTURE: GeneralizedRCNN\n")
    with pytest.raises(NorcalError) as e:
        load_yaml_with_base(tmp_path / "c.yaml")
    assert "MODEL" in str(e.value) and len(str(e.value)) < 250, str(e.value)


def test_shown_cuts_without_building_the_whole_value():
    from norcal.core.errors import shown

    value = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9  # 9**9 strings: a full repr would be gigabytes
    assert len(shown(value)) <= 63 and shown(value).startswith("[[[")
    assert shown("abc") == "'abc'" and shown(1.5) == "1.5"
    assert shown("x" * 500).startswith("'xxx") and "..." in shown("x" * 500) and len(shown("x" * 500)) <= 63
