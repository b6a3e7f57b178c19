"""A pytest plugin: the session fails when a test skips or xfails for a reason outside
:data:`ALLOWED`, the few things a machine may lack (TensorRT, a CUDA GPU). A broken install, an
unconditional skip marker, an xfail or a swallowed import then fails the run instead of shrinking
it. tests/conftest.py registers it; tests/core/test_skip_guard.py runs it on each kind of skip."""

from __future__ import annotations

import re

import pytest

# reason (a full match) -> what the machine lacks; every skip in tests/ gives one of these
ALLOWED = {
    r"the tensorrt Python package is not installed": "TensorRT",
    r"could not import 'tensorrt(\.[\w.]+)?': .*": "TensorRT",
    r"no CUDA GPU": "a CUDA GPU",
    # a machine with TensorRT runs the real engine test instead of the no-TensorRT refusal
    r"TensorRT is installed: the engine test in test_tensorrt\.py runs it": "TensorRT's absence",
    # a GPU build of ONNX Runtime has no missing provider to refuse
    r"this onnxruntime build has every provider": "a CPU-only ONNX Runtime",
}

def reason_of(report) -> tuple[str, str]:
    """(kind, reason) of a skipped, xfailed or xpassed report."""
    if hasattr(report, "wasxfail"):
        return ("xpassed" if report.passed else "xfailed"), report.wasxfail.removeprefix("reason: ")
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return "skipped", text.removeprefix("Skipped: ")


def allowed(reason: str) -> bool:
    return any(re.fullmatch(pattern, reason, re.S) for pattern in ALLOWED)


class SkipGuard:
    """Collects every skip and xfail outside :data:`ALLOWED`, fails the session naming each."""

    def __init__(self):
        self.refused: list[str] = []

    def _record(self, report) -> None:
        if report.skipped or hasattr(report, "wasxfail"):
            kind, reason = reason_of(report)
            if not allowed(reason):
                self.refused.append(f"{report.nodeid}: {kind}: {reason}")

    def pytest_runtest_logreport(self, report):
        self._record(report)

    def pytest_collectreport(self, report):
        self._record(report)

    def pytest_sessionfinish(self, session):
        if self.refused and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.refused:
            terminalreporter.section("skips and xfails outside the allow-list (tests/skip_guard.py)", red=True)
            for line in self.refused:
                terminalreporter.line(line, red=True)


def pytest_configure(config):
    config.pluginmanager.register(SkipGuard(), "skip_guard_session")
