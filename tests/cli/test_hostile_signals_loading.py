"""Stop signals around a command: SIGTERM and SIGHUP while the CLI imports itself or reads its
flags end it with the same one line as Ctrl-C does there (they ended it with the right status
but no word), and a stopped run ends at once after its line, whatever tearing it down would cost
(a SIGTERM's line was printed and the process still ran 10 s later)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

# a signal sent to itself as the CLI imports ``module``: the fake import finder below makes the
# moment exact (the module's import begins), where a signal sent from outside would be a race
_AT_IMPORT = """
import os, signal, sys

class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), signal.{sig})
        return None

sys.meta_path.insert(0, Finder())
sys.argv = ["norcal", "simulate", "--images", "2", "--train-images", "2", "--json", {out!r}]
from norcal.__main__ import main
sys.exit(main())
"""

# a SIGTERM while the run stages its output, with an exit hook that would hold the process 60 s
_MID_RUN = """
import atexit, os, signal, sys, time
from norcal.core.files import outputs

real = outputs.OutputRun.stage_file

def stage_then_stop(self, dest):
    tmp = real(self, dest)
    os.kill(os.getpid(), signal.SIGTERM)
    return tmp

outputs.OutputRun.stage_file = stage_then_stop
atexit.register(time.sleep, 60)  # stands for a slow teardown (a parse's millions of objects)
sys.argv = ["norcal", "simulate", "--images", "2", "--train-images", "2", "--json", {out!r}]
from norcal.__main__ import main
sys.exit(main())
"""

WORDS = {"SIGTERM": (143, "terminated"), "SIGHUP": (129, "hung up"), "SIGINT": (130, "interrupted")}


def _terminal_signals() -> None:
    """SIGINT and SIGHUP as a terminal's foreground command gets them (the tests may run under
    nohup or in the background, which ignore them, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("module", ["norcal.cli",  # the CLI's own import
                                    "norcal.cli.commands.simulate"])  # the parser, built with every command
@pytest.mark.parametrize("sig", sorted(WORDS))
def test_a_stop_signal_while_the_cli_loads_prints_its_line(tmp_path, module, sig):
    out = tmp_path / "sim.json"
    proc = subprocess.run([sys.executable, "-c", _AT_IMPORT.format(module=module, sig=sig, out=str(out))],
                          capture_output=True, text=True, timeout=120, preexec_fn=_terminal_signals)
    status, word = WORDS[sig]
    assert (proc.returncode, proc.stderr, proc.stdout) == (status, f"{word} (nothing was written)\n", "")
    assert list(tmp_path.iterdir()) == []


def test_a_stopped_run_ends_at_once_after_its_line(tmp_path):
    out = tmp_path / "sim.json"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _MID_RUN.format(out=str(out))], capture_output=True, text=True,
                          timeout=120, preexec_fn=_terminal_signals)
    took = time.monotonic() - start
    assert (proc.returncode, proc.stderr.splitlines()[-1:]) == (143, ["terminated (nothing was written)"])
    assert took < 60, f"ended {took:.0f} s after it started: the 60 s exit hook ran"
    assert list(tmp_path.iterdir()) == []
