"""Compressed RLE strings (``counts`` a string) are read at load as pycocotools reads them: a
character outside its alphabet, a string ending inside a run, a negative run or runs not
covering the mask's size is one error naming the file, the record and the field (was: a
pycocotools traceback, or a hang, in segm / boundary evaluation)."""

import functools
import json

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from norcal.cli import main  # noqa: F401
from test_hostile import GT, RESULTS, bad, check_hostile_case, register_case, world  # noqa: F401

CASES = {}
case = functools.partial(register_case, CASES)
H, W = 240, 320
# a 50 x 50 square at (10, 10) of a 240 x 320 image, as pycocotools encodes it
_MASK = np.zeros((H, W), np.uint8, order="F")
_MASK[10:60, 10:60] = 1
SQUARE = mask_utils.encode(_MASK)["counts"].decode()


def _results(counts, size=(H, W)):
    return "json:" + json.dumps([dict(RESULTS[0], segmentation={"size": list(size), "counts": counts})])


def _gt(counts):
    gt = json.loads(json.dumps(GT))
    gt["annotations"][0]["segmentation"] = {"size": [H, W], "counts": counts}
    return "json:" + json.dumps(gt)


BAD = {  # counts string -> what the error says
    "bang": ("!!!!", "character '!' at 0 is outside pycocotools' RLE alphabet"),
    "non-ascii": (SQUARE[:5] + "é" + SQUARE[5:], "character 'é' at 5 is outside"),
    "open-end": (SQUARE + "o", "ends inside a run length"),
    "short": (SQUARE[:-4], f"RLE counts sum to 14220, not {H} x {W} = {H * W}"),
    "negative": ("000@", "run 3 is negative (-16)"),
    "too-long-run": ("o" * 7, "run 0 is longer than 6 characters"),
}
for name, (counts, said) in BAD.items():
    for iou in ("segm", "boundary"):
        case(f"eval-{iou}-results-rle-{name}")(lambda w, t, c=counts, s=said, iou=iou: (
            ["eval", "--gt", str(bad(t, _gt(SQUARE), "g.json")), "--results", str(bad(t, _results(c), "r.json")),
             "--iou-type", iou, "--json", str(t / "m.json")],
            f"r.json: [0]: segmentation.counts: {s}", [t / "m.json"]))
    case(f"eval-segm-gt-rle-{name}")(lambda w, t, c=counts, s=said: (
        ["eval", "--gt", str(bad(t, _gt(c), "g.json")), "--results", str(bad(t, _results(SQUARE), "r.json")),
         "--iou-type", "segm", "--json", str(t / "m.json")],
        f"g.json: annotations[0] (id 1): segmentation.counts: {s}", [t / "m.json"]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_rle_is_one_line_and_writes_nothing(name, world, tmp_path, capsys, monkeypatch):
    check_hostile_case(CASES[name], world, tmp_path, capsys, monkeypatch)


def test_valid_rle_still_evaluates(world, tmp_path, capsys):
    (tmp_path / "g.json").write_text(_gt(SQUARE)[5:])
    (tmp_path / "r.json").write_text(_results(SQUARE)[5:])
    for iou in ("segm", "boundary"):
        assert main(["eval", "--gt", str(tmp_path / "g.json"), "--results", str(tmp_path / "r.json"),
                     "--iou-type", iou, "--json", str(tmp_path / f"{iou}.json")]) == 0
        assert json.loads((tmp_path / f"{iou}.json").read_text())["stats"]["AP"] == pytest.approx(1.0)
