"""A run replaces all its outputs or none, and checks where they go before any work."""

import os

import pytest

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import write_json, write_text
from norcal.core.files.outputs import check_output_dir, check_output_file, output_run, staged_dir


def test_failed_run_leaves_every_existing_output(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.csv"
    a.write_text("old a")
    b.write_text("old b")
    with pytest.raises(RuntimeError):
        with output_run():
            write_json(a, {"new": 1})
            write_text(b, "new b")
            assert a.read_text() == "old a"  # nothing is in place before the run ends
            raise RuntimeError("the last step fails")
    assert a.read_text() == "old a" and b.read_text() == "old b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.csv"]  # no temp left


def test_successful_run_replaces_all(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "sub" / "b.txt"
    a.write_text("old")
    with output_run():
        write_json(a, [1])
        write_text(b, "x")
    assert a.read_text() == "[\n 1\n]\n" and b.read_text() == "x"


def test_failed_run_removes_folders_it_created(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with output_run():
            write_text(tmp_path / "new" / "deeper" / "f.txt", "x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_folder_output_is_replaced_whole(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier run")
    with pytest.raises(ValueError):
        with output_run():
            with staged_dir(out) as d:
                write_text(d / "new.txt", "x")
            raise ValueError
    assert [p.name for p in out.iterdir()] == ["stale.txt"]
    with output_run():
        with staged_dir(out) as d:
            write_text(d / "new.txt", "x")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


def test_commit_failure_restores_replaced_outputs(tmp_path, monkeypatch):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")
    b.write_text("old b")
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if str(dst) == str(b) and str(src).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(NorcalError, match="No space left"):
        with output_run():
            write_text(a, "new a")
            write_text(b, "new b")
    monkeypatch.setattr(os, "replace", real)
    assert a.read_text() == "old a" and b.read_text() == "old b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


@pytest.mark.parametrize("case", ["is_dir", "parent_is_file", "proc"])
def test_bad_locations_are_refused_before_work(tmp_path, case):
    if case == "is_dir":
        path = tmp_path
    elif case == "parent_is_file":
        (tmp_path / "f").write_text("")
        path = tmp_path / "f" / "out.json"
    else:
        path = "/proc/out.json"
    with pytest.raises(NorcalError) as e:
        check_output_file(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_output_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(NorcalError, match="is a file"):
        check_output_dir(f)


def test_relative_folder_output(tmp_path, monkeypatch):
    """A folder given relative to the working directory (the demo's default) stages and lands."""
    monkeypatch.chdir(tmp_path)
    with output_run():
        with staged_dir("rel") as d:
            write_text(d / "inside.txt", "x")  # inside the staged folder: written directly
            assert (d / "inside.txt").read_text() == "x"
    assert (tmp_path / "rel" / "inside.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel"]
