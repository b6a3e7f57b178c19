"""Read a detectron2 YAML config file, its ``_BASE_`` chain merged, over detectron2's defaults.

Semantics follow ``detectron2.config.CfgNode.merge_from_file``: each ``_BASE_`` path is
relative to the file naming it; a child's values override its base's and nested mappings
merge; keys no file sets take detectron2's defaults (``d2_defaults``). A key detectron2 does
not have in the sections we read raises :class:`NorcalError`, as detectron2 refuses it too.
"""

from __future__ import annotations

import ast
import difflib
import os
from pathlib import Path
from typing import Any

from norcal.core.errors import NorcalError, shown
from norcal.core.files.fileio import readable_file
from norcal.core.files.yaml_io import read_yaml_mapping

from norcal.export.families.detectron2.yacs_config.defaults import KNOWN_KEYS, d2_defaults

BASE_KEY = "_BASE_"


def _read_yaml(path: Path) -> dict:
    # an empty file would silently mean detectron2's defaults, not the model's: refused there
    return read_yaml_mapping(path, "detectron2 config")


def _merge_base(child: dict, base: dict, path: Path, prefix: str = "") -> None:
    """Merge ``child`` into ``base`` in place: child wins, nested mappings merge."""
    for k, v in child.items():
        if isinstance(v, dict) and k in base:
            if not isinstance(base[k], dict):
                raise NorcalError(f"{path}: cannot inherit key '{prefix}{k}' from base: the base sets it "
                                  f"to {shown(base[k])}, not a mapping")
            _merge_base(v, base[k], path, f"{prefix}{k}.")
        else:
            base[k] = v


def _check_known_keys(cfg: dict, path: Path) -> None:
    """Refuse keys detectron2 does not have in the sections we read (it raises KeyError too)."""
    for section, known in KNOWN_KEYS.items():
        node: Any = cfg
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for key in node:
            if key not in known:
                near = difflib.get_close_matches(str(key), sorted(known), n=1)
                hint = f"; did you mean {section}.{near[0]}?" if near else ""
                raise NorcalError(f"{path}: {section}.{key}: {shown(node[key])}: not a detectron2 config key "
                                  f"(detectron2 refuses it too){hint}")


def load_yaml_with_base(path, _chain: tuple[Path, ...] = ()) -> dict:
    """The YAML file at ``path`` with its ``_BASE_`` files merged in (a nested dict)."""
    path = readable_file(os.path.expanduser(str(path)))  # a loop, FIFO or folder said as such
    key = path.resolve()
    if key in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, key))
        raise NorcalError(f"{path}: _BASE_ chain loops: {cycle}")
    cfg = _read_yaml(path)
    _check_known_keys(cfg, path)
    if BASE_KEY not in cfg:
        return cfg
    bases = cfg.pop(BASE_KEY)
    names = bases if isinstance(bases, list) else [bases]
    merged: dict = {}
    for name in names:
        if not isinstance(name, str):
            raise NorcalError(f"{path}: _BASE_ entry {shown(name)} is not a file name")
        if name.startswith(("http://", "https://")):
            raise NorcalError(f"{path}: _BASE_ {name} is a URL; download it and name the local file")
        base_path = Path(os.path.expanduser(name))
        if not base_path.is_absolute():
            base_path = path.parent / base_path  # relative to the file that names it
        if not os.path.lexists(base_path):
            raise NorcalError(f"{path}: _BASE_ file {name} not found (looked for {base_path})")
        try:  # a folder, a FIFO, a device (/dev/zero), a loop or a broken link said as such
            readable_file(base_path)
        except NorcalError as e:
            raise NorcalError(f"{path}: _BASE_ file {name}: {str(e).removeprefix(f'{base_path}: ')}") from None
        if base_path.suffix == ".py":  # detectron2 runs a Python base as a program
            raise NorcalError(f"{path}: _BASE_ {name} is a Python config, which would have to be executed; "
                              "name a YAML base")
        _merge_base(load_yaml_with_base(base_path, (*_chain, key)), merged, base_path)
    _merge_base(cfg, merged, path)
    return merged


def _decode(value: Any) -> Any:
    # yacs literal-evals strings when merging, so "1e-4" (a string to YAML 1.1) is a float
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return value
    return value


def _merge_into_defaults(loaded: dict, defaults: dict, path, prefix: str = "") -> None:
    for k, v in loaded.items():
        full = f"{prefix}{k}"
        if isinstance(defaults.get(k), dict):
            if not isinstance(v, dict):
                raise NorcalError(f"{path}: config key {full} must be a mapping, got {shown(v)}")
            _merge_into_defaults(v, defaults[k], path, full + ".")
        else:
            defaults[k] = v if isinstance(v, dict) else _decode(v)


def load_cfg_dict(path) -> dict:
    """detectron2's defaults (for the keys we read) overridden by the file and its bases."""
    cfg = d2_defaults()
    _merge_into_defaults(load_yaml_with_base(path), cfg, path)
    return cfg



def load_lazy_cfg_dict(path) -> tuple[dict, dict] | None:
    """For a LazyConfig's config.yaml (see :mod:`norcal.export.families.detectron2.lazy_config`): detectron2's defaults overridden by
    the yaml-era keys it amounts to, and provenance notes; None for any other file."""
    from norcal.export.families.detectron2.lazy_config.translate import is_lazy_config, lazy_to_cfg

    path = readable_file(os.path.expanduser(str(path)))
    data = read_yaml_mapping(path, "detectron2 config", inert_python=True)
    if not is_lazy_config(data):
        return None
    keys, notes = lazy_to_cfg(data, str(path))
    cfg = d2_defaults()
    _merge_into_defaults(keys, cfg, path)
    return cfg, notes
