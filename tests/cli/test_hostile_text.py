"""Text taken from files and echoed on stderr (a LazyConfig's ``_target_``, a file name): every
character a terminal would act on is printed as its escape, so a file cannot clear the screen,
set the window title or hide the rest of the line; the line stays one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY
from norcal.cli import main
from norcal.core.errors import printable

LSJ = Path(__file__).parents[1] / "fixtures" / "lazy_lsj" / "config.yaml"
# an OSC window title, a screen clear, a bidirectional override and a line break
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202e\nEvil"
SHOWN = r"\x1b]0;pwned\x07\x1b[2J\u202e\nEvil"


def _stderr(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    return capsys.readouterr().err


def test_a_target_with_escape_sequences_is_printed_escaped(tmp_path, capsys):
    text = LSJ.read_text()
    assert "  _target_: detectron2.modeling.GeneralizedRCNN\n" in text
    config = tmp_path / "config.yaml"
    # YAML's double-quoted escapes: the file holds the control characters themselves once parsed
    config.write_text(text.replace("  _target_: detectron2.modeling.GeneralizedRCNN\n",
                                   '  _target_: "\\e]0;pwned\\a\\e[2J\\u202e\\nEvil"\n', 1))
    err = _stderr(["export", str(TINY / "model_final.pth"), "--config", str(config), "--gamma", "0.5",
                   "-o", str(tmp_path / "o.onnx")], capsys)
    assert err == (f"error: {config}: model._target_: {SHOWN} is not supported "
                   "(meta architecture: GeneralizedRCNN)\n")
    assert not (tmp_path / "o.onnx").exists()


def test_a_file_name_with_escape_sequences_is_printed_escaped(tmp_path, capsys):
    model = tmp_path / f"m{HOSTILE}.pth"
    err = _stderr(["export", str(model), "--gamma", "0.5", "-o", str(tmp_path / "o.onnx")], capsys)
    assert SHOWN in err and "\x1b" not in err and "\u202e" not in err and err.count("\n") == 1


@pytest.mark.parametrize("text, shown", [
    ("plain é ü 日本", "plain é ü 日本"),  # printable non-ASCII is shown as it is
    ("tab\there", r"tab\there"),
    ("\x00\x7f\x85\x9b", r"\x00\x7f\x85\x9b"),  # NUL, DEL, C1 NEL and CSI
    ("\u2028\u2029\u200f\u2066", r"\u2028\u2029\u200f\u2066"),
    ("bad name \udcff", r"bad name \udcff"),  # an undecodable byte of a file name
])
def test_printable_escapes_exactly_what_a_terminal_acts_on(text, shown):
    assert printable(text) == shown


def test_table_cells_from_files_are_printed_escaped(tmp_path, capsys):
    """A class name read from a table file, shown in `norcal table show`'s rich table: escaped."""
    from norcal.core.calibration.tables import CalibrationTable

    name = "\x1b]0;pwned\x07\x1b[2J\u202eEvil"
    path = tmp_path / "t.json"
    CalibrationTable("t", "test", "image", [{"id": 1, "name": name, "image_count": 3, "instance_count": 3},
                                            {"id": 2, "name": "b", "image_count": 9, "instance_count": 9}]).save(path)
    capsys.readouterr()
    assert main(["table", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert r"\x1b]0;pwned\x07" in out  # escaped (the cell may be cut short with an ellipsis)
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out


def test_the_console_keeps_line_breaks_and_markup():
    import io

    from rich.table import Table

    from norcal.cli.terminal import SafeConsole

    buf = io.StringIO()
    console = SafeConsole(file=buf, force_terminal=True, width=80)
    t = Table("a")
    t.add_row("x\x1b[2Jy")
    console.print(t)
    console.print("[bold]two[/bold]\nlines")
    out = buf.getvalue()
    assert r"x\x1b[2Jy" in out and "\x1b[2J" not in out
    assert "two" in out and "[bold]" not in out and "\nlines" in out  # rich's own styles still apply
