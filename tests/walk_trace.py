"""The route a fact takes through the product: which modules it passes through, in order.

A fact is carried by values: given ones (a file path, compared by value) or any instance of given
types (the calibration), and, with ``follows_results``, whatever a function that received a
carrier returns (the decoded image, its batch, its detections). A function is on the route when
one of its arguments carries the fact; its module is *entered* when that function's nearest
product caller is in another module. The route is the product modules in the order they are
first entered, recorded only while the walk's ``start`` function runs and until its ``end``
function has returned.

"No module visited twice" is checked on the modules that pass the fact on (those that hand it to
another module of the route): each is entered from one module only. A module that only reads
the fact (a value's own methods, a file check, the scan cache) may be asked by several.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = tuple(str(ROOT / d) + os.sep for d in ("norcal", "export", "runtime"))
_PLAIN = (type(None), bool, int, float, complex, bytes, str)
_LOOK = 64  # elements of a container looked at, two levels deep


def _product(filename: str) -> bool:
    return filename.startswith(PRODUCT)


def module_of(filename: str) -> str:
    return Path(filename).relative_to(ROOT).as_posix()


@dataclass
class Route:
    """The modules a walk entered, in order, and for each the (caller module, function) entries."""

    entries: dict[str, list[tuple[str | None, str]]] = field(default_factory=dict)
    forwards: set[str] = field(default_factory=set)  # modules that handed the fact to another

    @property
    def modules(self) -> list[str]:
        return list(self.entries)

    def revisited(self, hooks=()) -> dict[str, list[str]]:
        """Modules that pass the fact on and are entered from more than one module; ``hooks``:
        (module, function) entries not counted (a callback a module hands down on purpose)."""
        out = {}
        for module in self.forwards:
            callers = sorted({c or "-" for c, name in self.entries[module] if (module, name) not in hooks})
            if len(callers) > 1:
                out[module] = callers
        return out


class _Tracer:
    def __init__(self, values, types, follows_results, start, end):
        self.values = {os.fspath(v) for v in values}
        self.types = tuple(types)
        self.follows = follows_results
        self.start, self.end = start, end
        self.carried: dict[int, object] = {}  # id -> value, kept alive so ids stay unique
        self.live: set[int] = set()  # frames that received a carrier (their returns carry it)
        self.depth = 0  # frames of the start function on the stack
        self.done = False
        self.route = Route()

    def carries(self, v, depth: int = 0) -> bool:
        if self.types and isinstance(v, self.types):
            return True
        if isinstance(v, (str, os.PathLike)):
            try:
                return os.fspath(v) in self.values
            except TypeError:
                return False
        if isinstance(v, _PLAIN):
            return False
        if id(v) in self.carried:
            return True
        if depth >= 2:
            return False
        if isinstance(v, (list, tuple, set, frozenset)):
            items = list(v)[:_LOOK]
        elif isinstance(v, dict):
            items = list(v.values())[:_LOOK]
        else:
            items = list(getattr(v, "__dict__", {}).values())[:_LOOK] if isinstance(
                getattr(v, "__dict__", None), dict) else []
        return any(self.carries(x, depth + 1) for x in items)

    def _keep(self, value) -> None:
        if isinstance(value, _PLAIN):
            return
        self.carried[id(value)] = value
        if isinstance(value, (tuple, list)):
            for x in value[:_LOOK]:
                if not isinstance(x, _PLAIN):
                    self.carried[id(x)] = x

    @staticmethod
    def _caller(frame) -> str | None:
        """The module of the nearest product function below ``frame`` on the stack."""
        caller = frame.f_back
        while caller is not None and not _product(caller.f_code.co_filename):
            caller = caller.f_back
        return module_of(caller.f_code.co_filename) if caller is not None else None

    def _is(self, frame, spec) -> bool:
        return spec is not None and frame.f_code.co_name == spec[1] and \
            module_of(frame.f_code.co_filename) == spec[0] if _product(frame.f_code.co_filename) else False

    def __call__(self, frame, event, arg):
        if self.done or not _product(frame.f_code.co_filename):
            return
        if event == "call" and self._is(frame, self.start):
            self.depth += 1
            entries = self.route.entries.setdefault(self.start[0], [])  # where the fact comes in
            entry = (self._caller(frame), self.start[1])
            if entry not in entries:
                entries.append(entry)
        if event == "return":
            if id(frame) in self.live:
                self.live.discard(id(frame))
                if self.follows and arg is not None:
                    self._keep(arg)
            if self._is(frame, self.start):
                self.depth -= 1
            if self._is(frame, self.end):
                self.done = True
            return
        if event != "call" or self.depth == 0:
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        hits = [self.carries(frame.f_locals.get(n)) for n in names]
        if not any(hits):
            return
        self.live.add(id(frame))
        here, there = module_of(code.co_filename), self._caller(frame)
        if there == here:
            return
        if there is not None and there in self.route.entries:
            self.route.forwards.add(there)
        entries = self.route.entries.setdefault(here, [])
        if (there, code.co_name) not in entries:
            entries.append((there, code.co_name))


@contextmanager
def walk(start: tuple[str, str], end: tuple[str, str] | None = None, values=(), types=(),
         follows_results: bool = False):
    """Trace the route of the fact carried by ``values`` / ``types`` while the function ``start``
    (module path, function name) runs, until ``end`` has returned; yields the :class:`Route`."""
    tracer = _Tracer(values, types, follows_results, start, end)
    previous = sys.getprofile()
    sys.setprofile(tracer)
    threading.setprofile(tracer)  # a reader thread's calls are on the route too
    try:
        yield tracer.route
    finally:
        threading.setprofile(None)
        sys.setprofile(previous)
