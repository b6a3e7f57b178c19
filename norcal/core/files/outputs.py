"""All of a run's outputs replaced together, or none: staging next to each destination.

Inside ``with output_run():`` every file written through :func:`norcal.core.files.fileio.atomic_path`
and every folder written through :func:`staged_dir` goes to a temporary sibling of its
destination. Only when the whole run succeeded are the staged outputs moved into place, one
rename each (an existing destination is set aside first and restored if a later rename fails);
a failed or interrupted run deletes what it staged and leaves every existing file as it was.
The commit itself holds SIGINT, SIGTERM and SIGHUP back while it moves files, so a signal at any
moment leaves all the old outputs or all the new ones, never a mix; staging an output holds them
too, so that no staged file is made without the run knowing it (and deleting it).

:func:`check_output_file` / :func:`check_output_dir` check a destination before any work starts
(parent is a folder, writable, the path is not a folder or a file of the wrong kind), so a
mistyped ``-o`` fails in a second, not after a long export; :func:`check_apart` refuses an
output that would overwrite or hold one of the run's inputs.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from norcal.core.files import stop_signals
from norcal.core.errors import NorcalError
from norcal.core.files.stop_signals import STOP_SIGNALS

_ACTIVE: contextvars.ContextVar["OutputRun | None"] = contextvars.ContextVar("norcal_output_run", default=None)


def _os_error(path: Path, e: OSError) -> NorcalError:
    reason = e.strerror or str(e)
    return NorcalError(f"cannot write {path}: {reason}")


# errors a write meets for want of room; the OS gives them no file name (a write has none)
_NO_ROOM = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EFBIG") if hasattr(errno, n))


@contextlib.contextmanager
def naming_write_errors(path: str | os.PathLike) -> Iterator[None]:
    """A full disk or quota met while the block writes ``path``'s content becomes one line
    naming ``path``; every other error passes as it is (it names its own file, or is not the
    write's)."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno in _NO_ROOM:
            raise _os_error(Path(path), e) from None
        raise


def _existing_ancestor(path: Path) -> Path:
    p = path.parent
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _check_parent(path: Path, what: str) -> None:
    anc = _existing_ancestor(path)
    if not anc.is_dir():
        raise NorcalError(f"{what} {path}: {anc} is a file, not a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise NorcalError(f"{what} {path}: cannot write in {anc} (permission denied)")
    # the folder the run will write in, or create the missing ones in
    _probe(anc, what, path)


def _probe(folder: Path, what: str, path: Path) -> None:
    """Create and delete a temp file in ``folder``: the one check that cannot be fooled (/proc, read-only mounts)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".norcal-probe.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise NorcalError(f"{what} {path}: cannot write in {folder} ({e.strerror or e})") from None


def check_output_file(path: str | os.PathLike, what: str = "output") -> Path:
    """Raise unless ``path`` can be written as a file: not a folder, parent a writable folder."""
    p = Path(path)
    if p.is_dir():
        raise NorcalError(f"{what} {p}: is a folder; give a file name")
    if p.exists() and not p.is_file():
        raise NorcalError(f"{what} {p}: exists and is not a regular file")
    _check_parent(p, what)
    return p


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Raise unless ``path`` can be written as a folder: not a file, parent a writable folder."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise NorcalError(f"{what} {p}: is a file, not a folder")
    _check_parent(p, what)
    return p


def check_apart(inputs, files=None, folders=None) -> None:
    """Refuse an output that would overwrite, replace or hold one of the inputs.

    inputs: the paths a run reads, files and folders (None entries and paths that do not exist,
    such as built-in table names, are ignored); files / folders: {name: path or None} of the
    file and folder outputs (``name`` is the parameter, the error's ``param``). Every path is
    resolved first, so symlinks and ``..`` lead to the same answer as the real path. Refused:

    - an output file that is an input file (an output file inside an input folder is allowed:
      callers that read a folder's files pass those files too, so none of them is replaced);
    - an output folder that is an input folder, holds an input (file or folder) at any depth,
      or lies inside an input folder: its files would replace inputs, or become inputs of the
      next run that reads that folder (folders are searched recursively).
    """
    reads = [(Path(p), Path(p).resolve()) for p in inputs if p is not None and os.path.exists(p)]
    for name, path in (files or {}).items():
        if path is None:
            continue
        real = Path(path).resolve()
        for src, src_real in reads:
            if (real == src_real or _same_inode(real, src_real)) and not src_real.is_dir():
                same = "" if str(src) == str(path) else f" {src}"
                raise NorcalError(f"{name} {path} is the input file{same}; choose another "
                                  "(inputs are never modified)", param=name)
    for name, path in (folders or {}).items():
        if path is None:
            continue
        real = Path(path).resolve()
        for src, src_real in reads:
            if real == src_real:
                kind = "folder" if src_real.is_dir() else "file"
                same = "" if str(src) == str(path) else f" {src}"
                problem = f"is the input {kind}{same}"
            elif real in src_real.parents:
                problem = f"holds the input {src}"
            elif src_real.is_dir() and src_real in real.parents:
                problem = f"is inside the input folder {src}"
            else:
                continue
            raise NorcalError(f"{name} {path} {problem}; choose a folder outside the inputs "
                              "(inputs are never modified)", param=name)


def _same_inode(a: Path, b: Path) -> bool:
    """Hard links to one file."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@dataclass
class _Staged:
    dest: Path
    tmp: Path
    is_dir: bool


@dataclass
class OutputRun:
    """The outputs one run has staged, committed together by :func:`output_run`."""

    staged: dict[Path, _Staged] = field(default_factory=dict)
    created_dirs: list[Path] = field(default_factory=list)
    committed: bool = False  # the outputs are in place (a signal held during the commit may follow)

    def _key(self, dest: Path) -> Path:
        return Path(os.path.abspath(dest))

    def inside_staged_dir(self, path: Path) -> bool:
        """True when ``path`` lies in a folder this run is staging (write it directly)."""
        p = self._key(path)
        return any(s.is_dir and (p == s.tmp or s.tmp in p.parents) for s in self.staged.values())

    def _mkparents(self, dest: Path) -> None:
        missing = []
        p = dest.parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except OSError as e:
                raise _os_error(d, e) from None
            self.created_dirs.append(d)

    def stage_file(self, dest: str | os.PathLike) -> Path:
        """The temp path to write ``dest``'s content to (the same one if asked again)."""
        return self._stage(Path(dest), is_dir=False)

    def stage_dir(self, dest: str | os.PathLike) -> Path:
        """An empty temp folder to build ``dest`` in (the same one if asked again)."""
        return self._stage(Path(dest), is_dir=True)

    def _stage(self, dest: Path, is_dir: bool) -> Path:
        key = self._key(dest)
        if key in self.staged:
            return self.staged[key].tmp
        (check_output_dir if is_dir else check_output_file)(dest)
        # a signal between making a folder or the temp file and recording it would leave it behind
        with _signals_held():
            return self._make_staged(key, dest, is_dir)

    def _make_staged(self, key: Path, dest: Path, is_dir: bool) -> Path:
        self._mkparents(dest)
        try:
            if is_dir:
                tmp = tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
            else:
                fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
                os.close(fd)
        except OSError as e:
            raise _os_error(dest, e) from None
        umask = os.umask(0)
        os.umask(umask)
        # mkstemp/mkdtemp make 0600/0700: give the usual modes (a server may read as another user)
        os.chmod(tmp, (0o777 if is_dir else 0o666) & ~umask)
        tmp = Path(os.path.abspath(tmp))  # absolute, so that writes inside it are recognised
        self.staged[key] = _Staged(dest, tmp, is_dir)
        return tmp

    def discard(self) -> None:
        """Delete everything staged and every folder this run created."""
        for s in self.staged.values():
            _remove(s.tmp)
        self.staged.clear()
        for d in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                d.rmdir()  # only if still empty
        self.created_dirs.clear()

    def commit(self) -> None:
        """Move every staged output into place: all of them, or (on any exception, or a SIGINT,
        SIGTERM or SIGHUP arriving before the last move) none, with what was replaced put back.

        A signal that arrives during the commit is held and delivered when it is over: before
        the last move it undoes the commit first, so its handler sees the old outputs.
        """
        while True:
            try:
                with _signals_held() as held:
                    self._commit_once(held)
            except BaseException:
                with _signals_held():  # a second signal must not stop the clean-up half way
                    self.discard()
                raise
            if self.committed:
                return
            # the held signal's handler returned without raising: the run goes on, so commit again

    def _commit_once(self, held: _Held) -> None:
        stop = stop_signals.take()
        if stop in held.handlers and not held:  # its KeyboardInterrupt was lost on the way: deliver it again
            held.append(stop)
            return
        journal: list[tuple[Path, Path]] = []
        try:
            backups = self._move_all(journal)
        except BaseException as e:
            dests = {s.dest for s in self.staged.values()}
            failed = next((p for p in (journal[-1] if journal else ()) if p in dests), Path("?"))
            self._undo(journal)
            if isinstance(e, OSError):
                raise _os_error(failed, e) from None
            raise
        if held:  # a signal came before the last move: its handler must find the old outputs
            self._undo(journal)
            if held.fatal():  # the process ends with it: nothing staged may stay behind
                self.discard()
            return
        # past the point of no return: a signal from here on is delivered after the commit
        self.committed = True
        for backup in backups:
            _remove(backup)
        self.staged.clear()
        self.created_dirs.clear()

    def _move_all(self, journal: list[tuple[Path, Path]]) -> list[Path]:
        """Set each destination aside and rename its staged output onto it; each rename is
        recorded in ``journal`` before it is made, so that :meth:`_undo` can reverse it."""
        backups = []
        for s in self.staged.values():
            if s.dest.exists() or s.dest.is_symlink():
                backup = s.dest.with_name(f".{s.dest.name}.{os.getpid()}.old")
                _remove(backup)
                journal.append((s.dest, backup))
                os.replace(s.dest, backup)
                backups.append(backup)
            journal.append((s.tmp, s.dest))
            os.replace(s.tmp, s.dest)
        return backups

    def _undo(self, journal: list[tuple[Path, Path]]) -> None:
        """Reverse the renames in ``journal``, newest first (the newest may not have happened)."""
        while journal:
            src, dst = journal.pop()
            # before each rename its target was free and its source present
            if not os.path.lexists(src) and os.path.lexists(dst):
                with contextlib.suppress(OSError):  # put back all that can be
                    os.replace(dst, src)


class _Held(list):
    """The signals that arrived while held, and the handlers they will be delivered to."""

    handlers: dict[int, object]

    def fatal(self) -> bool:
        """True when delivering one will end the process (its default action)."""
        return any(self.handlers.get(sig) is signal.SIG_DFL for sig in self)



@contextlib.contextmanager
def _signals_held() -> Iterator[_Held]:
    """Hold :data:`STOP_SIGNALS` back for the block: yield the list of those that arrived, and
    deliver them to their own handlers at its end, also when the block raised (a handler's
    exception then takes the place of the block's).

    Handlers run in the main thread only; elsewhere no signal can interrupt the block, and
    nothing is changed. An ignored signal stays ignored.
    """
    held = _Held()
    held.handlers = {}
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is signal.SIG_IGN or handler is None:  # None: set outside Python; leave it
            continue
        held.handlers[sig] = signal.signal(sig, lambda signum, _frame: held.append(signum))
    try:
        yield held
    finally:
        for sig, handler in held.handlers.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)  # its handler runs now (raises, exits, or returns)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def current_path(path: str | os.PathLike) -> Path:
    """Where ``path``'s content is now: its staged copy while this run stages it, else ``path``.

    For steps that read back an output the same run wrote (verify the exported model, copy it
    into a Triton repository, report its size).
    """
    path = Path(path)
    run = _ACTIVE.get()
    if run is not None:
        staged = run.staged.get(run._key(path))
        if staged is not None:
            return staged.tmp
    return path


def active_run() -> OutputRun | None:
    """The run whose outputs are being staged, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def output_run() -> Iterator[OutputRun]:
    """Stage every output written inside; commit all on success, discard all on any exception."""
    outer = _ACTIVE.get()
    if outer is not None:  # nested: the outermost run commits
        yield outer
        return
    run = OutputRun()
    token = _ACTIVE.set(run)
    try:
        yield run
    except BaseException:
        with _signals_held():  # a second Ctrl-C must not stop the clean-up half way
            run.discard()
        raise
    else:
        run.commit()
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def staged_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp folder to build ``dest`` in; it replaces ``dest`` when the run (or this block) succeeds."""
    with output_run() as run:
        yield run.stage_dir(dest)
