"""Calibration tables from an Ultralytics data.yaml: counts checked against small datasets
counted by hand, and every malformed file refused in one line naming file, line and field."""

import json
from pathlib import Path

import pytest

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import build_table, load_table, table_from_dataset
from norcal.core.datasets.ultralytics_dataset import label_path


def write(p: Path, text: str = "") -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def small_dataset(root: Path) -> Path:
    """Three classes over five images (hand count in the comments)."""
    d = root / "ds"
    # a.jpg: 2 cats, 1 dog
    write(d / "images/train/a.jpg")
    write(d / "labels/train/a.txt", "0 0.5 0.5 0.2 0.2\n0 0.1 0.1 0.05 0.05\n1 0.7 0.7 0.1 0.3\n")
    # b.png: 1 dog, 1 bird, as polygons (a file of polygons holds no box); blank lines ignored
    write(d / "images/train/b.png")
    write(d / "labels/train/b.txt", "\n1 0.1 0.1 0.2 0.1 0.2 0.3 0.1 0.3\n\n2 0 0 1 0 1 1\n")
    # sub/c.JPG: no label file -> a background image
    write(d / "images/train/sub/c.JPG")
    # sub/d.webp: the same bird twice (counted once, as Ultralytics drops duplicates) + another bird
    write(d / "images/train/sub/d.webp")
    write(d / "labels/train/sub/d.txt", "2 0.5 0.5 0.1 0.1\n2 0.5 0.5 0.1 0.1\n2 0.25 0.5 0.1 0.1\n")
    # e.jpg: an empty label file
    write(d / "images/train/e.jpg")
    write(d / "labels/train/e.txt", "")
    write(d / "images/train/notes.md", "not an image")  # ignored: not an image suffix
    write(d / "labels/train/zzz.txt", "7 9 9 9 9\n")  # no image: never read
    write(d / "images/val/v.jpg")  # another split: not counted
    write(d / "labels/val/v.txt", "0 0.5 0.5 0.2 0.2\n")
    return write(d / "data.yaml", "train: images/train\nval: images/val\n"
                 "names:\n  0: cat\n  1: dog\n  2: bird\n")


# hand count of small_dataset: cat 1 image / 2 instances, dog 2 / 2, bird 2 / 3
EXPECTED = [("cat", 1, 2), ("dog", 2, 2), ("bird", 2, 3)]


def rows(table):
    return [(c["name"], c["image_count"], c["instance_count"]) for c in table.categories]


def test_counts_match_the_hand_count(tmp_path):
    t = table_from_dataset(small_dataset(tmp_path))
    assert rows(t) == EXPECTED
    assert t.category_ids == [1, 2, 3]  # class index + 1
    assert t.name == "data" and t.count_type == "image"
    assert t.source == "data.yaml (train: 5 images)"
    assert list(t.counts()) == [1, 2, 2]
    assert list(t.counts("instance")) == [2, 2, 3]
    assert t.frequencies == ["r", "r", "r"]


def test_other_split_and_names_as_a_list(tmp_path):
    y = small_dataset(tmp_path)
    y.write_text("train: images/train\nval: images/val\nnames: [cat, dog, bird]\n")  # no path: the YAML's folder
    t = table_from_dataset(y, split="val", count_type="instance")
    assert rows(t) == [("cat", 1, 1), ("dog", 0, 0), ("bird", 0, 0)]
    assert t.count_type == "instance"


def test_names_keyed_by_text_indices(tmp_path):
    y = small_dataset(tmp_path)
    y.write_text("train: images/train\nnames: {'1': dog, '0': cat, 2: bird}\n")
    assert rows(table_from_dataset(y)) == EXPECTED


def test_txt_list_and_list_of_sources(tmp_path, monkeypatch):
    y = small_dataset(tmp_path)
    d = y.parent
    # as Ultralytics: './' from the list's folder, other relative entries from the current folder
    write(d / "train.txt", "./images/train/a.jpg\nds/images/train/sub/d.webp\n\n")
    monkeypatch.chdir(tmp_path)
    y.write_text(f"path: {d}\ntrain: [train.txt, images/val]\nnames: [cat, dog, bird]\n")
    # a: 2 cats + 1 dog; d: 2 birds; v: 1 cat
    assert rows(table_from_dataset(y)) == [("cat", 2, 3), ("dog", 1, 1), ("bird", 1, 2)]


def test_label_path_replaces_the_last_images_folder(tmp_path):
    assert label_path(Path("/d/images/x/images/a.b.jpg")) == Path("/d/images/x/labels/a.b.txt")
    assert label_path(Path("/d/pics/a.png")) == Path("/d/pics/a.txt")


def test_progress_reports_every_image(tmp_path):
    seen = []
    table_from_dataset(small_dataset(tmp_path), progress=lambda s, n, total: seen.append((s, n, total)))
    assert sum(n for _, n, _ in seen) == 5 and {t for _, _, t in seen} == {5}


def test_build_and_load_table_take_a_data_yaml(tmp_path):
    y = small_dataset(tmp_path)
    assert rows(build_table(y, "instance")) == EXPECTED
    assert rows(load_table(str(y))) == EXPECTED


def test_cli_build_writes_the_table(tmp_path, capsys):
    y = small_dataset(tmp_path)
    out = tmp_path / "t.json"
    assert main(["table", "build", str(y), "--count", "instance", "--name", "pets", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["name"] == "pets" and data["count_type"] == "instance"
    assert [(c["id"], c["name"], c["image_count"], c["instance_count"]) for c in data["categories"]] == \
        [(1, "cat", 1, 2), (2, "dog", 2, 2), (3, "bird", 2, 3)]
    assert "3 classes" in capsys.readouterr().out


BAD_LABELS = [
    ("9 0.5 0.5 0.1 0.1\n", "line 1, field 1 (class): class id 9 is outside names (0..2)"),
    ("-1 0.5 0.5 0.1 0.1\n", "line 1, field 1 (class): class id -1 is outside names"),
    ("0 0.5 0.5 0.1 0.1\ncat 0.5 0.5 0.1 0.1\n", "line 2, field 1 (class): 'cat' is not an integer"),
    ("1.5 0.5 0.5 0.1 0.1\n", "line 1, field 1 (class): '1.5' is not an integer"),
    ("0 0.5 x 0.1 0.1\n", "line 1, field 3 (y): 'x' is not a number"),
    ("0 0.5 0.5 1.2 0.1\n", "line 1, field 4 (w): '1.2' is outside [0, 1]"),
    ("0 -0.1 0.5 0.1 0.1\n", "line 1, field 2 (x): '-0.1' is outside [0, 1]"),
    ("0 nan 0.5 0.1 0.1\n", "line 1, field 2 (x): 'nan' is outside [0, 1]"),
    ("0 0.5 0.5 0.1 inf\n", "line 1, field 5 (h): 'inf' is outside [0, 1]"),
    ("0 0.1 0.1 0.2 0.1 0.2 1.3 0.1 0.3\n", "line 1, field 7 (y3): '1.3' is outside [0, 1]"),
    ("0 0.5 0.5 0.1\n", "line 1: 4 fields"),
    ("0 0.1 0.1 0.2 0.1 0.2 0.3 0.1\n", "line 1: 8 fields"),
    ("0 0.1 0.1 0.2 0.1 0.2 0.3\n0 0.5 0.5 0.1 0.1\n", "line 2: a box ('class x y w h') in a file of polygons"),
    ("0 0.5 0.5 0.1 0.1\n0 0.5 0.5 1.0101 0.1\n", "line 2, field 4 (w): '1.0101' is outside [0, 1] beyond"),
    ("0 -0.0101 0.5 0.1 0.1\n", "line 1, field 2 (x): '-0.0101' is outside [0, 1] beyond"),
    ("0 0.5 0.5 -0.001 0.1\n", "line 1, field 4 (w): '-0.001' is outside [0, 1]"),
    # a polygon is held to the box around it: its centre x here is (0.2 + 1.83) / 2 > 1.01
    ("0 0.2 0.1 1.83 0.1 1 0.3\n", "line 1, field 4 (x2): '1.83' is outside [0, 1]"),
]


@pytest.mark.parametrize("text,expected", BAD_LABELS)
def test_bad_label_line_names_file_line_and_field(tmp_path, text, expected):
    y = small_dataset(tmp_path)
    f = write(y.parent / "labels/train/sub/d.txt", text)
    with pytest.raises(NorcalError) as e:
        table_from_dataset(y)
    msg = str(e.value)
    assert msg.startswith(f"{f}: ") and expected in msg and "\n" not in msg, msg


BAD_YAML = [
    ("train: images/train\n", "field 'names' missing"),
    ("train: images/train\nnames:\n", "field 'names' missing"),
    ("train: images/train\nnames: cat\n", "field 'names' must be a list or a mapping"),
    ("train: images/train\nnames: []\n", "field 'names' lists no classes"),
    ("train: images/train\nnames: [cat, [dog]]\n", "field 'names[1]' must be a class name"),
    ("train: images/train\nnames: [cat, null]\n", "field 'names[1]' must be a class name"),
    ("train: images/train\nnames: {0: cat, 2: dog}\n", "class indices must be 0..1, 1 is missing"),
    ("train: images/train\nnames: {a: cat}\n", "key 'a' is not a class index"),
    ("train: images/train\nnames: [cat]\nnc: 3\n", "field 'nc' is 3 but 'names' lists 1 classes"),
    ("names: [cat]\n", "field 'train' missing"),
    ("train: 3\nnames: [cat]\n", "field 'train' must be a path"),
    ("train: []\nnames: [cat]\n", "field 'train' is an empty list"),
    ("train: [images/train, 5]\nnames: [cat]\n", "field 'train[1]' must be a path"),
    ("train: nowhere\nnames: [cat]\n", "field 'train': "),
    ("train: data.yaml\nnames: [cat]\n", "is neither a folder nor a .txt list"),
    ("path: [a]\ntrain: images/train\nnames: [cat]\n", "field 'path' must be a folder"),
    ("path: missing\ntrain: images/train\nnames: [cat]\n", "field 'path': "),
    ("- a\n- b\n", "must be a YAML mapping, found list"),
    ("", "file is empty"),
    ("names: [cat\n", "not valid YAML"),
    ("train: images/train\nnames: [cat]\n", "is outside names (0..0)"),  # the label file names it
]


@pytest.mark.parametrize("text,expected", BAD_YAML)
def test_bad_data_yaml_is_one_line(tmp_path, text, expected):
    y = small_dataset(tmp_path)
    y.write_text(text)
    with pytest.raises(NorcalError) as e:
        table_from_dataset(y)
    msg = str(e.value)
    assert expected in msg and "\n" not in msg, msg
    assert str(y.parent) in msg


def test_missing_image_in_a_list_names_the_line(tmp_path):
    y = small_dataset(tmp_path)
    lst = write(y.parent / "train.txt", "./images/train/a.jpg\n./images/train/gone.jpg\n")
    y.write_text("train: train.txt\nnames: [cat, dog, bird]\n")
    with pytest.raises(NorcalError, match=rf"^{lst}: line 2: image './images/train/gone.jpg' not found$"):
        table_from_dataset(y)


def test_binary_label_file_is_refused(tmp_path):
    y = small_dataset(tmp_path)
    f = y.parent / "labels/train/a.txt"
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(NorcalError, match=rf"^{f}: not a YOLO label file \(not UTF-8 text\)$"):
        table_from_dataset(y)


def test_a_class_without_images_is_written_with_a_note(tmp_path, capsys):
    """A class with no training labels does not stop the build: the table says 0, one line says
    how to use it (--min-count), and export with --min-count takes it."""
    y = small_dataset(tmp_path)
    y.write_text("train: images/train\nnames: [cat, dog, bird, fish]\n")
    out = tmp_path / "t.json"
    assert main(["table", "build", str(y), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: 1 class(es) have no training labels (first: class 3 'fish')" in printed
    assert "--min-count K" in printed and "\n" not in printed.split("note: ")[1].strip()
    t = load_table(out)
    assert rows(t) == [*EXPECTED, ("fish", 0, 0)]
    with pytest.raises(NorcalError, match="'fish'"):  # NorCal still needs the floor
        t.counts()
    assert list(t.counts(min_count=1)) == [1, 2, 2, 1]


def test_relative_yaml_from_the_working_folder(tmp_path, monkeypatch):
    """Label paths come from absolute image paths: a relative data.yaml finds them too."""
    y = small_dataset(tmp_path)
    monkeypatch.chdir(y.parent)
    assert rows(table_from_dataset("data.yaml")) == EXPECTED
