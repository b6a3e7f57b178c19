"""``python -m norcal`` and the console scripts' entry points: the CLI is imported inside them,
so that a Ctrl-C while it loads ends as one before a command starts does (one line, exit 130)."""

import signal
import sys


def _start(name: str) -> int:
    try:
        import norcal.cli

        entry = getattr(norcal.cli, name)
    except KeyboardInterrupt:
        print("interrupted (nothing was written)", file=sys.stderr)
        return 128 + signal.SIGINT
    return entry()


def main() -> int:
    """``norcal``."""
    return _start("main")


def export_main() -> int:
    """``norcal-export``."""
    return _start("export_main")


if __name__ == "__main__":
    raise SystemExit(main())
