"""What the pickle inside a torch zip checkpoint names, read from its opcodes with pickletools:
nothing is unpickled. The families' ``claims`` (and the Ultralytics loader's refusal of foreign
globals) decide from it."""

from __future__ import annotations

import pickletools
import zipfile
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


def scan_torch_zip(path: Path) -> PickleScan | None:
    """The scan of ``path``'s ``data.pkl``; None when ``path`` is no torch zip file (or its
    pickle is over :data:`MAX_PICKLE_BYTES`)."""
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
