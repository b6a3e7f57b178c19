"""The bundled example's images and training annotations, drawn from the dataset's seed.

generated.json holds the sha256 of the files detectron2 trained and was evaluated on (the
pixels of each PNG, the bytes of train_annotations.json); drawing must reproduce them all,
refuse a difference without writing anything, and fall back to a cache for a read-only install.
"""

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import norcal.examples as examples
from conftest import SYNTH
from norcal.examples import synth


def test_every_drawn_file_is_the_one_the_model_was_made_with():
    expected = json.loads((examples.ROOT / examples.NAME / "generated.json").read_text())
    assert len(expected["images"]) == 48 + 120
    for name, digest in expected["images"].items():
        assert synth.pixel_sha256(np.asarray(Image.open(SYNTH / name).convert("RGB"))) == digest, name
    data = (SYNTH / "train_annotations.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == expected["train_annotations.json"]
    ann = json.loads(data)
    assert len(ann["images"]) == 2000 and len(ann["categories"]) == 60
    # the README's groups: 20 rare, 24 common, 16 frequent
    groups = [c["frequency"] for c in ann["categories"]]
    assert (groups.count("r"), groups.count("c"), groups.count("f")) == (20, 24, 16)
    val = json.loads((SYNTH / "val.json").read_text())
    drawn_val = {n for n in expected["images"] if n.startswith("val/")}
    assert drawn_val == {f"val/{im['file_name']}" for im in val["images"]}


def _copy_shipped(tmp_path):
    root = tmp_path / "pkg"
    (root / examples.NAME).mkdir(parents=True)
    for n in ("generated.json", "README.md", "config.yaml", "val.json", "train_subset.json"):
        shutil.copyfile(examples.ROOT / examples.NAME / n, root / examples.NAME / n)
    return root


def _small(expected: dict, names: list[str]) -> dict:
    """Only a few images, so that a test draws in seconds (the stream is still replayed)."""
    return {**expected, "images": {n: expected["images"][n] for n in names}}


def test_a_difference_is_refused_and_nothing_is_kept(tmp_path, monkeypatch):
    root = _copy_shipped(tmp_path)
    gen = root / examples.NAME / "generated.json"
    expected = json.loads(gen.read_text())
    small = _small(expected, ["val/100001.png", "val/100002.png"])
    small["images"]["val/100002.png"] = "0" * 64
    gen.write_text(json.dumps(small))
    monkeypatch.setattr(examples, "ROOT", root)
    monkeypatch.setenv("NORCAL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(examples.ExampleError, match=r"val/100002.png drawn here differs"):
        examples.example_dir()
    assert sorted(p.name for p in (root / examples.NAME).iterdir()) == sorted(
        ["generated.json", "README.md", "config.yaml", "val.json", "train_subset.json"])


def test_read_only_install_draws_into_the_cache(tmp_path, monkeypatch):
    root = _copy_shipped(tmp_path)
    gen = root / examples.NAME / "generated.json"
    gen.write_text(json.dumps(_small(json.loads(gen.read_text()), ["val/100003.png"])))
    mkdtemp = tempfile.mkdtemp

    def read_only(*args, dir=None, **kw):  # the tests run as root, who may write anywhere
        if dir is not None and Path(dir) == root / examples.NAME:
            raise PermissionError(13, "Permission denied", str(dir))
        return mkdtemp(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    monkeypatch.setattr(examples, "ROOT", root)
    monkeypatch.setenv("NORCAL_CACHE", str(tmp_path / "cache"))
    d = examples.example_dir()
    assert d == tmp_path / "cache" / examples.NAME
    assert not (root / examples.NAME / "val").exists()
    assert examples.example_dir() == d  # drawn once
    assert (d / "val" / "100003.png").is_file() and (d / "val.json").is_file()
