"""``python -m norcal`` and the console scripts' entry points: the CLI is imported inside them,
so that a stop signal while it loads ends as one before a command starts does (one line, exit
128 + the signal's number: SIGINT 130, SIGTERM 143, SIGHUP 129)."""

import os
import signal
import sys

# the line each stop signal prints before a command started (the CLI's own words for them)
_WORDS = {getattr(signal, name): word for name, word in
          (("SIGINT", "interrupted"), ("SIGTERM", "terminated"), ("SIGHUP", "hung up")) if hasattr(signal, name)}
_STOPPED = {128 + signum for signum in _WORDS}  # the exit statuses of a command stopped by one


def _leave_while_loading(signum, frame) -> None:
    """A stop signal while the CLI loads or reads its flags: nothing ran yet, so leave at once.
    Raising KeyboardInterrupt here is not enough: raised inside a library's callback during its
    import, it is printed as "Exception ignored" and lost, and the run went on (seen at onnx's
    import); SIGTERM and SIGHUP left unhandled end the process with no line at all."""
    os.write(2, f"{_WORDS.get(signum, 'interrupted')} (nothing was written)\n".encode())
    os._exit(128 + signum)


def _loading_handlers() -> dict:
    """Install :func:`_leave_while_loading` for each stop signal the process would otherwise die
    of or be interrupted by; a signal the shell ignores for it (a background job's SIGINT,
    ``nohup``'s SIGHUP) or another handler stays as it is. Returns {signal: old handler}."""
    wanted = {signal.SIGINT: signal.default_int_handler}
    wanted.update({sig: signal.SIG_DFL for sig in _WORDS if sig != signal.SIGINT})
    old = {sig: signal.getsignal(sig) for sig in wanted if signal.getsignal(sig) is wanted[sig]}
    for sig in old:
        signal.signal(sig, _leave_while_loading)
    return old


def _start(name: str) -> int:
    old = _loading_handlers()
    try:
        import norcal.cli

        entry = getattr(norcal.cli, name)
    except KeyboardInterrupt:  # a signal before the handler above took over
        _leave_while_loading(signal.SIGINT, None)
    finally:
        # from here Ctrl-C is a KeyboardInterrupt: the commands clean up their outputs. SIGTERM
        # and SIGHUP keep leaving at once until the command installs its own handlers (while
        # the flags are read nothing can be written)
        if signal.SIGINT in old:
            signal.signal(signal.SIGINT, old[signal.SIGINT])
    status = entry()
    if status in _STOPPED:
        # stopped: its line is printed and its outputs discarded; tearing down what a run had
        # built (a parse's millions of objects) can take longer than a scheduler's grace period
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def main() -> int:
    """``norcal``."""
    return _start("main")


def export_main() -> int:
    """``norcal-export``."""
    return _start("export_main")


if __name__ == "__main__":
    raise SystemExit(main())
