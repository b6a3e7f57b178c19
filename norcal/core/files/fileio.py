"""Atomic file writes (a temp file in the target's folder, then one rename) and JSON reads."""

from __future__ import annotations

import codecs
import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from norcal.core.datasets.schemas import Schema

CHECKPOINT_SUFFIXES = (".pth", ".pt", ".pkl")  # PyTorch checkpoints (torch.save zip or pickle)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only on success.

    Inside :func:`norcal.core.files.outputs.output_run` the rename waits for the whole run to succeed.
    """
    from norcal.core.files.outputs import active_run, naming_write_errors

    path = Path(path)
    run = active_run()
    if run is not None and not run.inside_staged_dir(path):
        with naming_write_errors(path):
            yield run.stage_file(path)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
    try:
        with naming_write_errors(path):
            yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    write_text(path, json.dumps(obj, indent=indent) + "\n")


_KINDS = ((stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def readable_file(path: str | os.PathLike, what: str = "") -> Path:
    """``path`` if it names a regular file (through any symlinks), else a NorcalError saying
    what it is: no such file, a folder, a FIFO / pipe / device (whose read would block or never
    end), a symlink loop. Every reader of a user's file asks this first; ``what`` names it."""
    from norcal.core.errors import NorcalError

    p = Path(path)
    label = f"{what} {p}" if what else str(p)
    try:
        st = os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NorcalError(f"{label}: symlink loop (a link that leads back to itself)") from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            broken = " (a broken symlink)" if os.path.islink(p) else ""
            raise NorcalError(f"{label}: no such file{broken}") from None
        raise NorcalError(f"{label}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise NorcalError(f"{label}: is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "a special file")
        raise NorcalError(f"{label}: is not a regular file ({kind})")
    return p


def read_json(path: str | os.PathLike, what: str = "", schema: Schema | None = None) -> Any:
    """Parse a JSON file; a missing, non-JSON or folder path is a NorcalError (``what`` names it).

    schema: one of :mod:`norcal.core.datasets.schemas`' formats: the file is parsed and validated in one
    pass, and a bad entry is a NorcalError naming the file, the record and the field.
    """
    from norcal.core.errors import NorcalError

    p = readable_file(path, what)
    label = f"{what} {p}" if what else str(p)
    try:
        if schema is not None:
            raw = p.read_bytes()
            # a UTF-8 byte order mark (Windows editors write one) is read past, as utf-8-sig does
            return schema.validate_json(raw[3:] if raw.startswith(codecs.BOM_UTF8) else raw, str(p))
        with open(p, encoding="utf-8-sig") as f:
            return json.load(f)
    except OSError as e:  # removed or made unreadable since the check
        raise NorcalError(f"{label}: cannot read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise NorcalError(f"{label}: not valid JSON ({e})") from None
    except RecursionError:  # the parsers recurse once per level of nesting
        raise NorcalError(f"{label}: not valid JSON (nested too deeply)") from None


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when two paths name the same file (the second need not exist)."""
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()
