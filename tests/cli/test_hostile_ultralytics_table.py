"""Hostile Ultralytics datasets to `norcal table build data.yaml`, checked as in test_hostile.py:
exit 2, one line naming the file, line and field, nothing written."""

import functools

import pytest

from test_hostile import _run, check_hostile_case, register_case  # noqa: F401
from test_hostile_inputs import DEEP, _bomb

CASES = {}
case = functools.partial(register_case, CASES)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A valid two-class dataset, shared read-only by every case."""
    d = tmp_path_factory.mktemp("yolo_world")
    (d / "images/train").mkdir(parents=True)
    (d / "labels/train").mkdir(parents=True)
    (d / "images/train/a.jpg").write_bytes(b"")
    (d / "labels/train/a.txt").write_text("0 0.5 0.5 0.1 0.1\n1 0.2 0.2 0.1 0.1\n")
    return d


def dataset(w, t, yaml_text, label=None):
    """``t``/data.yaml over the world's images, or (``label``) over a copy whose one label
    file holds ``label``."""
    if label is not None:
        (t / "images/train").mkdir(parents=True)
        (t / "labels/train").mkdir(parents=True)
        (t / "images/train/a.jpg").write_bytes(b"")
        (t / "labels/train/a.txt").write_text(label)
        yaml_text = yaml_text.replace("WORLD", str(t))
    y = t / "data.yaml"
    y.write_text(yaml_text.replace("WORLD", str(w)))
    return y


def build(w, t, yaml_text, expected, label=None):
    return (["table", "build", str(dataset(w, t, yaml_text, label)), "-o", str(t / "t.json")],
            expected, [t / "t.json"])


GOOD = "path: WORLD\ntrain: images/train\nnames: [a, b]\n"
LABEL = "{t}/labels/train/a.txt: line {n}, field {f}"
case("table-build-yolo-yaml-bomb")(lambda w, t: build(
    w, t, _bomb(), "data.yaml: not an Ultralytics dataset description: expands to more than"))
case("table-build-yolo-deep-yaml")(lambda w, t: build(
    w, t, "names: " + DEEP, "data.yaml: not an Ultralytics dataset description: nested too deeply"))
case("table-build-yolo-random-bytes")(lambda w, t: build(w, t, "\x00\x01\x02", "data.yaml: not valid YAML"))
case("table-build-yolo-no-names")(lambda w, t: build(
    w, t, "path: WORLD\ntrain: images/train\n", "data.yaml: field 'names' missing"))
case("table-build-yolo-names-type")(lambda w, t: build(
    w, t, "path: WORLD\ntrain: images/train\nnames: 7\n", "data.yaml: field 'names' must be a list"))
case("table-build-yolo-train-type")(lambda w, t: build(
    w, t, "path: WORLD\ntrain: {a: 1}\nnames: [a, b]\n", "data.yaml: field 'train' must be a path"))
case("table-build-yolo-path-missing")(lambda w, t: build(
    w, t, "path: WORLD/nope\ntrain: images/train\nnames: [a, b]\n", "data.yaml: field 'path': "))
case("table-build-yolo-class-outside-names")(lambda w, t: build(
    w, t, GOOD, LABEL.format(t=t, n=2, f="1 (class): class id 2 is outside names (0..1)"),
    label="0 0.5 0.5 0.1 0.1\n2 0.5 0.5 0.1 0.1\n"))
case("table-build-yolo-non-numeric")(lambda w, t: build(
    w, t, GOOD, LABEL.format(t=t, n=1, f="4 (w): 'wide' is not a number"), label="0 0.5 0.5 wide 0.1\n"))
case("table-build-yolo-outside-unit")(lambda w, t: build(
    w, t, GOOD, LABEL.format(t=t, n=1, f="2 (x): '640' is outside [0, 1]"), label="1 640 0.5 0.1 0.1\n"))
case("table-build-yolo-field-count")(lambda w, t: build(
    w, t, GOOD, f"{t}/labels/train/a.txt: line 1: 3 fields", label="1 0.5 0.5\n"))



def onto(w, t, target, argv=("table", "build"), flag="-o"):
    """A command reading ``t``'s dataset with its output ``target`` (a file of that dataset)."""
    y = dataset(w, t, GOOD.replace("WORLD", str(t)) + "val: images/val\n", label="0 0.5 0.5 0.1 0.1\n")
    (t / "images/val").mkdir()
    (t / "images/val/v.png").write_bytes(b"")
    out = t / target
    return [*argv, str(y), flag, str(out)], f"{flag} {out} is the input file", [out]


# a data.yaml names further inputs: its images and label files, of every split
case("table-build-yolo-output-is-an-image")(lambda w, t: onto(w, t, "images/train/a.jpg"))
case("table-build-yolo-output-is-a-label-file")(lambda w, t: onto(w, t, "labels/train/a.txt"))
case("table-build-yolo-output-is-a-val-image")(lambda w, t: onto(w, t, "images/val/v.png"))
case("simulate-yolo-table-json-is-a-label-file")(lambda w, t: onto(
    w, t, "labels/train/a.txt", argv=("simulate", "--gammas", "0.5", "--table"), flag="--json"))


def into(w, t, target, folder):
    """A command reading ``t``'s dataset, writing ``target``: no file yet (no sentinel either:
    one would be a label file), but inside one of the dataset's image or label ``folder``s (a
    file there would label an image, or be read as one)."""
    argv, _, _ = onto(w, t, target)
    (t / "images/train/b.jpg").write_bytes(b"")  # an image with no labels yet
    return argv, f"-o {t / target} is inside {t / folder}, a folder of the dataset {t / 'data.yaml'}", []


case("table-build-yolo-output-would-label-an-image")(lambda w, t: into(
    w, t, "labels/train/b.txt", "labels/train"))
case("table-build-yolo-output-in-an-image-folder")(lambda w, t: into(
    w, t, "images/val/t.json", "images/val"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_dataset_is_one_line_and_writes_nothing(name, world, tmp_path, capsys, monkeypatch):
    line = check_hostile_case(CASES[name], world, tmp_path, capsys, monkeypatch)
    assert len(line) < 400, line
