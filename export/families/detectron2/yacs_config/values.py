"""Typed, checked access to a merged detectron2 config: each value read as what it must be
(integer, finite number in range, flag, list, norm), refused otherwise naming the file, key and value."""

from __future__ import annotations

import math
from typing import Any

from norcal.core.errors import NorcalError, shown

# every BatchNorm flavour is a fixed affine map at inference; SyncBN's variants act as SyncBN
_NORMS = {"": "", "FrozenBN": "FrozenBN", "BN": "BN", "SyncBN": "SyncBN", "naiveSyncBN": "SyncBN",
          "nnSyncBN": "SyncBN", "GN": "GN"}
# detectron2's channels-first LayerNorm, which ViTDet's configs give the FPN and the ROI heads
_LAYER_NORM = {"LN": "LN"}


# a top-level key of a mapped LazyConfig: {yaml-era key: the key path in the file it came from},
# so that a value refused by its yaml-era key is named as the file spells it
KEY_PATHS = "KEY_PATHS"


class ConfigValues:
    """A merged config (nested dict) read key by key (``MODEL.RPN.NMS_THRESH``); ``source`` names it in errors."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def get(self, key: str) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise NorcalError(f"{self.source}: config key {key} is missing")
            node = node[part]
        return node

    def bad(self, key: str, why: str) -> NorcalError:
        paths = self.data.get(KEY_PATHS)
        named = paths.get(key, key) if isinstance(paths, dict) else key
        return NorcalError(f"{self.source}: {named}: {shown(self.get(key))}: {why}")

    def int(self, key: str, minimum: int | None = None, maximum: int | None = None, why: str = "") -> int:
        """A whole number in [minimum, maximum] where they are given; ``why`` says where the
        maximum comes from (a value that sizes memory or time is bounded, not only typed)."""
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise self.bad(key, "expected an integer")
        if minimum is not None and v < minimum:
            raise self.bad(key, f"must be >= {minimum}")
        if maximum is not None and v > maximum:
            raise self.bad(key, f"must be <= {maximum}{f' ({why})' if why else ''}")
        return v

    def float(self, key: str, lo: float | None = None, hi: float | None = None,
              hi_open: bool = False) -> float:
        """A finite number, in [lo, hi] (or [lo, hi) with ``hi_open``) where they are given."""
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(key, "expected a number")
        v = float(v)
        # NaN compares false with every threshold: a NaN score threshold would drop every detection
        if not math.isfinite(v):
            raise self.bad(key, "expected a finite number")
        if (lo is not None and v < lo) or (hi is not None and (v >= hi if hi_open else v > hi)):
            raise self.bad(key, f"expected {lo:g} <= value {'<' if hi_open else '<='} {hi:g}" if hi is not None
                           else f"must be >= {lo:g}")
        return v

    def bool(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            raise self.bad(key, "expected true or false")
        return v

    def str(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise self.bad(key, "expected a string")
        return v

    def seq(self, key: str) -> list:
        v = self.get(key)
        if not isinstance(v, (list, tuple)):
            raise self.bad(key, "expected a list")
        return list(v)

    def floats(self, key: str, length: int | None = None, positive: bool = False,
               why_positive: str = "") -> tuple[float, ...]:
        v = self.seq(key)
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v):
            raise self.bad(key, "expected a list of numbers")
        if length is not None and len(v) != length:
            raise self.bad(key, f"expected {length} numbers")
        if not all(math.isfinite(x) for x in v):
            raise self.bad(key, "expected finite numbers")
        if positive and not all(x > 0 for x in v):
            raise self.bad(key, f"expected positive numbers ({why_positive})")
        return tuple(float(x) for x in v)

    def float_lists(self, key: str) -> tuple[tuple[float, ...], ...]:
        v = self.seq(key)
        ok = v and all(isinstance(r, (list, tuple)) and r and
                       all(not isinstance(x, bool) and isinstance(x, (int, float)) for x in r) for r in v)
        if not ok:
            raise self.bad(key, "expected a non-empty list of non-empty lists of numbers")
        if not all(math.isfinite(x) and x > 0 for r in v for x in r):
            raise self.bad(key, "expected positive finite numbers")
        return tuple(tuple(float(x) for x in r) for r in v)

    def norm(self, key: str, layer_norm: bool = False) -> str:
        """The norm at ``key`` by detectron2's name; ``layer_norm``: LN is one (FPN and heads)."""
        v, known = self.str(key), {**_NORMS, **(_LAYER_NORM if layer_norm else {})}
        if v not in known:
            raise self.bad(key, f"unsupported norm; supported: {', '.join(repr(n) for n in known)}")
        return known[v]

    def require(self, key: str, allowed, why: str = "not supported") -> None:
        """Raise unless the value is ``allowed`` (or one of a tuple of allowed values)."""
        v = self.get(key)
        v = list(v) if isinstance(v, tuple) else v
        options = list(allowed) if isinstance(allowed, tuple) else [allowed]
        # bools must match as bools: YAML's true is not the integer 1
        if not any(v == o and isinstance(v, bool) == isinstance(o, bool) for o in options):
            raise self.bad(key, f"{why} (supported: {', '.join(repr(o) for o in options)})")

