"""Read an Ultralytics checkpoint (``best.pt``, ``last.pt``, ``model.save()``) without running
code from it.

An Ultralytics ``.pt`` (YOLO or RT-DETR) is ``torch.save`` of a dict holding the model as pickled ``nn.Module``
objects (keys ``model`` / ``ema``, ``train_args``, ``date``, ...). Approach: ``torch.load`` with
``weights_only=True`` (torch's restricted unpickler: tensors, storages, plain containers) and an
allow-list added through ``torch.serialization.safe_globals``: the ``nn.Module`` classes defined in
``ultralytics.nn.modules.*`` and ``torch.nn.modules.*``, the task models of :data:`TASKS`,
Ultralytics' ``IterableSimpleNamespace`` (the model's ``args``) and numpy's scalar reconstruction
(training metrics). The classes are taken from the installed packages, so the file only chooses
among them: any other global (``os.system``, ``builtins.eval``, another class) is refused in one
line naming the file and the global, before any object is built. The modules' ``forward`` code is
the installed Ultralytics, never the file's.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file
from norcal.export.families.pickle_scan import scan_torch_zip

# The task models this loader builds (YOLOv8 / YOLO11 detect and segment, RT-DETR). RT-DETR's
# task class is the only global it adds: its layers (HGStem, HGBlock, RepC3, AIFI, the
# RTDETRDecoder with its deformable-attention decoder and MLPs) are nn.Modules of
# ultralytics.nn.modules, and the torch layers it uses besides YOLO's (MultiheadAttention with
# its NonDynamicallyQuantizableLinear, LayerNorm, Embedding, GELU) are torch.nn.modules classes,
# both already allowed below; a trainer strips its loss (RTDETRDetectionLoss) before saving.
TASKS = ("DetectionModel", "SegmentationModel", "RTDETRDetectionModel")
RTDETR_TASK = "RTDETRDetectionModel"
_TASK_MODULE = "ultralytics.nn.tasks"


def import_ultralytics():
    """The ``ultralytics`` package, kept offline; a one-line error when the extra is missing."""
    os.environ.setdefault("YOLO_OFFLINE", "1")  # never let it reach the network (settings sync, downloads)
    import numpy as np
    from PIL import Image

    pil_open, np_print, filters = Image.open, np.get_printoptions(), warnings.filters[:]
    try:
        import ultralytics
        import ultralytics.utils.patches  # noqa: F401 - the module that patches PIL on import
    except ImportError:
        raise NorcalError("Ultralytics checkpoints need the ultralytics package: pip install "
                          "'norcal-deploy[ultralytics]'") from None
    finally:
        # Ultralytics replaces PIL's Image.open process-wide on import (an unidentified file then
        # makes it install and import a HEIF plugin), and sets numpy's and torch's print options
        # and warning filters: the rest of the process keeps its own
        Image.open = pil_open
        np.set_printoptions(**np_print)
        warnings.filters[:] = filters
        if "torch" in sys.modules:
            sys.modules["torch"].set_printoptions(profile="default")
    return ultralytics


def pickle_globals(path: Path) -> list[str] | None:
    """The ``module.name`` globals the pickle inside a torch zip checkpoint names, read from its
    opcodes without unpickling; None when ``path`` is not a torch zip archive."""
    scan = scan_torch_zip(path)
    if scan is None or not (scan.globals or scan.complete):
        return None
    return list(scan.globals)


def task_of(path: Path) -> str | None:
    """The Ultralytics task model class a checkpoint pickles (``DetectionModel``, ...), or None."""
    names = pickle_globals(path) or []
    tasks = [n.rsplit(".", 1)[1] for n in names if n.startswith(_TASK_MODULE + ".")]
    return tasks[0] if tasks else None


def _module_classes(package) -> list[type]:
    import inspect

    import torch

    return [obj for _, obj in inspect.getmembers(package, inspect.isclass)
            if issubclass(obj, torch.nn.Module) and obj.__module__.startswith(package.__name__)]


def _allowed() -> list:
    import importlib
    import pkgutil

    import numpy as np
    import torch

    import_ultralytics()
    import ultralytics.nn.modules as umods
    import ultralytics.nn.tasks as tasks
    from ultralytics.utils import IterableSimpleNamespace

    allowed: list = [getattr(tasks, t) for t in TASKS] + [IterableSimpleNamespace]
    for info in pkgutil.iter_modules(umods.__path__):
        allowed += _module_classes(importlib.import_module(f"{umods.__name__}.{info.name}"))
    for info in pkgutil.iter_modules(torch.nn.modules.__path__):
        allowed += _module_classes(importlib.import_module(f"torch.nn.modules.{info.name}"))
    # numpy scalars (best_fitness, train_metrics): the reconstruct helper and the dtypes
    from numpy._core.multiarray import scalar
    allowed += [scalar, np.dtype]
    allowed += [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    return allowed


_REFUSED = re.compile(r"GLOBAL\s+([\w.]+)")


def _global_name(raw: str) -> str:
    """``module.name`` as Python 3 spells it (protocol-2 pickles say ``__builtin__.set``)."""
    import _compat_pickle

    module, _, name = raw.rpartition(".")
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


def _refuse(p: Path, name: str) -> NorcalError:
    return NorcalError(f"{p}: refused to load: the pickle asks for the global '{name}', which is not an "
                       "Ultralytics or torch.nn model class (the file may be malicious)")


def read_ultralytics_checkpoint(path) -> dict:
    """The checkpoint dict of an Ultralytics ``.pt`` (safely: see the module docstring)."""
    import torch
    from torch._weights_only_unpickler import _get_allowed_globals

    p = readable_file(path, "checkpoint")
    allowed = _allowed()
    names = set(_get_allowed_globals()) | {f"{a.__module__}.{a.__qualname__}" for a in allowed}
    # name the first foreign global ourselves (torch's message is many lines of advice)
    for raw in pickle_globals(p) or ():
        if _global_name(raw) not in names:
            raise _refuse(p, _global_name(raw))
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(allowed):
            warnings.simplefilter("ignore")
            ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a bad file; one line each
        text = str(e)
        if m := _REFUSED.search(text):
            raise _refuse(p, m.group(1)) from None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        detail = next((ln for ln in lines if ln.lower().startswith("unsupported")),
                      lines[0] if lines else type(e).__name__)
        raise NorcalError(f"{p}: not a readable Ultralytics checkpoint (truncated or corrupt?): {detail}") from None
    if not isinstance(ckpt, dict):
        raise NorcalError(f"{p}: not an Ultralytics checkpoint (a {type(ckpt).__name__}, not a dict with 'model')")
    return ckpt


def checkpoint_model(ckpt: dict, path) -> Any:
    """The model of a checkpoint dict: ``ema`` when a trainer saved it (its ``model`` is None),
    else ``model``; float32, eval mode. Refuses a task outside :data:`TASKS`."""
    import ultralytics.nn.tasks as tasks

    model = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
    if model is None:
        raise NorcalError(f"{path}: the checkpoint holds no model (neither 'ema' nor 'model')")
    kinds = tuple(getattr(tasks, t) for t in TASKS)
    if not isinstance(model, kinds):
        raise NorcalError(f"{path}: holds a {type(model).__name__}, not an Ultralytics "
                          f"{' or '.join(TASKS)}")
    return model.float().eval()


def fused(model):
    """``model`` as Ultralytics' predictor (AutoBackend) and ONNX exporter run it: its own
    ``fuse()``, in place (BatchNorm folded into the convolutions, RepConv branches merged, a YOLO
    head's unused branch dropped). The export traces it and tune's pass runs it, so the two stay
    one network, as fast in eager PyTorch as fusion makes it. A model that is no Ultralytics
    ``BaseModel`` (a stand-in for an ONNX network) is returned as it is."""
    if not any(c.__name__ == "BaseModel" and c.__module__ == _TASK_MODULE for c in type(model).__mro__):
        return model
    return model.fuse(verbose=False)


def ordered_names(names, where) -> list[str] | None:
    """An Ultralytics model's class names (a list of strings, or ``{index: name}``) in class-index
    order; None when the model has none. Anything else is refused naming ``where`` and the field."""
    if names is None:
        return None
    if isinstance(names, dict):
        try:
            index = {int(k): v for k, v in names.items() if not isinstance(k, bool)}
        except (TypeError, ValueError):
            index = {}
        if sorted(index) != list(range(len(names))):
            raise NorcalError(f"{where}: the model's class names are not indexed 0..{len(names) - 1}")
        values = [index[i] for i in range(len(names))]
    elif isinstance(names, (list, tuple)):
        values = list(names)
    else:
        raise NorcalError(f"{where}: the model's names must be a list or an {{index: name}} dict of strings, "
                          f"got a {type(names).__name__}")
    for bad in values:
        if not isinstance(bad, str):
            raise NorcalError(f"{where}: the model's names must be strings, got {bad!r} "
                              f"(a {type(bad).__name__})")
    return values
