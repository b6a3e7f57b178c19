"""YAML read safely: yaml.SafeLoader (no Python objects), with the values a document expands to
bounded (alias "billion laughs" bombs) and deep nesting refused, errors in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

import yaml

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file

# a config or dataset description is a few hundred to a few thousand values: far beyond this is
# a crafted file ("billion laughs" aliases), which would expand to gigabytes once walked or printed
MAX_YAML_VALUES = 100_000
# ... and a few to a few hundred kilobytes (an LVIS data.yaml naming 1203 classes: about 30 KB).
# The parser is pure Python: a 63 MB file still parsed after two minutes, so the size is bounded
# before any of it is parsed
MAX_YAML_BYTES = 4 * 2 ** 20


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that counts the values a document expands to (an alias counts as
    everything it stands for) while composing it, and refuses past :data:`MAX_YAML_VALUES`."""

    def __init__(self, stream):
        super().__init__(stream)
        self._values = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values it expands to

    def _size(self, node) -> int:
        if id(node) not in self._sizes:
            items = node.value if isinstance(node.value, list) else []
            parts = (p for item in items for p in (item if isinstance(item, tuple) else (item,)))
            self._sizes[id(node)] = 1 + sum(self._size(p) for p in parts)
        return self._sizes[id(node)]

    def compose_node(self, parent, index):
        alias = self.check_event(yaml.AliasEvent)
        node = super().compose_node(parent, index)
        self._values += self._size(node) if alias else 1
        if self._values > MAX_YAML_VALUES:
            raise _TooLarge(f"expands to more than {MAX_YAML_VALUES} values (aliases repeated "
                            "too often?)")
        return node


class _TooLarge(Exception):
    pass


PYTHON_OBJECT, PYTHON_NAME, PYTHON_APPLY = "_python_object_", "_python_name_", "_python_apply_"
# the calls a config.yaml may spell with !!python/object/apply (kept as data, never made)
INERT_CALLS = ("functools.partial",)


def _inert_object(loader, suffix, node):
    fields = loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode) else {}
    return {PYTHON_OBJECT: suffix, **fields}


def _inert_apply(loader, suffix, node):
    if suffix not in INERT_CALLS:  # as refused as before: no constructor for the tag
        raise yaml.constructor.ConstructorError(None, None, f"could not determine a constructor for the tag "
                                                f"{node.tag!r}", node.start_mark)
    if isinstance(node, yaml.SequenceNode):  # the short form: the call's arguments only
        return {PYTHON_APPLY: suffix, "args": loader.construct_sequence(node, deep=True)}
    return {PYTHON_APPLY: suffix, **loader.construct_mapping(node, deep=True)}


class _InertPythonLoader(_BoundedLoader):
    """_BoundedLoader that keeps ``!!python/object:X {...}`` as ``{PYTHON_OBJECT: "X", ...}``,
    ``!!python/object/apply:X {args, state, ...}`` (X in :data:`INERT_CALLS`) as
    ``{PYTHON_APPLY: "X", "args": ..., ...}``, ``!!python/name:X`` as ``{PYTHON_NAME: "X"}`` and
    ``!!python/tuple`` as a list: data only,
    nothing imported or called (a LazyConfig's config.yaml writes its ShapeSpecs, lambdas and
    ``functools.partial`` arguments so); other Python tags stay refused."""


for _tag in ("python/object/apply:", "python/object/new:"):
    _InertPythonLoader.add_multi_constructor(f"tag:yaml.org,2002:{_tag}", _inert_apply)
_InertPythonLoader.add_multi_constructor("tag:yaml.org,2002:python/object:", _inert_object)
_InertPythonLoader.add_multi_constructor(
    "tag:yaml.org,2002:python/name:", lambda loader, suffix, node: {PYTHON_NAME: unquote(suffix)})
_InertPythonLoader.add_constructor(
    "tag:yaml.org,2002:python/tuple", lambda loader, node: loader.construct_sequence(node, deep=True))


def read_yaml_mapping(path: Path, what: str, inert_python: bool = False) -> dict[str, Any]:
    """The YAML mapping in ``path``; ``what`` names the kind of file in errors ("detectron2
    config", "Ultralytics dataset description"). Empty files and non-mappings are refused.
    ``inert_python``: read ``!!python/object`` and ``!!python/name`` tags as plain data
    (see :class:`_InertPythonLoader`)."""
    path = readable_file(path)
    a = "an" if what[:1].lower() in "aeiou" else "a"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)  # the file may grow after a size check: read no further
        if len(raw) > MAX_YAML_BYTES:
            raise NorcalError(f"{path}: not {a} {what}: larger than {MAX_YAML_BYTES // 2 ** 20} MiB "
                              "(a config or dataset description is a few kilobytes)")
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NorcalError(f"{path}: not {a} {what} file (not UTF-8 text)") from None
    except OSError as e:
        raise NorcalError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    try:
        loader = (_InertPythonLoader if inert_python else _BoundedLoader)(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except _TooLarge as e:
        raise NorcalError(f"{path}: not {a} {what}: {e}") from None
    except RecursionError:
        raise NorcalError(f"{path}: not {a} {what}: nested too deeply") from None
    except yaml.YAMLError as e:
        raise NorcalError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        raise NorcalError(f"{path}: the {what} file is empty")
    if not isinstance(data, dict):
        raise NorcalError(f"{path}: {a} {what} must be a YAML mapping, found {type(data).__name__}")
    return data
