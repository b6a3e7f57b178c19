"""The one exception type the CLI turns into a single line on stderr and exit status 2."""

from __future__ import annotations

import re
from collections.abc import Sequence


class NorcalError(Exception):
    """A user-facing error: bad input, a mismatch, a missing optional dependency.

    ``param`` names the parameter(s) the message speaks of, as the message spells them
    (``"min_size"``, ``"renormalize=False"``), so that a front end can show its own spelling:
    the CLI shows the matching flag (``--min-size``, ``--no-renormalize``).
    """

    def __init__(self, message: str, param: str | Sequence[str] | None = None):
        super().__init__(message)
        self.params: tuple[str, ...] = (param,) if isinstance(param, str) else tuple(param or ())

    @property
    def param(self) -> str | None:
        """The first parameter the message names, or None."""
        return self.params[0] if self.params else None

    def __reduce__(self):  # keep ``params`` across pickling (multiprocessing, caches)
        return type(self), (str(self), self.params)



def shown(value, limit: int = 60) -> str:
    """``value`` as an error echoes it: its repr, cut to about ``limit`` characters without
    ever building the whole of it (a crafted config can hold a value of gigabytes)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxtuple, r.maxlist, r.maxdict, r.maxset = 3, 6, 6, 6, 6
    r.maxstring = r.maxlong = r.maxother = limit
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# what a terminal would act on rather than show: C0 / C1 controls and DEL (escape sequences that
# clear the screen or set the window title), lone surrogates (undecodable file names), line
# and paragraph separators, and the bidirectional overrides that reorder what is shown
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on written as its Python escape
    (``\\x1b``, ``\\n``, ``\\u202e``): one line, shown as it is, whatever a file put in it."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)
