"""The stop signals (SIGINT, SIGTERM, SIGHUP) that reached the process, as the C-level handler
saw them, so that a run never commits its outputs after one arrived.

Python runs a signal's handler only at the main thread's next bytecode; a signal landing while a
C extension works (onnxruntime creating its session) can have its KeyboardInterrupt swallowed
there, and the run would then finish and write its outputs. The interpreter writes each signal's
number to a wakeup file descriptor at delivery, whatever Python code does afterwards:
:func:`recording` installs one, :func:`take` reads it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

# the signals that stop a run (SIGHUP: the terminal closed; not on Windows)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

_pipe: int | None = None  # the read end while recording
_seen: list[int] = []


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Record the stop signals delivered within the block (main thread only; elsewhere a no-op).
    The previous wakeup file descriptor (asyncio's, say) comes back after."""
    global _pipe
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    outer, _pipe = _pipe, read
    seen = _seen[:]
    _seen.clear()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old)
        _pipe = outer
        _seen[:] = seen
        os.close(read)
        os.close(write)


def take() -> int | None:
    """The first stop signal delivered since :func:`recording` began or the last call (None:
    none, or not recording); the others are dropped with it."""
    if _pipe is not None:
        with contextlib.suppress(BlockingIOError):
            while data := os.read(_pipe, 512):
                _seen.extend(b for b in data if b in STOP_SIGNALS)
    first = _seen[0] if _seen else None
    _seen.clear()
    return first
