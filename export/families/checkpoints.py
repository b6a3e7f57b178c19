"""Read detectron2 checkpoints without running code from them.

Checkpoints are untrusted input. ``.pth``/``.pt`` files go through
``torch.load(weights_only=True)``; model-zoo ``.pkl`` files (a pickled
``{"model": {name: numpy array}, "__author__": ...}``) go through an unpickler that can
build numpy arrays and plain containers and refuses every other global.
"""

from __future__ import annotations

import collections
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file

TORCH_SUFFIXES = (".pth", ".pt")
PICKLE_SUFFIXES = (".pkl",)

# Buffers detectron2 recomputes at construction time; inference never reads them from a file.
_IGNORED_SUFFIXES = ("num_batches_tracked",)
_IGNORED_PARTS = ("anchor_generator.cell_anchors",)


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(str, "latin1").
    # Only that use is admitted, not arbitrary codecs.
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise _RefusedGlobal(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


def _allowed_globals() -> dict[tuple[str, str], Any]:
    # The objects are taken from numpy directly: names in the file are only looked up in this
    # table, never imported, so a pickle cannot make us import a module.
    from numpy._core import multiarray, numeric

    table = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("_codecs", "encode"): _latin1_encode,
    }
    for mod in ("numpy.core", "numpy._core"):  # numpy 1.x and 2.x spell the module differently
        table[(f"{mod}.multiarray", "_reconstruct")] = multiarray._reconstruct
        table[(f"{mod}.multiarray", "scalar")] = multiarray.scalar
        # protocol 5 pickles arrays via _frombuffer(buffer, dtype, shape, order); it cannot make
        # object arrays (frombuffer refuses them), so it builds plain data only
        table[(f"{mod}.numeric", "_frombuffer")] = numeric._frombuffer
    return table


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds numpy arrays, dicts, lists and scalars, and nothing else."""

    _ALLOWED = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise _RefusedGlobal(_display_name(module, name)) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed")


def _display_name(module: str, name: str) -> str:
    """``module.name``, plus the Python 3 name when the pickle used a Python 2 one (``__builtin__``)."""
    import _compat_pickle  # the stdlib's own py2 -> py3 name table

    raw = f"{module}.{name}"
    if (module, name) in _compat_pickle.NAME_MAPPING:
        new = ".".join(_compat_pickle.NAME_MAPPING[(module, name)])
    elif module in _compat_pickle.IMPORT_MAPPING:
        new = f"{_compat_pickle.IMPORT_MAPPING[module]}.{name}"
    else:
        return raw
    return raw if new == raw else f"{raw} ({new})"


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, qualname: str):
        super().__init__(qualname)
        self.qualname = qualname


def _read_pickle(path: Path) -> Any:
    if zipfile.is_zipfile(path):  # torch.save's format under the model zoo's suffix
        raise NorcalError(f"{path}: a PyTorch (torch.save zip) checkpoint, not a model-zoo pickle: give it "
                          "the .pth suffix")
    try:
        with open(path, "rb") as f:
            # latin1 lets numpy read the raw byte strings of Python 2 pickles (old model zoo files)
            return SafeUnpickler(f, encoding="latin1").load()
    except _RefusedGlobal as e:
        raise NorcalError(
            f"{path}: refused to load: the pickle asks for the global '{e.qualname}', which is not "
            "a numpy array or a plain container (a checkpoint never needs it; the file may be malicious)"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            UnicodeDecodeError, MemoryError, OverflowError) as e:
        raise NorcalError(f"{path}: not a readable pickle checkpoint (truncated or corrupt?): {e}") from None


def _read_torch(path: Path) -> Any:
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "protocol 4 is not the default": noise to users
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses anything but tensors and plain containers; keep the one line that
        # says what was refused (torch's preamble suggests weights_only=False, which we never do)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "unsupported" in ln.lower()), "objects other than tensors")
        hint = "" if zipfile.is_zipfile(path) else \
            " (if this is a model-zoo pickle of numpy arrays, give it the .pkl suffix)"
        raise NorcalError(f"{path}: refused to load with torch.load(weights_only=True): {detail}{hint}") from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError, TypeError,
            AttributeError, IndexError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NorcalError(f"{path}: not a readable PyTorch checkpoint (truncated or corrupt?): {msg}") from None


def _to_tensor(name: str, value: Any, path: Path):
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise NorcalError(f"{path}: weight '{name}' has dtype {value.dtype}; expected a numeric array")
        # copy: arrays from a pickle may be read-only views of the file's bytes
        return torch.from_numpy(np.array(value, copy=True))
    raise NorcalError(f"{path}: entry '{name}' is a {type(value).__name__}, not an array or tensor")


def _model_dict(obj: Any, path: Path) -> dict:
    """The {name: array} mapping inside a loaded checkpoint object."""
    if not isinstance(obj, dict):
        raise NorcalError(f"{path}: expected a dict of weights, found a {type(obj).__name__}")
    if "model" in obj and isinstance(obj["model"], dict):
        return obj["model"]
    if "blobs" in obj:
        raise NorcalError(
            f"{path}: a Caffe2/Detectron1 'blobs' checkpoint; only detectron2 checkpoints are supported "
            "(load it once with detectron2 and save model.state_dict())"
        )
    # a bare state dict, possibly with model-zoo metadata next to the weights
    return {k: v for k, v in obj.items()
            if not (isinstance(k, str) and (k.startswith("__") or k == "matching_heuristics"))}


def read_checkpoint(path) -> dict:
    """All weights of a detectron2 checkpoint as ``{name: torch.Tensor}``, names as saved.

    Only a ``module.`` prefix (DistributedDataParallel) is removed. Use :func:`load_state_dict`
    for what inference needs; this raw form keeps ``num_batches_tracked``, which tells BN
    from FrozenBN.
    """
    path = readable_file(path, "checkpoint")
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        obj = _read_pickle(path)
    elif suffix in TORCH_SUFFIXES:
        obj = _read_torch(path)
    else:
        raise NorcalError(
            f"{path}: unknown checkpoint type '{suffix}'; expected .pth/.pt (torch.save) or .pkl (model zoo)"
        )
    weights = _model_dict(obj, path)
    if not weights:
        raise NorcalError(f"{path}: the checkpoint holds no weights")
    state = {}
    for name, value in weights.items():
        if not isinstance(name, str):
            raise NorcalError(f"{path}: weight name {name!r} is not a string")
        state[name] = _to_tensor(name, value, path)
    # detectron2 strips the prefix only when every key has it; so do we
    if all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    check_finite(state, path)
    return state


def check_finite(state: dict, path) -> None:
    """Refuse a NaN or infinite value in any floating weight (one pass over the weights, a few
    ms for a small model): it would turn every score it touches into NaN, silently."""
    import torch

    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = "NaN" if bool(torch.isnan(t).any()) else "infinite"
            raise NorcalError(f"{path}: weight {name!r} holds {bad} values (a diverged or corrupt checkpoint)")


def clean_state_dict(state: dict) -> dict:
    """Drop entries inference never reads (BN counters, cached anchors); keep pixel_mean/std."""
    return {k: v for k, v in state.items()
            if not k.endswith(_IGNORED_SUFFIXES) and not any(p in k for p in _IGNORED_PARTS)}


def load_state_dict(path) -> dict:
    """Load a detectron2 checkpoint (``.pth`` or model-zoo ``.pkl``) as ``{name: torch.Tensor}``.

    Accepts ``{"model": state_dict}`` (detectron2's format) or a bare state dict. Raises
    :class:`NorcalError` naming the file for a truncated, corrupt or unknown file, and naming
    the refused global for a pickle that tries to run code.
    """
    return clean_state_dict(read_checkpoint(path))

