"""Compressed RLE strings (a mask's ``counts`` as a string), read as pycocotools reads them.

pycocotools' rleFrString reads 6-bit groups ('0'..'o', the character minus 48), 5 value bits
each, least significant first; 0x20 says another group follows, 0x10 in the last group makes
the value negative; from the fourth run on a value is the run two back plus a delta. It takes
any string: a character outside that alphabet, a string ending inside a run (read past its
end), or runs not covering the mask give a traceback, a hang or a wrong score later, so a file
is checked when it is loaded.
"""

from __future__ import annotations

import re

from norcal.core.errors import NorcalError
from norcal.core.schemas import record_error

_MAX_GROUPS = 6  # pycocotools shifts an int: a 7th group (bits 30..34) overflows it
# what pycocotools can read: runs of up to 5 continuation groups (0x20 set: 'P'..'o') and a last one
# ('0'..'O'); matched in C, ~10x faster than decoding each character in Python
_WELL_FORMED = re.compile(r"(?:[P-o]{0,%d}[0-O])*" % (_MAX_GROUPS - 1))


def decode_counts(counts: str | bytes) -> list[int]:
    """The run lengths a compressed RLE string holds; a NorcalError saying why it holds none."""
    data = counts.encode("ascii") if isinstance(counts, str) and counts.isascii() else counts
    if isinstance(data, str):  # non-ASCII: name the character, not a UTF-8 byte
        p, ch = next((p, ch) for p, ch in enumerate(data) if not ch.isascii())
        raise NorcalError(f"character {ch!r} at {p} is outside pycocotools' RLE alphabet ('0'..'o')")
    runs: list[int] = []
    x = k = 0
    for p, b in enumerate(bytes(data)):
        c = b - 48
        if not 0 <= c <= 63:
            raise NorcalError(f"character {chr(b)!r} at {p} is outside pycocotools' RLE alphabet ('0'..'o')")
        x |= (c & 0x1F) << 5 * k
        k += 1
        if c & 0x20:
            if k == _MAX_GROUPS:
                raise NorcalError(f"run {len(runs)} is longer than {_MAX_GROUPS} characters")
            continue
        if c & 0x10:
            x -= 1 << 5 * k
        if len(runs) > 2:
            x += runs[-2]
        if x < 0:
            raise NorcalError(f"run {len(runs)} is negative ({x})")
        runs.append(x)
        x = k = 0
    if k:
        raise NorcalError("ends inside a run length (its last character says another follows)")
    return runs


def counts_problem(counts: str | bytes, h: int, w: int) -> str | None:
    """Why ``counts`` cannot be an ``h`` x ``w`` mask's compressed RLE, or None."""
    try:
        total = sum(decode_counts(counts))
    except NorcalError as e:
        return str(e)
    if total != h * w:
        return f"RLE counts sum to {total}, not {h} x {w} = {h * w}"
    return None


# Decoding every run in Python costs ~1 us a character: files up to this many records have
# their runs summed against the mask's size too; larger ones (LVIS-scale results, minutes of
# decoding) only have their strings' form checked, which is what pycocotools can read.
FULL_CHECK_RECORDS = 10_000


def _sums_unchecked(n: int) -> bool:
    return n > FULL_CHECK_RECORDS


def check_rle_counts(where: str, section: str, records: list) -> None:
    """Every validated record's compressed ``segmentation`` read against its own ``size``; an
    error names the file, the record and the field (section: the list's key, '' for a list)."""
    for i, r in enumerate(records):
        seg = r.get("segmentation")
        if isinstance(seg, dict) and isinstance(seg["counts"], (str, bytes)):
            h, w = seg["size"]
            counts = seg["counts"] if isinstance(seg["counts"], str) else seg["counts"].decode("latin-1")
            if _WELL_FORMED.fullmatch(counts) and _sums_unchecked(len(records)):
                continue
            problem = counts_problem(seg["counts"], h, w)
            if problem:
                raise record_error(where, section, i, r, "segmentation.counts", problem)
