"""The session guard (tests/skip_guard.py) fails a run on every kind of skip or xfail a test can
spell, naming each, and lets through only what a machine may lack (TensorRT, a CUDA GPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
SKIP = "importor" + "skip"  # spelled in two pieces: a grep of tests/ for skipped imports finds real ones only

REFUSED = {
    "test_marked_skip": '@pytest.mark.skip(reason="later")\ndef test_marked_skip():\n    pass\n',
    "test_marked_xfail": '@pytest.mark.xfail(reason="broken")\ndef test_marked_xfail():\n    assert False\n',
    "test_xpassed": '@pytest.mark.xfail(reason="flaky")\ndef test_xpassed():\n    pass\n',
    "test_skip_call": 'def test_skip_call():\n    pytest.skip("not today")\n',
    "test_import_module_swallowed": (
        "def test_import_module_swallowed():\n    try:\n"
        "        importlib.import_module('norcal_no_such_module')\n"
        "    except ImportError:\n        pytest.skip('optional')\n"),
    "test_importorskip_variable": (
        f"def test_importorskip_variable():\n    name = 'norcal_no_such_module'\n    pytest.{SKIP}(name)\n"),
}
ALLOWED = {
    "test_no_tensorrt": ('@pytest.mark.skipif(True, reason="the tensorrt Python package is not installed")\n'
                         "def test_no_tensorrt():\n    pass\n"),
    "test_no_gpu": 'def test_no_gpu():\n    pytest.skip("no CUDA GPU")\n',
    "test_tensorrt_import": f"def test_tensorrt_import():\n    pytest.{SKIP}('tensorrt.plugin_lib_x')\n",
}


def run_guarded(tmp_path: Path, tests: dict[str, str], module_level: str = "") -> subprocess.CompletedProcess:
    """pytest, with the guard plugin, on a file holding ``tests`` (and a second file that skips
    at collection, when ``module_level`` is given)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: not this project's settings
    (tmp_path / "test_forms.py").write_text("import importlib\n\nimport pytest\n\n\n" + "\n\n".join(tests.values()))
    if module_level:
        (tmp_path / "test_collect.py").write_text(f"import pytest\n\n{module_level}\n\n\ndef test_x():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "skip_guard",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_every_kind_of_skip_fails_the_session_by_name(tmp_path):
    r = run_guarded(tmp_path, {**REFUSED, **ALLOWED}, f"pytest.{SKIP}('norcal_no_such_module')")
    # no test failed: the guard alone fails the session
    assert r.returncode == pytest.ExitCode.TESTS_FAILED and " failed" not in r.stdout, r.stdout + r.stderr
    summary = r.stdout.split("skips and xfails outside the allow-list")[1]
    refused = [line for line in summary.splitlines() if line.startswith("test_")]
    assert sorted(refused) == sorted([
        "test_collect.py: skipped: could not import 'norcal_no_such_module': No module named 'norcal_no_such_module'",
        "test_forms.py::test_marked_skip: skipped: later",
        "test_forms.py::test_marked_xfail: xfailed: broken",
        "test_forms.py::test_xpassed: xpassed: flaky",
        "test_forms.py::test_skip_call: skipped: not today",
        "test_forms.py::test_import_module_swallowed: skipped: optional",
        "test_forms.py::test_importorskip_variable: skipped: could not import 'norcal_no_such_module': "
        "No module named 'norcal_no_such_module'",
    ]), r.stdout


def test_what_a_machine_may_lack_passes(tmp_path):
    r = run_guarded(tmp_path, ALLOWED)
    assert r.returncode == pytest.ExitCode.OK, r.stdout + r.stderr
    assert "3 skipped" in r.stdout and "allow-list" not in r.stdout


def test_a_failing_run_keeps_its_failure(tmp_path):
    r = run_guarded(tmp_path, {"test_fails": "def test_fails():\n    assert False\n", **REFUSED})
    assert r.returncode == pytest.ExitCode.TESTS_FAILED and "1 failed" in r.stdout, r.stdout
