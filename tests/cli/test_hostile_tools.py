"""Hostile use of quantize / check / build: refusals in one line, exit 2, nothing written."""

import onnx

from norcal.cli import main
from onnx_graphs import classifier_graph


def _one_line_exit_2(argv, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_check_refuses_a_profile_given_twice_for_one_input(tmp_path, capsys, monkeypatch):
    # two different profiles for x: which one holds is a guess, so refuse
    onnx.save(classifier_graph(), str(tmp_path / "cls.onnx"))
    err = _one_line_exit_2(["check", str(tmp_path / "cls.onnx"), "--profile", "x:1x8:2x8:4x8",
                            "--profile", "x:1x8:8x8:16x8"], capsys, monkeypatch)
    assert "'x'" in err and "--profile" in err and "twice" in err
