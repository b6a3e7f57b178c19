"""NorCal: normalized calibration of a long-tailed classifier's scores (NeurIPS 2021).

A detector's box classifier gives logits ``phi`` [..., C+1] (C classes and a background).
NorCal divides each foreground class's exponential by ``a_c`` and renormalises::

    p(c|x) = (exp(phi_c) / a_c) / (sum_c' exp(phi_c') / a_c' + exp(phi_bg) * b)

which is ``softmax(phi - log_prior)`` with ``log_prior = [log a_1 .. log a_C, -log b]``.
The paper's Table 3 ablates the mechanism (what a_c scales) and the normalisation; its
supplementary material ablates the same for sigmoid heads (BALMS). Each variant, with ``a``
the factors and ``b`` the background scale (which always multiplies exp(phi_bg))::

    softmax  exp    renormalised  softmax(phi - log_prior)                 (the paper's method)
    softmax  prob   renormalised  the same (mathematically equal, the paper's footnote)
    softmax  logit  renormalised  softmax([phi_c / a_c, phi_bg + log b])
    softmax  exp    raw           exp(phi_c) / a_c,  exp(phi_bg) * b        (no denominator)
    softmax  prob   raw           p(c|x) / a_c,      p(bg|x) * b
    softmax  logit  raw           exp(phi_c / a_c),  exp(phi_bg) * b
    sigmoid  exp    raw           sigmoid(phi_c - log a_c)                  (Sec. 3.4, Eq. 7)
    sigmoid  prob   raw           sigmoid(phi_c) / a_c
    sigmoid  logit  raw           sigmoid(phi_c * a_c)   (supplement: exp(-phi_c * a_c))

Sigmoid heads learn no background logit, so there is nothing to renormalise against: the
paper finds forcing their scores to sum to 1 harmful, and :func:`check_variant` refuses it.
``renormalize=None`` means the head's own form: renormalised for softmax, raw for sigmoid.
Everything works in log space where that keeps values finite; a raw score that exceeds the
dtype's range (exp(phi_c)/a_c for phi_c - log a_c above ~88 in float32) saturates at its
largest finite value. numpy arrays and torch tensors alike (the result has the input's type
and dtype).
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
    _refuse_counts(arr, ~np.isfinite(arr) | (arr <= 0), names, "finite and > 0")
    return arr


def _refuse_counts(arr: np.ndarray, bad: np.ndarray, names: Sequence[str] | None, rule: str) -> None:
    idx = np.flatnonzero(bad)
    if idx.size:
        i = int(idx[0])
        who = f"class {i} ({names[i]!r})" if names is not None else f"class {i}"
        more = f" (and {idx.size - 1} more)" if idx.size > 1 else ""
        raise NorcalError(f"{who} has training count {float(arr[i])}: counts must be {rule}{more}")


def clamp_counts(counts: Sequence[float], min_count: float,
                 names: Sequence[str] | None = None) -> tuple[np.ndarray, int]:
    """Counts below ``min_count`` (zeros included) raised to it: (float64 [C], how many were).

    A negative or non-finite count is still an error naming the class: that is a broken
    table, not a rare class.
    """
    k = float(min_count)
    if not (math.isfinite(k) and k > 0):
        raise NorcalError(f"min_count must be a finite number > 0, got {min_count}", param="min_count")
    arr = np.asarray(counts, dtype=np.float64).reshape(-1).copy()
    _refuse_counts(arr, ~np.isfinite(arr) | (arr < 0), names, "finite and >= 0")
    if arr.size > 1 and k > arr.max():  # every class would weigh the same: NorCal would do nothing
        raise NorcalError(f"min_count {k:g} is above every training count (the largest is {arr.max():g}): "
                          "every class would count the same", param="min_count")
    low = arr < k
    arr[low] = k
    return arr, int(low.sum())


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


def _check_float32(fg: np.ndarray, gamma: float, names: Sequence[str] | None) -> None:
    """The node stores the prior as float32: a log a_c beyond its range would be written as inf."""
    big = np.flatnonzero(np.abs(fg) > np.finfo(np.float32).max)
    if big.size:
        i = int(big[0])
        who = f"class {i} ({names[i]!r})" if names is not None else f"class {i}"
        raise NorcalError(f"gamma {float(gamma):g} makes the prior log a_c of {who} {fg[i]:.3g}, beyond "
                          "float32's range (the graph stores it as float32)", param="gamma")


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
    _check_float32(fg, gamma, names)
    bg = np.array([-math.log(background_scale)])
    if background == "last":
        return np.concatenate([fg, bg])
    if background == "first":
        return np.concatenate([bg, fg])
    return fg


def check_variant(mechanism: str, renormalize: bool | None, activation: str) -> bool:
    """Validate a NorCal variant; return whether it renormalises (None: the head's own form).

    Every mechanism exists with and without renormalisation for softmax heads; sigmoid heads
    have no renormalised form (no background logit to normalise against).
    """
    if mechanism not in MECHANISMS:
        raise NorcalError(f"unknown mechanism {mechanism!r}; choose one of {', '.join(MECHANISMS)}")
    if activation not in ACTIVATIONS:
        raise NorcalError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    if renormalize is None:
        return activation == "softmax"
    if renormalize and activation == "sigmoid":
        raise NorcalError(f"NorCal variant mechanism={mechanism}, renormalize=true, activation=sigmoid "
                          "does not exist: sigmoid heads learn no background logit to normalise against; "
                          "leave renormalize unset (sigmoid scores are never renormalised)")
    return bool(renormalize)


def foreground_mask(num_scores: int, background: str = "last") -> np.ndarray:
    """bool [K]: True at the foreground slots, False at the background slot (if any)."""
    if background not in BACKGROUNDS:
        raise NorcalError(f"background must be one of {', '.join(BACKGROUNDS)}, got {background!r}")
    mask = np.ones(int(num_scores), dtype=bool)
    if background != "none":
        mask[-1 if background == "last" else 0] = False
    return mask


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

    @staticmethod
    def mask(m, like):
        return m

    exp = staticmethod(np.exp)
    where = staticmethod(np.where)


class _TorchOps:
    @staticmethod
    def const(v, like):
        import torch
        if isinstance(v, torch.Tensor):  # may live on a GPU: numpy cannot read it there
            return v.to(dtype=like.dtype, device=like.device)
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

    @staticmethod
    def mask(m, like):
        import torch
        return torch.as_tensor(m, device=like.device)

    @staticmethod
    def where(m, a, b):
        import torch
        return torch.where(m, a, b)


def calibrate(logits, log_prior_: Sequence[float] | np.ndarray, mechanism: str = "exp",
              renormalize: bool | None = None, activation: str = "softmax", background: str = "last"):
    """Calibrated scores from raw classifier logits (the variants are in the module docstring).

    logits: [..., K] numpy array or torch tensor, K = len(log_prior_) (C+1 with a background
    slot whose log prior is -log b, or C for ``background='none'``).
    mechanism: 'exp' scales exp(phi) (the paper's default), 'prob' the probabilities, 'logit'
    the logits. renormalize: None takes the head's own form (softmax: yes, sigmoid: no).
    background: where the background slot is ('last', 'first', 'none'); only the logit
    mechanism treats it apart (b multiplies exp(phi_bg), not phi_bg).
    Returns scores [..., K] of the input's type and dtype.
    """
    renormalize = check_variant(mechanism, renormalize, activation)
    ops = _ops(logits)
    with _quiet(ops):
        lp = _prior_like(ops, log_prior_, logits)
        if mechanism == "prob" and not renormalize:
            if activation == "sigmoid":  # s_c / a_c
                return ops.finite(ops.sigmoid(logits) * ops.finite(ops.exp(-lp)))
            return ops.finite(ops.exp(ops.finite(ops.log_softmax(logits) - lp)))  # p(c|x) / a_c
        z = _log_scores(ops, logits, lp, mechanism, activation, background)
        if activation == "sigmoid":
            return ops.sigmoid(z)
        if renormalize:
            return ops.exp(ops.log_softmax(z))
        return ops.finite(ops.exp(z))  # no denominator: saturate rather than overflow


def calibrated_logits(logits, log_prior_: Sequence[float] | np.ndarray, mechanism: str = "exp",
                      activation: str = "softmax", background: str = "last"):
    """Logits whose plain softmax (renormalised) or sigmoid is NorCal's score.

    Softmax: exp/prob ``phi - log_prior``; logit ``phi_c / a_c`` and ``phi_bg + log b``.
    Sigmoid: exp ``phi_c - log a_c``, logit ``phi_c * a_c``; sigmoid prob scales s_c itself
    and has no such form (refused).
    """
    check_variant(mechanism, None, activation)
    if activation == "sigmoid" and mechanism == "prob":
        raise NorcalError("mechanism=prob, activation=sigmoid scales sigmoid(phi) itself; it has no "
                          "calibrated-logit form (use calibrate)")
    ops = _ops(logits)
    with _quiet(ops):
        return _log_scores(ops, logits, _prior_like(ops, log_prior_, logits), mechanism, activation,
                           background)


def _quiet(ops):
    # numpy: fp16 extremes over/underflow to +-inf on the way; the results stay finite
    return np.errstate(over="ignore", invalid="ignore") if ops is _NumpyOps else contextlib.nullcontext()


def _prior_like(ops, log_prior_, logits):
    lp = ops.const(log_prior_, logits)
    if lp.shape[-1] != logits.shape[-1]:
        raise NorcalError(
            f"log prior has {lp.shape[-1]} entries but the logits have {logits.shape[-1]}"
        )
    return lp


def _log_scores(ops, logits, lp, mechanism, activation, background):
    """The calibrated logits, finite: what the activation (or exp, unnormalised) is applied to."""
    if mechanism != "logit":
        return ops.finite(logits - lp)
    # softmax divides the logits by a_c (Table 3: exp(phi_c / a_c)); sigmoid multiplies them
    # (supplement: exp(-phi_c * a_c)); the factor is kept finite so that 0 * a_c stays 0
    scale = ops.finite(ops.exp(-lp if activation == "softmax" else lp))
    fg = ops.mask(foreground_mask(logits.shape[-1], background), logits)
    return ops.finite(ops.where(fg, ops.finite(logits * scale), logits - lp))


def softmax(logits):
    """Plain softmax over the last axis (NorCal with gamma = 0)."""
    ops = _ops(logits)
    return ops.exp(ops.log_softmax(logits))
