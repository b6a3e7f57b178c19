"""``python -m norcal`` and the console scripts' entry points: the CLI is imported inside them,
so that a Ctrl-C while it loads ends as one before a command starts does (one line, exit 130)."""

import os
import signal
import sys


def _start(name: str) -> int:
    try:
        import norcal.cli

        entry = getattr(norcal.cli, name)
    except KeyboardInterrupt:
        print("interrupted (nothing was written)", file=sys.stderr, flush=True)
        # leave now: nothing ran yet, and the interpreter's own shutdown could still end the
        # process by the signal (exit -2, seen once on a loaded machine) instead of 130
        os._exit(128 + signal.SIGINT)
    return entry()


def main() -> int:
    """``norcal``."""
    return _start("main")


def export_main() -> int:
    """``norcal-export``."""
    return _start("export_main")


if __name__ == "__main__":
    raise SystemExit(main())
