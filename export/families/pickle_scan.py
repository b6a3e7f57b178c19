"""What the pickle inside a torch zip checkpoint names, read from its opcodes with pickletools:
nothing is unpickled. The families' ``claims`` (and the Ultralytics loader's refusal of foreign
globals) decide from it; within :func:`scans_reused` each file is scanned once."""

from __future__ import annotations

import contextlib
import pickletools
import zipfile
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

MAX_PICKLE_BYTES = 64 << 20  # a checkpoint's data.pkl holds names and storage keys, not tensors


@dataclass(frozen=True)
class PickleScan:
    """globals: ``module.name`` in the order the pickle names them; strings: every string it
    holds (a state dict's keys among them); complete: False when the pickle is corrupt past
    what was read."""

    globals: tuple[str, ...]
    strings: frozenset[str]
    complete: bool


# the scans kept while :func:`scans_reused` is active, by (resolved path, size, mtime_ns)
_SCANS: ContextVar[dict | None] = ContextVar("norcal_pickle_scans", default=None)


@contextlib.contextmanager
def scans_reused(scans: dict | None = None):
    """Within it, :func:`scan_torch_zip` reads each file once, keeping its scan in ``scans`` (a
    new dict when None; given back): a family's claims and its load share one read."""
    token = _SCANS.set({} if scans is None else scans)
    try:
        yield _SCANS.get()
    finally:
        _SCANS.reset(token)


def scan_torch_zip(path: Path) -> PickleScan | None:
    """The scan of ``path``'s ``data.pkl``; None when ``path`` is no torch zip file (or its
    pickle is over :data:`MAX_PICKLE_BYTES`)."""
    scans = _SCANS.get()
    if scans is None:
        return _scan(path)
    try:
        st = Path(path).stat()
    except OSError:
        return _scan(path)
    # size and mtime in the key: a file rewritten since its scan is read again
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in scans:
        scans[key] = _scan(path)
    return scans[key]


def _scan(path: Path) -> PickleScan | None:
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None or z.getinfo(name).file_size > MAX_PICKLE_BYTES:
                return None
            data = z.read(name)
    except (OSError, zipfile.BadZipFile, KeyError, ValueError):
        return None
    found: list[str] = []
    strings: list[str] = []
    complete = True
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str) and "UNICODE" in op.name:
                strings.append(arg)
    except Exception:  # noqa: BLE001 - a corrupt pickle: what was read so far is the answer
        complete = False
    return PickleScan(tuple(found), frozenset(strings), complete)
