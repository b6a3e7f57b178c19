"""A run's commit is all or nothing under Ctrl-C, SIGTERM and SIGHUP, whenever they arrive.

The commit moves each staged output into place with os.replace (an existing destination is
first set aside). Each test breaks the k-th os.replace of the commit, for every k: it raises
KeyboardInterrupt before or after renaming, or sends SIGINT / SIGTERM to this process right
after renaming; the folder must then hold exactly the old outputs (or, where the run goes
on, exactly the new ones), with no staged or set-aside file left. A signal while an output
is being staged leaves no staged file either.
"""

import os
import signal

import pytest

from norcal.core.files import outputs
from norcal.core.files.fileio import write_text
from norcal.core.files.outputs import output_run, staged_dir


class Stop(Exception):
    """What the test's SIGTERM handler raises."""


def _old_state(root):
    (root / "a.txt").write_text("old a")
    (root / "plots").mkdir()
    (root / "plots" / "old.png").write_text("old plot")
    (root / "c.txt").write_text("old c")


def _write_new(root):
    """One run: replaces a file, a whole folder and a second file, creates a file in a new folder."""
    write_text(root / "a.txt", "new a")
    with staged_dir(root / "plots") as d:
        write_text(d / "new.png", "new plot")
    write_text(root / "c.txt", "new c")
    write_text(root / "fresh" / "b.txt", "new b")


def _tree(root):
    """Every path under root (hidden ones too), with file contents."""
    return {str(p.relative_to(root)): (p.read_text() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def states(tmp_path):
    """(old tree, new tree, the number of os.replace calls a clean commit makes)."""
    old_root, new_root = tmp_path / "ref_old", tmp_path / "ref_new"
    for r in (old_root, new_root):
        r.mkdir()
        _old_state(r)
    calls = []
    real = os.replace

    def counting(src, dst):
        calls.append(dst)
        return real(src, dst)

    try:
        with output_run():
            _write_new(new_root)
            os.replace = counting  # only the commit, which follows, renames
    finally:
        os.replace = real
    new = _tree(new_root)
    assert new == {"a.txt": "new a", "c.txt": "new c", "fresh": "dir", "fresh/b.txt": "new b",
                   "plots": "dir", "plots/new.png": "new plot"}
    # a.txt, plots, c.txt set aside and replaced, b.txt created
    assert len(calls) == 7
    return _tree(old_root), new, len(calls)


@pytest.fixture
def handlers():
    """SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP raise Stop, as in the CLI; restored after."""
    def stop(_signum, _frame):
        raise Stop

    old = (signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(signal.SIGTERM, stop),
           signal.signal(signal.SIGHUP, stop))
    yield
    signal.signal(signal.SIGINT, old[0])
    signal.signal(signal.SIGTERM, old[1])
    signal.signal(signal.SIGHUP, old[2])


def _break_kth(monkeypatch, k, how):
    real = os.replace
    n = [0]

    def broken(src, dst):
        n[0] += 1
        if n[0] != k:
            return real(src, dst)
        if how == "raise before":
            raise KeyboardInterrupt
        real(src, dst)
        if how == "raise after":
            raise KeyboardInterrupt
        os.kill(os.getpid(), getattr(signal, how))

    monkeypatch.setattr(os, "replace", broken)


@pytest.mark.parametrize("how", ["raise before", "raise after", "SIGINT", "SIGTERM", "SIGHUP"])
def test_interrupt_at_every_step_of_the_commit_leaves_the_old_outputs(tmp_path, monkeypatch, states,
                                                                      handlers, how):
    old, _new, steps = states
    expected = Stop if how in ("SIGTERM", "SIGHUP") else KeyboardInterrupt
    for k in range(1, steps + 1):
        root = tmp_path / f"k{k}"
        root.mkdir()
        _old_state(root)
        with pytest.raises(expected):
            with output_run():
                _write_new(root)
                _break_kth(monkeypatch, k, how)
        monkeypatch.undo()
        assert _tree(root) == old, f"interrupted at rename {k} of {steps}"


def test_signal_whose_handler_returns_lets_the_commit_finish(tmp_path, monkeypatch, states):
    """A SIGTERM handler that only notes the signal: the run goes on, so its outputs land."""
    _old, new, steps = states
    seen = []
    old_handler = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    try:
        for k in range(1, steps + 1):
            root = tmp_path / f"k{k}"
            root.mkdir()
            _old_state(root)
            with output_run() as run:
                _write_new(root)
                _break_kth(monkeypatch, k, "SIGTERM")
            monkeypatch.undo()
            assert run.committed and _tree(root) == new, f"signal at rename {k} of {steps}"
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    assert seen == [signal.SIGTERM] * steps  # each delivered once, after the commit


def test_signal_after_the_last_rename_comes_after_all_new_outputs(tmp_path, monkeypatch, states, handlers):
    """Once every output is in place the commit completes (set-aside copies deleted), then
    the held signal is delivered, and the run says it committed."""
    _old, new, _steps = states
    root = tmp_path / "run"
    root.mkdir()
    _old_state(root)
    real = outputs._remove

    def remove_then_signal(path):
        if path.name.endswith(".old") and path.exists():  # a set-aside destination, after the renames
            os.kill(os.getpid(), signal.SIGTERM)
        real(path)

    monkeypatch.setattr(outputs, "_remove", remove_then_signal)
    run = None
    with pytest.raises(Stop):
        with output_run() as run:
            _write_new(root)
    assert run.committed and _tree(root) == new


def test_second_signal_during_the_clean_up_of_a_failed_run(tmp_path, monkeypatch, handlers):
    """Ctrl-C while a failed run deletes what it staged: the clean-up still completes."""
    root = tmp_path / "run"
    root.mkdir()
    _old_state(root)
    old = _tree(root)
    real = outputs._remove

    def remove_with_signal(path):
        os.kill(os.getpid(), signal.SIGINT)
        real(path)

    with pytest.raises(KeyboardInterrupt):
        with output_run():
            _write_new(root)
            monkeypatch.setattr(outputs, "_remove", remove_with_signal)
            raise ValueError("the run fails")
    assert _tree(root) == old


_SCRIPT = """
import os, signal, sys
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from test_outputs_signals import _write_new
from norcal.core.files.outputs import output_run

sig = getattr(signal, sys.argv[4])
signal.signal(sig, signal.SIG_DFL)  # no handler: the signal ends the process
root, k = Path(sys.argv[1]), int(sys.argv[2])
real, n = os.replace, [0]

def replace(src, dst):
    real(src, dst)
    n[0] += 1
    if n[0] == k:
        os.kill(os.getpid(), sig)

with output_run():
    _write_new(root)
    os.replace = replace
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_signal_without_handler_ends_the_process_with_the_old_outputs(tmp_path, states, name):
    """No handler (a library caller's process): SIGTERM or SIGHUP during the commit still ends
    the process, after the commit has been undone and its staged files deleted."""
    import subprocess
    import sys
    from pathlib import Path

    old, _new, steps = states
    for k in range(1, steps + 1):
        root = tmp_path / f"k{k}"
        root.mkdir()
        _old_state(root)
        proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(root), str(k), str(Path(__file__).parent),
                               name], capture_output=True, text=True, timeout=120)
        assert proc.returncode == -getattr(signal, name), proc.stderr
        assert _tree(root) == old, f"{name} at rename {k} of {steps}"


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("step", ["chmod", "mkdir"])
def test_signal_while_an_output_is_staged_leaves_no_staged_file(tmp_path, monkeypatch, handlers, name, step):
    """A signal right after the staged file (or a missing parent folder) is made, before the
    run has recorded it: the run still deletes it."""
    real = {"chmod": os.chmod, "mkdir": os.mkdir}[step]

    def then_signal(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getpid(), getattr(signal, name))

    with pytest.raises(KeyboardInterrupt if name == "SIGINT" else Stop):
        with output_run():
            monkeypatch.setattr(os, step, then_signal)
            write_text(tmp_path / "new" / "a.txt", "a")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
