"""The ``norcal`` command line: thin subcommands over the library.

Each module in ``norcal.cli.commands`` is one subcommand; it defines ``HELP`` (one line),
``DESCRIPTION`` (the --help text), ``add_arguments(parser)`` and ``run(args) -> int``.
A module may also define ``FLAGS``: library parameter name -> its flag, so that errors the
library raises about a parameter (:attr:`NorcalError.params`) name the flag the user typed.
Errors a user can fix (:class:`NorcalError`) print one line on stderr and exit with 2;
Ctrl-C (SIGINT), SIGTERM and SIGHUP stop a command the same way, with 128 + the signal's
number: 130, 143 and 129.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import re
import signal
import sys
import threading
import warnings

import norcal.cli.commands
from norcal.core.version import __version__
from norcal.core.errors import NorcalError, printable
from norcal.cli.options import COMMON_FLAGS, error_line
from norcal.core.files import stop_signals
from norcal.core.files.outputs import output_run


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors, and values such as ``-1,0.5`` taken as values, not flags."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # argparse only treats "-1" or "-.5" as a value; lists and ranges ("-1,0.5", "-1:2") are
        # values too (no norcal flag starts with a digit), so they reach our validation
        self._negative_number_matcher = re.compile(r"^-\.?\d")
        # no norcal count or size is negative, and no number may be NaN or infinite
        self.register("type", int, _count)
        self.register("type", float, _finite)

    def error(self, message: str):
        self.exit(2, printable(f"error: {self.prog}: {message} (see {self.prog} --help)") + "\n")


def _command_modules():
    for info in sorted(pkgutil.iter_modules(norcal.cli.commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            yield info.name, importlib.import_module(f"norcal.cli.commands.{info.name}")


def _add_command(sub, name, module):
    p = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(p)
    p.set_defaults(_run=module.run, _flags=getattr(module, "FLAGS", {}))


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="norcal",
        description="Bake NorCal long-tail calibration into deployed detectors, run and evaluate them.",
    )
    parser.add_argument("--version", action="version", version=f"norcal-deploy {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND", dest="command")
    for name, module in _command_modules():
        _add_command(sub, name, module)
    return parser


# optional dependencies -> the extra that installs them
_EXTRAS = {"torch": "torch", "torchvision": "torch", "lvis": "eval", "tritonclient": "triton", "ray": "ray",
           "onnxruntime": "cpu"}
_OR = {"onnxruntime": " (or 'norcal-deploy[gpu]' with CUDA)"}  # extras that are alternatives


def say(line: str) -> None:
    """One line on stderr, every character a terminal would act on escaped: errors and warnings
    echo text read from files (a ``_target_``, a file name), which must not drive the terminal."""
    print(printable(line), file=sys.stderr, flush=True)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings as one line each, like errors (the library warns; only the CLI prints)."""
    params = getattr(message, "params", ())
    text = error_line(NorcalError(str(message), param=params), COMMON_FLAGS) if params else message
    say(f"warning: {text}")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``timeout``, ``kill``) or SIGHUP (the terminal closed) raised like
    Ctrl-C, so that a run stopped any of these ways discards its staged outputs."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = signum


# the signals raised as Terminated -> the word the CLI says (SIGHUP: not on Windows)
_TERMINATING = {getattr(signal, name): word for name, word in (("SIGTERM", "terminated"), ("SIGHUP", "hung up"))
                if hasattr(signal, name)}


def _raise_terminated(signum, _frame):
    raise Terminated(signum)


@contextlib.contextmanager
def _signals_interrupt():
    """Within the block SIGTERM and SIGHUP raise :class:`Terminated` (a SIGHUP ignored, as
    under ``nohup``, stays ignored); the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():  # handlers live in the main thread
        yield
        return
    old = {sig: signal.getsignal(sig) for sig in _TERMINATING}
    for sig in old:
        if not (sig != signal.SIGTERM and old[sig] is signal.SIG_IGN):
            signal.signal(sig, _raise_terminated)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _interrupt_behind(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or :class:`Terminated` that caused ``e``, if one did: a signal landing in a C
    extension's import comes back as its error (onnxruntime: "ImportError: initialization
    failed"), and must stop the command like the signal itself."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _dispatch(args: argparse.Namespace) -> int:
    """Run a command: all its outputs land together or not at all; errors are one line, exit 2;
    SIGINT, SIGTERM and SIGHUP stop it with 128 + the signal's number."""
    warnings.showwarning = _show_warning
    run = None
    try:
        try:
            with stop_signals.recording(), _signals_interrupt(), output_run() as run:
                return int(args._run(args) or 0)
        except Exception as e:
            stop = _interrupt_behind(e)
            if stop is None:
                raise
            raise stop from None
    except NorcalError as e:
        say(f"error: {error_line(e, getattr(args, '_flags', None))}")
        return 2
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top not in _EXTRAS:
            raise
        print(f"error: this needs the optional package {top!r}: pip install "
              f"'norcal-deploy[{_EXTRAS[top]}]'{_OR.get(top, '')}", file=sys.stderr)
        return 2
    except OSError as e:  # a disk, permission or path problem met while writing or reading
        where = f"{e.filename}: " if e.filename else ""
        say(f"error: {where}{e.strerror or e}")
        return 2
    except KeyboardInterrupt as e:
        # a signal held during the commit arrives after it: then the outputs are in place
        written = "the outputs were written" if run is not None and run.committed else "nothing was written"
        signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
        print(f"{_TERMINATING.get(signum, 'interrupted')} ({written})", file=sys.stderr)
        return 128 + signum


# what a Ctrl-C before the command started says (the commands' modules load in about a second)
INTERRUPTED = "interrupted (nothing was written)"


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help, --version or a usage error (already printed in one line)
            return int(e.code or 0)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 128 + signal.SIGINT
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return _dispatch(args)


def export_main(argv: list[str] | None = None) -> int:
    """``norcal-export``: the same as ``norcal export``."""
    try:
        from norcal.cli.commands import export as module

        parser = ArgumentParser(prog="norcal-export", description=module.DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(parser)
        parser.set_defaults(_run=module.run, _flags=module.FLAGS)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:
            return int(e.code or 0)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 128 + signal.SIGINT
    return _dispatch(args)
