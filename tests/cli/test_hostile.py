"""Hostile input to every command (demo aside): exit 2, one line, nothing written.

Each case builds its bad input in the test's folder, puts a sentinel file at every output
location that can hold one, runs the command in-process and checks: exit status 2, exactly
one line on stderr naming the offending file, field or flag, no traceback, and every file of
the test's folder and of the shared inputs byte-identical afterwards (and no new file).
"""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import TINY
from norcal.cli import export_main, main
from onnx_graphs import classifier_graph

SENTINEL = b"an earlier run's output: must survive\n"

TABLE2 = {"name": "two", "count_type": "image", "categories": [
    {"id": 1, "name": "a", "image_count": 5, "frequency": "f"},
    {"id": 2, "name": "b", "image_count": 1, "frequency": "r"}]}
GT = {"images": [{"id": 1, "file_name": "img0.png", "height": 240, "width": 320,
                  "neg_category_ids": [], "not_exhaustive_category_ids": []}],
      "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 50, 50], "area": 2500}],
      "categories": [{"id": 1, "name": "a", "frequency": "f", "image_count": 5},
                     {"id": 2, "name": "b", "frequency": "r", "image_count": 1}]}
RESULTS = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 50, 50], "score": 0.9},
           {"image_id": 1, "category_id": 2, "bbox": [100, 100, 30, 30], "score": 0.4}]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Valid inputs, shared read-only by every case: the tiny checkpoint exported once."""
    d = tmp_path_factory.mktemp("world")
    shutil.copy(TINY / "model_final.pth", d / "model_final.pth")
    shutil.copy(TINY / "config.yaml", d / "config.yaml")
    (d / "images").mkdir()
    shutil.copy(TINY / "images" / "img0.png", d / "images" / "img0.png")
    assert main(["export", str(d / "model_final.pth"), "--config", str(d / "config.yaml"),
                 "--gamma", "0.5", "-o", str(d / "tiny.onnx")]) == 0
    onnx.save(classifier_graph(num_classes=2), str(d / "cls.onnx"))
    (d / "two.json").write_text(json.dumps(TABLE2))
    (d / "gt.json").write_text(json.dumps(GT))
    (d / "results.json").write_text(json.dumps(RESULTS))
    return d


def _digest(dirs) -> dict:
    """Every file and folder under ``dirs``: content hash, or for the large shared models
    (hashed twice per case they would dominate the run) size, mtime and inode, which any
    write or replacement changes."""
    out = {}
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            if p.is_dir():
                out[str(p)] = "dir"
            elif p.stat().st_size > 1 << 20:
                st = p.stat()
                out[str(p)] = (st.st_size, st.st_mtime_ns, st.st_ino)
            else:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def bad(t: Path, kind: str, name: str, valid: bytes = b'{"a": 1}') -> Path:
    """A file ``name`` in ``t`` that is missing, empty, truncated, random bytes or of the wrong
    JSON type / value (``kind`` "json:<text>")."""
    p = t / name
    if kind == "missing":
        return p
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "truncated":
        p.write_bytes(valid[: len(valid) // 2])
    elif kind == "random":
        p.write_bytes(np.random.default_rng(0).bytes(512))
    elif kind.startswith("json:"):
        p.write_text(kind[5:])
    else:
        raise ValueError(kind)
    return p


FILE_KINDS = ("missing", "empty", "truncated", "random")
PNG = (TINY / "images" / "img0.png").read_bytes()


def _pth():
    return (TINY / "model_final.pth").read_bytes()


def _json(obj) -> bytes:
    return json.dumps(obj).encode()


# every case: (world, tmp) -> (argv, text the one error line must hold, outputs to guard)
CASES = {}


def register_case(cases: dict, name: str):
    """A decorator that files a case builder under ``name`` in ``cases``."""
    def register(fn):
        cases[name] = fn
        return fn
    return register


def case(name):
    return register_case(CASES, name)


def _imgs(t, kind):
    d = t / "imgs"
    d.mkdir()
    bad(d, kind, "x.png", PNG)
    return d


# ---------------------------------------------------------------- export / norcal-export
for k in FILE_KINDS:
    case(f"export-checkpoint-{k}")(lambda w, t, k=k: (
        ["export", str(bad(t, k, "m.pth", _pth() if k == "truncated" else b"")), "--gamma", "0.5",
         "-o", str(t / "o.onnx")], "m.pth", [t / "o.onnx"]))
    case(f"export-onnx-{k}")(lambda w, t, k=k: (
        ["export", str(bad(t, k, "m.onnx", (w / "cls.onnx").read_bytes())), "--gamma", "0.5",
         "--table", str(w / "two.json"), "-o", str(t / "o.onnx")], "m.onnx", [t / "o.onnx"]))
    case(f"export-table-{k}")(lambda w, t, k=k: (
        ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table",
         str(bad(t, k, "tab.json", _json(TABLE2))), "-o", str(t / "o.onnx")], "tab.json", [t / "o.onnx"]))
    case(f"norcal-export-{k}")(lambda w, t, k=k: (
        ["norcal-export", str(bad(t, k, "m.onnx", (w / "cls.onnx").read_bytes())), "--gamma", "0.5",
         "--table", str(w / "two.json"), "-o", str(t / "o.onnx")], "m.onnx", [t / "o.onnx"]))
    if k != "truncated":  # half a YAML file can still be valid YAML
        case(f"export-config-{k}")(lambda w, t, k=k: (
            ["export", str(w / "model_final.pth"), "--config", str(bad(t, k, "c.yaml")), "--gamma", "0.5",
             "-o", str(t / "o.onnx")], "c.yaml", [t / "o.onnx"]))
case("export-table-wrong-type")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table",
     str(bad(t, 'json:{"name": "x", "categories": [{"id": "1", "name": "a", "image_count": 5}]}', "tab.json")),
     "-o", str(t / "o.onnx")], "id", [t / "o.onnx"]))
case("export-table-nan")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table",
     str(bad(t, 'json:{"name": "x", "categories": [{"id": 1, "name": "a", "image_count": NaN}]}', "tab.json")),
     "-o", str(t / "o.onnx")], "image_count", [t / "o.onnx"]))
case("export-table-class-count")(lambda w, t: (
    ["export", str(w / "model_final.pth"), "--config", str(w / "config.yaml"), "--gamma", "0.5",
     "--table", str(w / "two.json"), "-o", str(t / "o.onnx")], "has 2 classes but the model has 1203",
    [t / "o.onnx"]))
case("export-verify-corrupt-image")(lambda w, t: (
    ["export", str(w / "model_final.pth"), "--classifier", "softmax", "--gamma", "0.5", "--verify", str(_imgs(t, "truncated")),
     "-o", str(t / "o.onnx")], "x.png", [t / "o.onnx"]))
case("export-o-is-input")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"),
     "-o", str(w / "cls.onnx")], "-o", []))
case("export-o-is-table")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"),
     "-o", str(w / "two.json")], "-o", []))
case("export-o-folder")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"),
     "-o", str(t)], "is a folder", []))
case("export-o-parent-file")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"),
     "-o", str(t / "f" / "o.onnx")], "is a file", [t / "f"]))
case("export-o-proc")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"),
     "-o", "/proc/norcal-hostile/o.onnx"], "/proc", []))
case("export-triton-repo-file")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"),
     "-o", str(t / "o.onnx"), "--triton-repo", str(t / "repo")], "repo", [t / "o.onnx", t / "repo"]))
for v in ("nan", "inf", "-1"):
    case(f"export-gamma-{v}")(lambda w, t, v=v: (
        ["export", str(w / "cls.onnx"), "--gamma", v, "--table", str(w / "two.json"),
         "-o", str(t / "o.onnx")], "gamma", [t / "o.onnx"]))
case("export-background-scale-inf")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--background-scale", "inf",
     "--table", str(w / "two.json"), "-o", str(t / "o.onnx")], "--background-scale", [t / "o.onnx"]))
case("export-batch-negative")(lambda w, t: (
    ["export", str(w / "model_final.pth"), "--classifier", "softmax", "--gamma", "0.5", "--batch", "-2", "-o", str(t / "o.onnx")],
    "--batch", [t / "o.onnx"]))

# ---------------------------------------------------------------- check
for k in FILE_KINDS:
    case(f"check-model-{k}")(lambda w, t, k=k: (
        ["check", str(bad(t, k, "m.onnx", (w / "cls.onnx").read_bytes()))], "m.onnx", []))
case("check-profile-rank")(lambda w, t: (
    ["check", str(w / "tiny.onnx"), "--profile", "images:1x3:1x3:1x3"], "--profile images:1x3:1x3:1x3", []))
case("check-profile-unknown-input")(lambda w, t: (
    ["check", str(w / "tiny.onnx"), "--profile", "nope:1x3:1x3:1x3"], "nope", []))
case("check-profile-zero")(lambda w, t: (
    ["check", str(w / "tiny.onnx"), "--profile", "images:0x3x32x32:1x3x32x32:1x3x32x32"], "--profile", []))

# ---------------------------------------------------------------- build --trtexec-only
for k in FILE_KINDS:
    case(f"build-model-{k}")(lambda w, t, k=k: (
        ["build", str(bad(t, k, "m.onnx", (w / "tiny.onnx").read_bytes()[:4096])), "--trtexec-only",
         "-o", str(t / "e.engine")], "m.onnx", [t / "e.engine", t / "e.engine.json"]))
case("build-o-is-input")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "-o", str(w / "tiny.onnx")], "-o", []))
case("build-o-folder")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "-o", str(t)], "is a folder", []))
case("build-sidecar-folder")(lambda w, t: (
    (t / "e.engine.json").mkdir(),
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "-o", str(t / "e.engine")], "sidecar",
    [t / "e.engine"])[1:])
case("build-parent-file")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "-o", str(t / "f" / "e.engine")], "is a file", [t / "f"]))
case("build-o-proc")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "-o", "/proc/self/e.engine"], "/proc", []))
case("build-workspace-nan")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "--workspace", "nan", "-o", str(t / "e.engine")],
    "--workspace", [t / "e.engine", t / "e.engine.json"]))
case("build-workspace-negative")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "--workspace", "-1", "-o", str(t / "e.engine")],
    "--workspace", [t / "e.engine", t / "e.engine.json"]))
case("build-batch-zero")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--trtexec-only", "--batch", "0:1:2", "-o", str(t / "e.engine")],
    "--batch", [t / "e.engine", t / "e.engine.json"]))

# ---------------------------------------------------------------- infer
for k in FILE_KINDS:
    case(f"infer-model-{k}")(lambda w, t, k=k: (
        ["infer", str(bad(t, k, "m.onnx", (w / "cls.onnx").read_bytes())), str(w / "images"),
         "-o", str(t / "r.json")], "m.onnx", [t / "r.json"]))
    case(f"infer-image-ids-{k}")(lambda w, t, k=k: (
        ["infer", str(w / "tiny.onnx"), str(w / "images"), "--image-ids",
         str(bad(t, k, "ids.json", _json(GT))), "-o", str(t / "r.json")], "ids.json", [t / "r.json"]))
    if k != "missing":
        case(f"infer-image-{k}")(lambda w, t, k=k: (
            ["infer", str(w / "tiny.onnx"), str(_imgs(t, k)), "-o", str(t / "r.json")], "x.png",
            [t / "r.json"]))
case("infer-image-ids-string-id")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--image-ids",
     str(bad(t, 'json:{"images": [{"id": "5", "file_name": "img0.png"}], "categories": [{"id": 1}]}', "ids.json")),
     "-o", str(t / "r.json")], "images[0]: id", [t / "r.json"]))
case("infer-image-ids-float-id")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--image-ids",
     str(bad(t, 'json:{"images": [{"id": 1, "file_name": "img0.png"}], "categories": [{"id": 5.7}]}', "ids.json")),
     "-o", str(t / "r.json")], "categories[0]: id", [t / "r.json"]))
case("infer-table-random")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--table", str(bad(t, "random", "tab.json")),
     "-o", str(t / "r.json")], "tab.json", [t / "r.json"]))
case("infer-o-is-image")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "-o", str(w / "images" / "img0.png")], "-o", []))
case("infer-o-is-model")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "-o", str(w / "tiny.onnx")], "-o", []))
case("infer-o-folder")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "-o", str(t)], "is a folder", []))
case("infer-o-parent-file")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "-o", str(t / "f" / "r.json")], "is a file", [t / "f"]))
case("infer-o-proc")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "-o", "/proc/norcal/r.json"], "/proc", []))
case("infer-skipped-list-folder")(lambda w, t: (
    (t / "r.skipped.json").mkdir(),
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--skip-unreadable", "-o", str(t / "r.json")],
    "r.skipped.json", [t / "r.json"])[1:])
case("infer-batch-negative")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--batch", "-1", "-o", str(t / "r.json")],
    "--batch", [t / "r.json"]))
case("infer-min-size-zero")(lambda w, t: (
    ["infer", str(w / "tiny.onnx"), str(w / "images"), "--min-size", "0", "-o", str(t / "r.json")],
    "--min-size", [t / "r.json"]))


# ---------------------------------------------------------------- eval
def _eval(w, t, gt=None, results=None, extra=()):
    return ["eval", "--gt", str(gt or w / "gt.json"), "--results", str(results or w / "results.json"),
            "--json", str(t / "m.json"), "--per-class-csv", str(t / "pc.csv"), *extra]


EVAL_OUT = lambda t: [t / "m.json", t / "pc.csv"]  # noqa: E731
for k in FILE_KINDS:
    case(f"eval-gt-{k}")(lambda w, t, k=k: (
        _eval(w, t, gt=bad(t, k, "g.json", _json(GT))), "g.json", EVAL_OUT(t)))
    case(f"eval-results-{k}")(lambda w, t, k=k: (
        _eval(w, t, results=bad(t, k, "r.json", _json(RESULTS))), "r.json", EVAL_OUT(t)))
    case(f"eval-table-{k}")(lambda w, t, k=k: (
        _eval(w, t, extra=["--table", str(bad(t, k, "tab.json", _json(TABLE2)))]), "tab.json", EVAL_OUT(t)))
case("eval-gt-wrong-type")(lambda w, t: (
    _eval(w, t, gt=bad(t, 'json:{"images": "x", "annotations": [], "categories": []}', "g.json")),
    "images", EVAL_OUT(t)))
case("eval-gt-nan-area")(lambda w, t: (
    _eval(w, t, gt=bad(t, "json:" + json.dumps(GT).replace('"area": 2500', '"area": NaN'), "g.json")),
    "area", EVAL_OUT(t)))
case("eval-gt-negative-height")(lambda w, t: (
    _eval(w, t, gt=bad(t, "json:" + json.dumps(GT).replace('"height": 240', '"height": -240'), "g.json")),
    "height", EVAL_OUT(t)))
case("eval-results-not-a-list")(lambda w, t: (
    _eval(w, t, results=bad(t, 'json:{"image_id": 1}', "r.json")), "r.json", EVAL_OUT(t)))
case("eval-results-inf-score")(lambda w, t: (
    _eval(w, t, results=bad(t, 'json:[{"image_id": 1, "category_id": 1, "bbox": [1, 1, 2, 2], '
                                 '"score": Infinity}]', "r.json")), "score", EVAL_OUT(t)))
case("eval-results-string-bbox")(lambda w, t: (
    _eval(w, t, results=bad(t, 'json:[{"image_id": 1, "category_id": 1, "bbox": "1,1,2,2", '
                                 '"score": 0.5}]', "r.json")), "bbox", EVAL_OUT(t)))
case("eval-table-other-names")(lambda w, t: (
    _eval(w, t, extra=["--table", str(bad(t, "json:" + json.dumps(TABLE2).replace('"b"', '"zebra"'),
                                          "tab.json"))]), "zebra", EVAL_OUT(t)))
case("eval-json-is-gt")(lambda w, t: (
    ["eval", "--gt", str(w / "gt.json"), "--results", str(w / "results.json"), "--json", str(w / "gt.json")],
    "--json", []))
case("eval-json-equals-csv")(lambda w, t: (
    ["eval", "--gt", str(w / "gt.json"), "--results", str(w / "results.json"), "--json", str(t / "m.json"),
     "--per-class-csv", str(t / "m.json")], "--per-class-csv", [t / "m.json"]))
case("eval-json-folder")(lambda w, t: (
    ["eval", "--gt", str(w / "gt.json"), "--results", str(w / "results.json"), "--json", str(t)],
    "is a folder", []))
case("eval-csv-parent-file")(lambda w, t: (
    _eval(w, t)[:-2] + ["--per-class-csv", str(t / "f" / "pc.csv")], "is a file", [t / "m.json", t / "f"]))
case("eval-plots-regular-file")(lambda w, t: (
    _eval(w, t, extra=["--plots", str(t / "plots")]), "--plots", [*EVAL_OUT(t), t / "plots"]))
case("eval-json-proc")(lambda w, t: (
    ["eval", "--gt", str(w / "gt.json"), "--results", str(w / "results.json"), "--json", "/proc/m.json"],
    "/proc", []))
case("eval-max-dets-zero")(lambda w, t: (_eval(w, t, extra=["--max-dets", "0"]), "--max-dets", EVAL_OUT(t)))
case("eval-max-dets-text")(lambda w, t: (_eval(w, t, extra=["--max-dets", "all"]), "--max-dets", EVAL_OUT(t)))
case("eval-fixed-per-class-negative")(lambda w, t: (
    _eval(w, t, extra=["--fixed-per-class", "-5"]), "--fixed-per-class", EVAL_OUT(t)))


# ---------------------------------------------------------------- tune
def _tune(w, t, gt=None, images=None, extra=()):
    return ["tune", str(w / "model_final.pth"), "--config", str(w / "config.yaml"),
            "--gt", str(gt or w / "gt.json"), "--images", str(images or w / "images"),
            "--json", str(t / "s.json"), "--plot", str(t / "s.png"), *extra]


TUNE_OUT = lambda t: [t / "s.json", t / "s.png"]  # noqa: E731
for k in FILE_KINDS:
    case(f"tune-gt-{k}")(lambda w, t, k=k: (_tune(w, t, gt=bad(t, k, "g.json", _json(GT))), "g.json", TUNE_OUT(t)))
    if k != "missing":
        case(f"tune-image-{k}")(lambda w, t, k=k: (
            _tune(w, t, images=_imgs(t, k), gt=bad(t, "json:" + json.dumps(GT).replace("img0.png", "x.png"),
                                                   "g.json")), "x.png", TUNE_OUT(t)))
case("tune-gt-string-height")(lambda w, t: (
    _tune(w, t, gt=bad(t, "json:" + json.dumps(GT).replace('"height": 240', '"height": "240"'), "g.json")),
    "height", TUNE_OUT(t)))
case("tune-model-missing")(lambda w, t: (
    ["tune", str(t / "none.pth"), "--gt", str(w / "gt.json"), "--images", str(w / "images")], "none.pth", []))
case("tune-json-is-gt")(lambda w, t: (
    _tune(w, t)[:-4] + ["--json", str(w / "gt.json")], "--json", []))
case("tune-plot-parent-file")(lambda w, t: (
    _tune(w, t)[:-2] + ["--plot", str(t / "f" / "s.png")], "is a file", [t / "s.json", t / "f"]))
case("tune-json-folder")(lambda w, t: (_tune(w, t)[:-4] + ["--json", str(t)], "is a folder", []))
case("tune-gammas-nan")(lambda w, t: (_tune(w, t, extra=["--gammas", "0,nan"]), "--gammas", TUNE_OUT(t)))
case("tune-cache-inf")(lambda w, t: (_tune(w, t, extra=["--max-cache-gb", "inf"]), "--max-cache-gb",
                                     TUNE_OUT(t)))


# ---------------------------------------------------------------- simulate
def _sim(t, extra=()):
    return ["simulate", "--images", "2", "--train-images", "2", "--json", str(t / "sim.json"),
            "--plot", str(t / "sim.png"), *extra]


SIM_OUT = lambda t: [t / "sim.json", t / "sim.png"]  # noqa: E731
for k in FILE_KINDS:
    case(f"simulate-table-{k}")(lambda w, t, k=k: (
        _sim(t, ["--table", str(bad(t, k, "tab.json", _json(TABLE2)))]), "tab.json", SIM_OUT(t)))
case("simulate-json-folder")(lambda w, t: (_sim(t)[:-4] + ["--json", str(t)], "is a folder", []))
case("simulate-plot-parent-file")(lambda w, t: (
    _sim(t)[:-2] + ["--plot", str(t / "f" / "sim.png")], "is a file", [t / "sim.json", t / "f"]))
case("simulate-json-is-table")(lambda w, t: (
    ["simulate", "--table", str(w / "two.json"), "--json", str(w / "two.json")], "--json", []))
case("simulate-json-proc")(lambda w, t: (_sim(t)[:-4] + ["--json", "/proc/sim.json"], "/proc", []))
case("simulate-bias-nan")(lambda w, t: (_sim(t, ["--bias", "nan"]), "--bias", SIM_OUT(t)))
case("simulate-images-negative")(lambda w, t: (_sim(t, ["--images", "-3"]), "--images", SIM_OUT(t)))
case("simulate-gammas-inf")(lambda w, t: (_sim(t, ["--gammas", "0,inf"]), "--gammas", SIM_OUT(t)))

# ---------------------------------------------------------------- table
ANN = {"images": [{"id": 1}], "annotations": [{"image_id": 1, "category_id": 1}],
       "categories": [{"id": 1, "name": "a"}]}
for k in FILE_KINDS:
    case(f"table-build-{k}")(lambda w, t, k=k: (
        ["table", "build", str(bad(t, k, "ann.json", _json(ANN))), "-o", str(t / "t.json")], "ann.json",
        [t / "t.json"]))
    case(f"table-show-{k}")(lambda w, t, k=k: (
        ["table", "show", str(bad(t, k, "tab.json", _json(TABLE2)))], "tab.json", []))
case("table-build-string-category")(lambda w, t: (
    ["table", "build", str(bad(t, 'json:{"images": [{"id": 1}], "annotations": [{"image_id": 1, '
                                  '"category_id": "1"}], "categories": [{"id": 1, "name": "a"}]}', "ann.json")),
     "-o", str(t / "t.json")], "category_id", [t / "t.json"]))
case("table-build-o-is-input")(lambda w, t: (
    ["table", "build", str(w / "gt.json"), "-o", str(w / "gt.json")], "-o", []))
case("table-build-o-folder")(lambda w, t: (
    ["table", "build", str(w / "gt.json"), "-o", str(t)], "is a folder", []))
case("table-show-limit-negative")(lambda w, t: (["table", "show", "lvis_v1", "--limit", "-1"], "--limit", []))


# ---------------------------------------------------------------- parity
def _parity(w, t, model=None, images=None, extra=()):
    return ["parity", str(model or w / "tiny.onnx"), str(images or w / "images"),
            "--checkpoint", str(w / "model_final.pth"), "--classifier", "softmax", "--json", str(t / "p.json"), *extra]


for k in FILE_KINDS:
    case(f"parity-model-{k}")(lambda w, t, k=k: (
        _parity(w, t, model=bad(t, k, "m.onnx", (w / "cls.onnx").read_bytes())), "m.onnx", [t / "p.json"]))
    case(f"parity-gt-{k}")(lambda w, t, k=k: (
        _parity(w, t, extra=["--gt", str(bad(t, k, "g.json", _json(GT)))]), "g.json", [t / "p.json"]))
    if k != "missing":
        case(f"parity-image-{k}")(lambda w, t, k=k: (
            _parity(w, t, images=_imgs(t, k)), "x.png", [t / "p.json"]))
case("parity-gt-no-height")(lambda w, t: (
    _parity(w, t, extra=["--gt", str(bad(t, "json:" + json.dumps(GT).replace('"height": 240, ', ''),
                                         "g.json"))]), "height", [t / "p.json"]))
case("parity-json-is-model")(lambda w, t: (
    _parity(w, t)[:-2] + ["--json", str(w / "tiny.onnx")], "--json", []))
case("parity-json-folder")(lambda w, t: (_parity(w, t)[:-2] + ["--json", str(t)], "is a folder", []))
case("parity-batch-negative")(lambda w, t: (_parity(w, t, extra=["--batch", "-1"]), "--batch", [t / "p.json"]))



# ---------------------------------------------------------------- quantize / build --int8
def _quantize(w, t, model=None, images=None, extra=()):
    imgs = images if images is not None else w / "images"
    return ["quantize", str(model or w / "tiny.onnx"), "--images", str(imgs), *extra, "-o", str(t / "o.onnx")]


for k in FILE_KINDS:
    case(f"quantize-model-{k}")(lambda w, t, k=k: (
        _quantize(w, t, model=bad(t, k, "m.onnx", (w / "tiny.onnx").read_bytes())), "m.onnx", [t / "o.onnx"]))
    if k != "missing":
        case(f"quantize-image-{k}")(lambda w, t, k=k: (
            _quantize(w, t, images=_imgs(t, k)), "x.png", [t / "o.onnx"]))
case("quantize-model-without-metadata")(lambda w, t: (
    _quantize(w, t, model=w / "cls.onnx"), "no norcal.min_size_test, norcal.max_size_test, "
                                           "norcal.classifier_logits metadata", [t / "o.onnx"]))
case("quantize-images-missing")(lambda w, t: (
    _quantize(w, t, images=t / "nope"), "--images", [t / "o.onnx"]))
case("quantize-images-empty")(lambda w, t: (
    _quantize(w, t, images=(t / "empty").mkdir() or t / "empty"), "no image files", [t / "o.onnx"]))
case("quantize-images-none")(lambda w, t: (
    _quantize(w, t)[:2] + ["-o", str(t / "o.onnx")], "--images", [t / "o.onnx"]))
case("quantize-fp16-with-images")(lambda w, t: (
    _quantize(w, t, extra=["--precision", "fp16"]), "--images", [t / "o.onnx"]))
case("quantize-num-images-zero")(lambda w, t: (
    _quantize(w, t, extra=["--num-images", "0"]), "--num-images", [t / "o.onnx"]))
case("quantize-output-is-model")(lambda w, t: (
    _quantize(w, t)[:-2] + ["-o", str(w / "tiny.onnx")], "-o", []))
case("build-int8-without-qdq")(lambda w, t: (
    ["build", str(w / "tiny.onnx"), "--int8", "--trtexec-only", "-o", str(t / "e.engine")],
    "run norcal quantize", [t / "e.engine", t / "e.engine.json"]))

def _run(argv):
    if argv[0] == "norcal-export":
        return export_main(argv[1:])
    return main(argv)


def check_hostile_case(case, world, tmp_path, capsys, monkeypatch) -> str:
    """Run one hostile case: exit 2, one ``error:`` line holding the expected text, every file
    as it was (an earlier run's output included). Returns the line."""
    monkeypatch.setenv("COLUMNS", "400")  # rich must not wrap the error line
    argv, expected, outputs = case(world, tmp_path)
    # an earlier run's output at every location that can hold a file (for the "parent is a
    # file" and "folder is a file" cases the sentinel is that file)
    for out in outputs:
        if not out.exists() and out.parent.is_dir():
            out.write_bytes(SENTINEL)
    before = _digest([tmp_path, world])
    capsys.readouterr()
    rc = _run(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("error: ")
    assert expected in lines[0], lines[0]
    assert _digest([tmp_path, world]) == before
    return lines[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input_is_one_line_and_writes_nothing(name, world, tmp_path, capsys, monkeypatch):
    check_hostile_case(CASES[name], world, tmp_path, capsys, monkeypatch)


def test_failing_last_step_leaves_no_output_of_the_run(world, tmp_path, capsys):
    """eval's plots are its last output: a plot it cannot write undoes the JSON and CSV too."""
    old = b'{"from": "an earlier run"}\n'
    (tmp_path / "m.json").write_bytes(old)
    plots = tmp_path / "plots"
    (plots / "ap_vs_count.png").mkdir(parents=True)  # the second plot cannot be written
    before = _digest([tmp_path])
    rc = main(["eval", "--gt", str(world / "gt.json"), "--results", str(world / "results.json"),
               "--json", str(tmp_path / "m.json"), "--per-class-csv", str(tmp_path / "pc.csv"),
               "--plots", str(plots)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "ap_vs_count.png" in err, err
    assert (tmp_path / "m.json").read_bytes() == old
    assert not (tmp_path / "pc.csv").exists() and not (plots / "ap_by_frequency.png").exists()
    assert _digest([tmp_path]) == before
    # and the same run with a writable plot folder writes everything
    (plots / "ap_vs_count.png").rmdir()
    assert main(["eval", "--gt", str(world / "gt.json"), "--results", str(world / "results.json"),
                 "--json", str(tmp_path / "m.json"), "--per-class-csv", str(tmp_path / "pc.csv"),
                 "--plots", str(plots)]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["stats"]["AP"] >= 0
    assert (tmp_path / "pc.csv").is_file() and (plots / "ap_by_frequency.png").is_file()


def test_eval_max_dets_negative_means_no_cap(world, tmp_path, capsys):
    """As --help says: a negative --max-dets keeps every detection (AR is then labelled @all)."""
    assert main(["eval", "--gt", str(world / "gt.json"), "--results", str(world / "results.json"),
                 "--max-dets", "-1", "--no-fixed"]) == 0
    assert "AR@all" in capsys.readouterr().out


def test_infer_skip_unreadable_records_what_it_skipped(world, tmp_path, capsys):
    """--skip-unreadable: the results stay an lvis-api result list; the skipped files go to a sidecar."""
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    shutil.copy(world / "images" / "img0.png", imgs / "1.png")
    bad(imgs, "random", "2.png")
    bad(imgs, "truncated", "3.png", PNG)
    out = tmp_path / "r.json"
    assert main(["infer", str(world / "tiny.onnx"), str(imgs), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "2.png: cannot read the image" in err and "1 more of the 1 files after it" in err, err
    assert main(["infer", str(world / "tiny.onnx"), str(imgs), "-o", str(out), "--skip-unreadable"]) == 0
    assert "2 file(s) skipped" in capsys.readouterr().err
    results = json.loads(out.read_text())
    assert isinstance(results, list) and {r["image_id"] for r in results} <= {1}
    side = json.loads((tmp_path / "r.skipped.json").read_text())
    assert side["images_run"] == 1
    assert [Path(s["file"]).name for s in side["skipped"]] == ["2.png", "3.png"]


def test_verify_images_are_checked_before_the_export(world, tmp_path):
    """export --verify: an unreadable image fails before the export starts, or is left out."""
    from norcal.core.errors import NorcalError
    from norcal.workflows.verify import check_images

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    shutil.copy(world / "images" / "img0.png", imgs / "a.png")
    bad(imgs, "random", "b.png")
    with pytest.raises(NorcalError, match=r"b\.png: cannot read the image") as e:
        check_images([imgs])
    assert set(e.value.params) == {"verify", "skip_unreadable=True"}
    images, skipped = check_images([imgs], skip_unreadable=True)
    assert len(images) == 1 and [p.name for p, _ in skipped] == ["b.png"]
    with pytest.raises(NorcalError, match="none of the 1 image files could be read"):
        check_images([imgs / "b.png"], skip_unreadable=True)


def test_parity_skip_unreadable_lists_the_skipped_files(world, tmp_path, capsys):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    shutil.copy(world / "images" / "img0.png", imgs / "a.png")
    bad(imgs, "empty", "b.png")
    argv = ["parity", str(world / "tiny.onnx"), str(imgs), "--checkpoint", str(world / "model_final.pth"),
            "--config", str(world / "config.yaml"), "--json", str(tmp_path / "p.json")]
    assert main(argv) == 2
    assert "b.png: cannot read the image" in capsys.readouterr().err
    assert main([*argv, "--skip-unreadable"]) in (0, 1)
    assert "1 unreadable file(s) skipped" in capsys.readouterr().out
    report = json.loads((tmp_path / "p.json").read_text())
    assert [Path(s["file"]).name for s in report["skipped"]] == ["b.png"]
