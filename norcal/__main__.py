"""``python -m norcal`` and the console scripts' entry points: the CLI is imported inside them,
so that a Ctrl-C while it loads ends as one before a command starts does (one line, exit 130)."""

import os
import signal
import sys

_INTERRUPTED = "interrupted (nothing was written)"


def _leave_while_loading(signum, frame) -> None:
    """SIGINT while the CLI loads: nothing ran yet, so leave at once. Raising KeyboardInterrupt
    here is not enough: raised inside a library's callback during its import, it is printed as
    "Exception ignored" and lost, and the run went on (seen at onnx's import)."""
    os.write(2, f"{_INTERRUPTED}\n".encode())
    os._exit(128 + signal.SIGINT)


def _start(name: str) -> int:
    # a shell that ignores SIGINT for this process (a background job) is obeyed as before
    loading = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if loading:
        signal.signal(signal.SIGINT, _leave_while_loading)
    try:
        import norcal.cli

        entry = getattr(norcal.cli, name)
    except KeyboardInterrupt:  # a signal before the handler above took over
        print(_INTERRUPTED, file=sys.stderr, flush=True)
        os._exit(128 + signal.SIGINT)
    finally:
        if loading:  # from here Ctrl-C is a KeyboardInterrupt: the commands clean up their outputs
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return entry()


def main() -> int:
    """``norcal``."""
    return _start("main")


def export_main() -> int:
    """``norcal-export``."""
    return _start("export_main")


if __name__ == "__main__":
    raise SystemExit(main())
