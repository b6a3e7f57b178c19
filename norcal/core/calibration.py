"""NorCal: normalized calibration of a long-tailed classifier's scores (NeurIPS 2021).

A detector's box classifier gives logits ``phi`` [..., C+1] (C classes and a background).
NorCal divides each foreground class's exponential by ``a_c`` and renormalises::

    p(c|x) = (exp(phi_c) / a_c) / (sum_c' exp(phi_c') / a_c' + exp(phi_bg) * b)

which is ``softmax(phi - log_prior)`` with ``log_prior = [log a_1 .. log a_C, -log b]``.
Everything here works in log space, so logits of any magnitude give no overflow or NaN,
for numpy arrays and torch tensors alike (the result has the input's type and dtype).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import numpy as np

from norcal.core.errors import NorcalError

FACTORS = ("cdt", "ens")
MECHANISMS = ("exp", "prob", "logit")
ACTIVATIONS = ("softmax", "sigmoid")
BACKGROUNDS = ("last", "first", "none")


def check_gamma(gamma: float, factor: str = "cdt") -> float:
    """Validate gamma for a factor: CDT needs gamma >= 0, ENS needs 0 <= gamma < 1."""
    if factor not in FACTORS:
        raise NorcalError(f"unknown factor {factor!r}; choose one of {', '.join(FACTORS)}")
    gamma = float(gamma)
    if not math.isfinite(gamma) or gamma < 0:
        raise NorcalError(f"gamma must be a finite number >= 0, got {gamma}")
    if factor == "ens" and gamma >= 1:
        raise NorcalError(f"ENS gamma must lie in [0, 1), got {gamma}")
    return gamma


def check_counts(counts: Sequence[float], names: Sequence[str] | None = None) -> np.ndarray:
    """Return counts as float64 [C]; a zero, negative or non-finite count is an error naming the class."""
    arr = np.asarray(counts, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
        i = int(bad[0])
        who = f"class {i} ({names[i]!r})" if names is not None else f"class {i}"
        more = f" (and {bad.size - 1} more)" if bad.size > 1 else ""
        raise NorcalError(
            f"{who} has training count {float(arr[i])}: counts must be finite and > 0{more}"
        )
    return arr


def log_factors(counts: Sequence[float], gamma: float, factor: str = "cdt",
                names: Sequence[str] | None = None) -> np.ndarray:
    """log a_c per class, float64 [C].

    cdt: a_c = N_c ** gamma.  ens: a_c = (1 - gamma ** N_c) / (1 - gamma) (effective number).
    """
    gamma = check_gamma(gamma, factor)
    n = check_counts(counts, names)
    if factor == "cdt":
        return gamma * np.log(n)
    if gamma == 0.0:
        return np.zeros_like(n)  # (1 - 0**N) / 1 = 1
    # log(1 - g^N) - log(1 - g), both through expm1/log1p to keep precision near g -> 1
    return np.log(-np.expm1(n * math.log(gamma))) - math.log1p(-gamma)


def log_prior(counts: Sequence[float], gamma: float, factor: str = "cdt",
              background: str = "last", background_scale: float = 1.0,
              names: Sequence[str] | None = None) -> np.ndarray:
    """The NorCal node's constant: log a_c for each class, -log b at the background slot.

    Returns float64 [C+1] (background first or last) or [C] for ``background='none'``.
    """
    if background not in BACKGROUNDS:
        raise NorcalError(f"background must be one of {', '.join(BACKGROUNDS)}, got {background!r}")
    if not (math.isfinite(background_scale) and background_scale > 0):
        raise NorcalError(f"background scale must be finite and > 0, got {background_scale}")
    fg = log_factors(counts, gamma, factor, names)
    bg = np.array([-math.log(background_scale)])
    if background == "last":
        return np.concatenate([fg, bg])
    if background == "first":
        return np.concatenate([bg, fg])
    return fg


def check_variant(mechanism: str, renormalize: bool, activation: str) -> None:
    """Refuse a NorCal variant that does not exist (see :func:`calibrate`)."""
    if mechanism not in MECHANISMS:
        raise NorcalError(f"unknown mechanism {mechanism!r}; choose one of {', '.join(MECHANISMS)}")
    if activation not in ACTIVATIONS:
        raise NorcalError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    if mechanism == "logit" and not renormalize and activation == "softmax":
        raise NorcalError("the logit mechanism always renormalises (softmax); drop --no-renormalize")


def _ops(x: Any):
    """Array namespace shim so one implementation serves numpy and torch."""
    if isinstance(x, np.ndarray):
        return _NumpyOps
    try:
        import torch
    except ImportError:  # pragma: no cover - only numpy inputs then
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        return _TorchOps
    raise TypeError(f"expected a numpy array or torch tensor, got {type(x).__name__}")


class _NumpyOps:
    @staticmethod
    def const(v, like):
        return np.asarray(v, dtype=np.float64).astype(like.dtype)

    @staticmethod
    def finite(x):
        info = np.finfo(x.dtype)
        return np.clip(x, info.min, info.max)

    @staticmethod
    def log_softmax(x):
        m = np.max(x, axis=-1, keepdims=True)
        z = x - m
        return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))

    @staticmethod
    def sigmoid(x):
        # exp of -|x| only: never overflows
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)

    exp = staticmethod(np.exp)


class _TorchOps:
    @staticmethod
    def const(v, like):
        import torch
        return torch.as_tensor(np.asarray(v, dtype=np.float64), dtype=like.dtype, device=like.device)

    @staticmethod
    def finite(x):
        import torch
        info = torch.finfo(x.dtype)
        return x.clamp(info.min, info.max)

    @staticmethod
    def log_softmax(x):
        return x.log_softmax(dim=-1)

    @staticmethod
    def sigmoid(x):
        return x.sigmoid()

    @staticmethod
    def exp(x):
        return x.exp()


def calibrate(logits, log_prior_: Sequence[float] | np.ndarray, mechanism: str = "exp",
              renormalize: bool = True, activation: str = "softmax"):
    """Calibrated scores from raw classifier logits.

    logits: [..., K] numpy array or torch tensor, K = len(log_prior_) (C+1 with a background
    slot whose log prior is -log b, or C for background-free sigmoid heads).
    mechanism: 'exp' scales exp(phi) (the paper's default), 'prob' scales the probabilities
    (the same as 'exp' once renormalised), 'logit' divides the logits by a_c.
    Returns probabilities [..., K] of the input's type and dtype.
    """
    check_variant(mechanism, renormalize, activation)
    ops = _ops(logits)
    # numpy: fp16 extremes over/underflow to +-inf on the way; the results stay finite
    quiet = np.errstate(over="ignore", invalid="ignore") if ops is _NumpyOps else contextlib.nullcontext()
    with quiet:
        return _calibrate(ops, logits, log_prior_, mechanism, renormalize, activation)


def _calibrate(ops, logits, log_prior_, mechanism, renormalize, activation):
    lp = ops.const(log_prior_, logits)
    if lp.shape[-1] != logits.shape[-1]:
        raise NorcalError(
            f"log prior has {lp.shape[-1]} entries but the logits have {logits.shape[-1]}"
        )
    if mechanism == "logit":
        z = ops.finite(logits * ops.exp(-lp))
        return ops.sigmoid(z) if activation == "sigmoid" else ops.exp(ops.log_softmax(z))
    if activation == "sigmoid":
        return ops.sigmoid(ops.finite(logits - lp))  # e/(e+1) with e = exp(phi)/a
    if renormalize:
        return ops.exp(ops.log_softmax(ops.finite(logits - lp)))
    # divide the plain softmax probabilities by a_c, no renormalisation
    return ops.exp(ops.finite(ops.log_softmax(logits) - lp))


def softmax(logits):
    """Plain softmax over the last axis (NorCal with gamma = 0)."""
    ops = _ops(logits)
    return ops.exp(ops.log_softmax(logits))
