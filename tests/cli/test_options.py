"""The CLI's shared pieces: value parsers, and library errors shown with the flags."""

import pickle

import pytest

from norcal.cli import main
from norcal.cli.options import MAX_GAMMAS, error_line, parse_gammas
from norcal.core.errors import NorcalError

from conftest import TINY


@pytest.mark.parametrize("text, expected", [
    ("0:1.5:0.5", [0.0, 0.5, 1.0, 1.5]),
    ("0:1:0.3", [0.0, 0.3, 0.6, 0.9]),
    ("0:0.3:0.1", [0.0, 0.1, 0.2, 0.3]),
    ("1, 0.5,0", [0.0, 0.5, 1.0]),
    ("0.7", [0.7]),
])
def test_parse_gammas(text, expected):
    assert parse_gammas(text) == expected


@pytest.mark.parametrize("text", ["", "a:b:c", "0:1", "1:0:0.1", "0:1:0", "0:1:-1",
                                  "0:inf:0.1", "0:1:nan", "nan", "0,inf", "0:10000:1"])
def test_parse_gammas_rejects(text):
    with pytest.raises(NorcalError):
        parse_gammas(text)


def test_parse_gammas_caps_the_count():
    assert len(parse_gammas(f"0:{MAX_GAMMAS - 1}:1")) == MAX_GAMMAS


def test_error_line_spells_named_parameters_as_flags():
    flags = {"batch_size": "--batch", "max_cache_bytes": "--max-cache-gb", "force=True": "--force"}
    e = NorcalError("lower batch_size or raise max_cache_bytes", param=("batch_size", "max_cache_bytes"))
    assert error_line(e, flags) == "lower --batch or raise --max-cache-gb"
    assert error_line(NorcalError("x exists; pass force=True to replace it", param="force=True"),
                      flags) == "x exists; pass --force to replace it"
    # common to all commands
    assert error_line(NorcalError("drop renormalize=False", param="renormalize=False")) == \
        "drop --no-renormalize"


def test_error_line_changes_only_whole_named_parameters():
    flags = {"batch": "--batch", "config": "--config"}
    # not named by the error: left alone
    assert error_line(NorcalError("batch 3 is too large"), flags) == "batch 3 is too large"
    e = NorcalError("batch 3 with batch_size 2, config.yaml: config has no batch", param=("batch", "config"))
    assert error_line(e, flags) == "--batch 3 with batch_size 2, config.yaml: --config has no --batch"
    assert error_line(NorcalError("no flag for min_size", param="min_size"), {}) == "no flag for --min-size"


def test_error_keeps_its_parameters_when_pickled():
    e = pickle.loads(pickle.dumps(NorcalError("min_size must be positive", param="min_size")))
    assert str(e) == "min_size must be positive" and e.param == "min_size" and e.params == ("min_size",)
    assert NorcalError("plain").param is None and NorcalError("plain").params == ()


def test_infer_names_the_provider_flag(tmp_path, capsys):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"")
    rc = main(["infer", str(engine), str(TINY / "images" / "img0.png"), "-o", str(tmp_path / "r.json"),
               "--provider", "cuda"])
    assert rc == 2
    assert capsys.readouterr().err == "error: m.engine is a TensorRT engine; --provider cuda applies to .onnx models\n"


def test_error_line_leaves_paths_alone():
    """A parameter's name inside a path (a folder named like it) stays: the path is the user's."""
    flags = {"checkpoint": "--checkpoint", "config": "--config", "table": "--table"}
    e = NorcalError("checkpoint /x/checkpoint/m.pth has 6 classes; config ./config/c.yaml and "
                    "table C:\\table\\t.json do not fit", param=("checkpoint", "config", "table"))
    assert error_line(e, flags) == ("--checkpoint /x/checkpoint/m.pth has 6 classes; --config ./config/c.yaml "
                                    "and --table C:\\table\\t.json do not fit")
    e = NorcalError("checkpoint/m.pth: config goes with checkpoint", param=("config", "checkpoint"))
    assert error_line(e, flags) == "checkpoint/m.pth: --config goes with --checkpoint"
    # names joined by a slash are names, not a path
    e = NorcalError("no metadata, resized to 800/1333 unless (min_size/max_size) are given",
                    param=("min_size", "max_size"))
    assert error_line(e) == "no metadata, resized to 800/1333 unless (--min-size/--max-size) are given"
