"""Ranges for numeric parameters: finite is not enough (a budget of 1e308 GB, a top-K of 10^5,
10^8 threads all crash or hang somewhere deep), so each number has a meaningful bound."""

from __future__ import annotations

import math
import numbers

from norcal.core.errors import NorcalError

MAX_THREADS = 1024  # ONNX Runtime / torch threads per process
MAX_TOPK = 3839  # detections per image: TensorRT's TopK takes K < 3840
MAX_EXPORT_BATCH = 256  # a fixed export batch: the trace runs a batch of that many images
MAX_EXPORT_SIDE = 8192  # a fixed padded input height / width
MAX_TENSOR_VOLUME = 2 ** 31 - 1  # TensorRT: elements per tensor


def check_range(param: str, value, lo: float | None = None, hi: float | None = None,
                integer: bool = False, why: str = ""):
    """``value`` if it is a finite number (a whole one with ``integer``) in [lo, hi], else a
    NorcalError naming ``param``; ``why`` says where the upper bound comes from."""
    ok_type = isinstance(value, numbers.Integral if integer else numbers.Real)
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) \
            or (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = " and ".join(b for b in ((f">= {lo:g}" if lo is not None else ""),
                                          (f"<= {hi:g}" if hi is not None else "")) if b)
        kind = "a whole number" if integer else "a finite number"
        shown = repr(value) if not isinstance(value, float) else f"{value:g}"
        raise NorcalError(f"{param} must be {kind} {bounds}{f' ({why})' if why else ''}, got {shown}",
                          param=param)
    return value
