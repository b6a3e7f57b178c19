"""A config or data.yaml far larger than any real one is refused by its size before any of it is
parsed: a 63 MB config.yaml was still being parsed (pure-Python YAML) two minutes later."""

from __future__ import annotations

import time

import pytest

from conftest import TINY
from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.core.files.yaml_io import MAX_YAML_BYTES, read_yaml_mapping


def _padded(path, text: str, size: int):
    """``text`` then YAML comment lines up to exactly ``size`` bytes."""
    line = "#" + "x" * 1022 + "\n"
    body = text.encode() + line.encode() * ((size - len(text)) // len(line))
    path.write_bytes(body + b"#" * (size - len(body)))
    assert path.stat().st_size == size
    return path


def test_the_bound_is_4_mib():
    assert MAX_YAML_BYTES == 4 * 2 ** 20


def test_a_huge_config_is_refused_by_its_size_at_once(tmp_path, capsys):
    config = _padded(tmp_path / "config.yaml", "MODEL:\n  MASK_ON: true\n", 64 * 2 ** 20)
    start = time.monotonic()
    assert main(["export", str(TINY / "model_final.pth"), "--config", str(config), "--gamma", "0.5",
                 "-o", str(tmp_path / "o.onnx")]) == 2
    assert time.monotonic() - start < 30  # parsing it took minutes
    assert capsys.readouterr().err == (f"error: {config}: not a detectron2 config: larger than 4 MiB "
                                       "(a config or dataset description is a few kilobytes)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_a_huge_data_yaml_is_refused_by_its_size(tmp_path):
    data = _padded(tmp_path / "data.yaml", "names: [a, b]\n", MAX_YAML_BYTES + 1)
    with pytest.raises(NorcalError, match=r"^.*data\.yaml: not an Ultralytics .*: larger than 4 MiB"):
        read_yaml_mapping(data, "Ultralytics dataset description")


def test_a_file_at_the_bound_is_read(tmp_path):
    data = _padded(tmp_path / "data.yaml", "names: [a, b]\n", MAX_YAML_BYTES)
    assert read_yaml_mapping(data, "Ultralytics dataset description") == {"names": ["a", "b"]}
