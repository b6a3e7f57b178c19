"""Schemas of the JSON files norcal reads, each checked once, when it is loaded.

Four formats: a calibration table, COCO/LVIS training annotations (counted into a table),
LVIS ground truth and LVIS/COCO detection results. Each is a pydantic TypeAdapter over
TypedDicts, strict (no string-to-number coercion, no NaN or infinity); unknown keys are kept
as they are. The first error becomes one NorcalError line naming the file, the record and the
field::

    val.json: annotations[17] (id 5012): bbox: expected 4 numbers, got 3

What no per-field type can say (duplicate ids, ids that point nowhere, box sizes) the loaders
check on the arrays they build and word the same way with :func:`record_error`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import ConfigDict, Discriminator, FailFast, Field, Tag, TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict

from norcal.core.errors import NorcalError

# ---------------------------------------------------------------------------- field types
_CONFIG = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")
_INT64 = 2 ** 63

Id = Annotated[int, Field(ge=-_INT64, lt=_INT64)]  # ids become int64 arrays
Count = Annotated[int, Field(ge=0, lt=_INT64)]
Number = float  # strict: an int or a float, finite
# pixel coordinates: float32 keeps whole pixels exact up to 2**24, and no image is larger
# (1e308 would pass as finite and overflow in every box computation)
MAX_COORDINATE = 2 ** 24
MAX_SIDE = 2 ** 20  # image height / width
Coordinate = Annotated[float, Field(ge=-MAX_COORDINATE, le=MAX_COORDINATE)]
NonNegative = Annotated[float, Field(ge=0, le=_INT64)]
Area = Annotated[float, Field(ge=0, le=MAX_COORDINATE ** 2)]
Box = Annotated[list[Coordinate], Field(min_length=4, max_length=4)]  # x, y, w, h
Frequency = Literal["r", "c", "f"]

_TAGS: set[str] = set()  # union member names pydantic puts into error locations


def _one_of(what: str, **members: tuple[type, Any]) -> Any:
    """A union picked by the value's Python type (a bool is never a number here); anything
    else is one error saying ``expected {what}`` instead of one error per member."""
    _TAGS.update(members)

    def pick(v: Any) -> str | None:
        if isinstance(v, bool):
            return None
        return next((tag for tag, (kind, _) in members.items() if isinstance(v, kind)), None)

    return Annotated[Union[tuple(Annotated[t, Tag(tag)] for tag, (_, t) in members.items())],
                     Discriminator(pick, custom_error_type="one_of",
                                   custom_error_message=f"expected {what}")]


class Rle(TypedDict):
    """A compressed (``counts`` a string) or uncompressed (a list) run-length mask."""

    __pydantic_config__ = _CONFIG
    size: Annotated[list[Count], Field(min_length=2, max_length=2)]  # h, w
    counts: _one_of("an RLE string or a list of run lengths", rle_string=(str, str),
                    rle_bytes=(bytes, bytes), run_lengths=(list, list[Count]))


Polygons = list[list[Coordinate]]
Segmentation = _one_of("polygons (a list of lists of numbers) or an RLE object",
                       polygons=(list, Polygons), rle=(dict, Rle))
# ints stay ints (a table's digest is taken over its JSON), floats are allowed
CountOrNull = _one_of("a count (a number >= 0) or null", integer=(int, Count),
                      fraction=(float, NonNegative), null=(type(None), None))


# ---------------------------------------------------------------------------- table
class TableCategory(TypedDict):
    __pydantic_config__ = _CONFIG
    id: Annotated[int, Field(ge=0, lt=_INT64)]  # a category id written into results: never negative
    name: str
    image_count: NotRequired[CountOrNull]
    instance_count: NotRequired[CountOrNull]
    frequency: NotRequired[Frequency]


class TableFile(TypedDict):
    __pydantic_config__ = _CONFIG
    name: NotRequired[str]
    source: NotRequired[str]
    count_type: NotRequired[Literal["image", "instance"]]
    categories: Annotated[list[TableCategory], Field(min_length=1)]  # a table of no class calibrates nothing


# ---------------------------------------------------------------------------- annotations
class Category(TypedDict):
    __pydantic_config__ = _CONFIG
    id: Id
    name: NotRequired[str]
    frequency: NotRequired[Union[Frequency, None]]
    image_count: NotRequired[CountOrNull]
    instance_count: NotRequired[CountOrNull]


class Image(TypedDict):
    __pydantic_config__ = _CONFIG
    id: Id


class Annotation(TypedDict):
    """A training annotation: what counting needs, and a well-formed box where one is given."""

    __pydantic_config__ = _CONFIG
    id: NotRequired[Id]
    image_id: Id
    category_id: Id
    bbox: NotRequired[Box]
    area: NotRequired[Area]


class AnnotationFile(TypedDict):
    """COCO/LVIS training annotations, or a bare LVIS category list carrying counts."""

    __pydantic_config__ = _CONFIG
    categories: list[Category]
    images: NotRequired[list[Image]]
    annotations: NotRequired[list[Annotation]]


# ---------------------------------------------------------------------------- ground truth
class GTImage(TypedDict):
    __pydantic_config__ = _CONFIG
    id: Id
    height: Annotated[int, Field(gt=0, le=MAX_SIDE)]
    width: Annotated[int, Field(gt=0, le=MAX_SIDE)]
    neg_category_ids: NotRequired[Union[list[Id], None]]
    not_exhaustive_category_ids: NotRequired[Union[list[Id], None]]


class GTAnnotation(TypedDict):
    __pydantic_config__ = _CONFIG
    id: NotRequired[Id]
    image_id: Id
    category_id: Id
    bbox: Box
    area: Area
    segmentation: NotRequired[Segmentation]
    ignore: NotRequired[Literal[0, 1, False, True]]
    iscrowd: NotRequired[Literal[0, 1, False, True]]


class GTFile(TypedDict):
    __pydantic_config__ = _CONFIG
    images: Annotated[list[GTImage], Field(min_length=1)]
    annotations: list[GTAnnotation]
    categories: Annotated[list[Category], Field(min_length=1)]


# ---------------------------------------------------------------------------- results
ResultSegmentation = Annotated[  # polygons are GT-only, as in pycocotools and lvis-api
    Union[Annotated[Rle, Tag("rle")]],
    Discriminator(lambda v: "rle" if isinstance(v, dict) else None, custom_error_type="one_of",
                  custom_error_message="results must be RLE ({'size': [h, w], 'counts': ...})")]


class Result(TypedDict):
    __pydantic_config__ = _CONFIG
    image_id: Id
    category_id: Id
    score: Number
    bbox: NotRequired[Box]
    segmentation: NotRequired[ResultSegmentation]


# ---------------------------------------------------------------------------- formats
class Schema:
    """One file format: its title (for "not a ..." errors) and its validator."""

    def __init__(self, title: str, type_: Any):
        self.title = title
        self.adapter = TypeAdapter(type_)

    def validate(self, data: Any, where: str) -> Any:
        """``data`` as validated (unknown keys kept); a NorcalError naming record and field."""
        try:
            return self.adapter.validate_python(data)
        except ValidationError as e:
            raise NorcalError(error_line(e, where, self.title, data)) from None

    def validate_json(self, raw: bytes, where: str) -> Any:
        """Parse and validate in one pass (faster than json.load, same values)."""
        try:
            return self.adapter.validate_json(raw)
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            if first["type"] == "json_invalid":
                raise NorcalError(f"{where}: not valid JSON ({first['ctx']['error']})") from None
            try:
                data = json.loads(raw)  # only to name the failing record by its id
            except (ValueError, RecursionError):
                data = None
            raise NorcalError(error_line(e, where, self.title, data)) from None


TABLE = Schema("a calibration table", TableFile)
ANNOTATIONS = Schema("a COCO/LVIS annotation file", AnnotationFile)
GROUND_TRUTH = Schema("an LVIS annotation file", GTFile)
# one bad detection is enough to reject a file: stop there rather than list 300k errors
RESULTS = Schema("a result list", Annotated[list[Result], FailFast()])


# ---------------------------------------------------------------------------- messages
def error_line(error: ValidationError, where: str, title: str = "", data: Any = None) -> str:
    """The first error of ``error`` as one line: ``{where}: {record}: {field}: {problem}``.

    data: the validated input, to name a record by its ``id`` as well as its index.
    """
    errors = error.errors(include_url=False)
    # a missing or mistyped section says more than an error inside another one
    e = next((e for e in errors if len(e["loc"]) <= 1 and e["type"] in _STRUCTURAL), errors[0])
    loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p in _TAGS))
    problem = _problem(e, loc)
    split = next((k for k, p in enumerate(loc) if isinstance(p, int)), None)
    if split is None:  # the file's top level: a missing or mistyped section
        field = _path(loc)
        top = f"{where}: not {title}" if title and e["type"] in _STRUCTURAL else where
        return f"{top}: {field}: {problem}" if field else f"{top}: {problem}"
    field = _path(loc[split + 1:])
    record = _record(loc[:split + 1], data if field != "id" else None)
    return f"{where}: {record}: {field}: {problem}" if field else f"{where}: {record}: {problem}"


def record_error(where: str, section: str, index: int, record: Any, field: str,
                 problem: str) -> NorcalError:
    """The error for a check made outside the schema, worded as :func:`error_line` words it.

    section: the list's key ('' for a file that is a list); record: the entry (for its id).
    """
    label = f"{section}[{index}]"
    rid = record.get("id") if isinstance(record, dict) else None
    if _is_id(rid):
        label += f" (id {rid})"
    return NorcalError(f"{where}: {label}: {field}: {problem}")


def column(records: list, field: str, dtype=np.int64) -> np.ndarray:
    """``field`` of each validated record as an array [N]."""
    return np.fromiter((r[field] for r in records), dtype, len(records))


def ids_of(where: str, section: str, records: list) -> np.ndarray:
    """The validated records' ``id`` as int64 [N] (0 where a record has none); an id given
    twice is an error naming the second record."""
    n = len(records)
    ids = np.fromiter((r.get("id", 0) for r in records), np.int64, n)
    has = np.fromiter(("id" in r for r in records), bool, n)
    given = np.flatnonzero(has)
    order = given[np.argsort(ids[given], kind="stable")]
    dup = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if dup.size:
        first, again = int(order[dup[0]]), int(order[dup[0] + 1])
        raise record_error(where, section, again, records[again], "id",
                           f"duplicate id {ids[again]} (also {section}[{first}])")
    return ids


def check_refs(where: str, section: str, records: list, field: str, known: np.ndarray,
               target: str) -> np.ndarray:
    """Indices of the records' ``field`` into the sorted ids ``known`` (those of ``target``),
    int64 [N]; an id that is not there is an error naming the record."""
    refs = column(records, field)
    pos = np.minimum(np.searchsorted(known, refs), max(len(known) - 1, 0))
    found = known[pos] == refs if len(known) else np.zeros(len(refs), bool)
    if not found.all():
        i = int(np.flatnonzero(~found)[0])
        raise record_error(where, section, i, records[i], field,
                           f"{refs[i]} is not the id of any entry in {target}")
    return pos


def boxes_of(where: str, section: str, records: list, rows: list[int] | None = None) -> np.ndarray:
    """The validated records' ``bbox`` (only those at ``rows`` if given) as float64 [N, 4]
    (x, y, w, h); a negative width or height is an error naming the record."""
    rows = range(len(records)) if rows is None else rows
    boxes = np.array([records[i]["bbox"] for i in rows], dtype=np.float64).reshape(-1, 4)
    bad = np.flatnonzero((boxes[:, 2:] < 0).any(axis=1))
    if bad.size:
        i, row = int(bad[0]), rows[int(bad[0])]
        raise record_error(where, section, row, records[row], "bbox",
                           f"negative width or height ({boxes[i, 2]:g} x {boxes[i, 3]:g})")
    return boxes


_STRUCTURAL = {"missing", "dict_type", "list_type"}


def _is_id(v: Any) -> bool:
    return isinstance(v, (int, str)) and not isinstance(v, bool) and len(str(v)) <= 40


def _record(loc: tuple, data: Any) -> str:
    label = _path(loc[:-1]) + f"[{loc[-1]}]"
    node = data
    try:
        for p in loc:
            node = node[p]
    except (KeyError, IndexError, TypeError):
        return label
    rid = node.get("id") if isinstance(node, dict) else None
    return f"{label} (id {rid})" if _is_id(rid) else label


def _path(loc: tuple) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


_FIXED_LENGTH = {"bbox": 4, "size": 2}
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "finite_number": "a finite number",
             "string_type": "a string", "list_type": "a list", "dict_type": "an object"}
_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"), "less_than": ("<", "lt"),
           "less_than_equal": ("<=", "le")}


def _problem(e: dict, loc: tuple) -> str:
    kind, ctx, value = e["type"], e.get("ctx") or {}, e.get("input")
    if kind == "missing":
        return "missing"
    got = _show(value)
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {got}"
    if kind == "literal_error":
        return f"expected {ctx['expected']}, got {got}"
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        bound = ctx[key]
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # pydantic hands a float field's bounds over as floats
        return f"must be {op} {bound}, got {got}"
    if kind in ("too_short", "too_long") and isinstance(value, (list, tuple)):
        name = loc[-1] if loc else ""
        if name in _FIXED_LENGTH:
            return f"expected {_FIXED_LENGTH[name]} numbers, got {len(value)}"
        if kind == "too_short":
            return "must not be empty" if ctx.get("min_length") == 1 else \
                f"expected at least {ctx.get('min_length')} items, got {len(value)}"
        return f"expected at most {ctx.get('max_length')} items, got {len(value)}"
    msg = e["msg"][:1].lower() + e["msg"][1:]  # the one_of unions above, and any other
    return f"{msg}, got {got}"


def _show(v: Any) -> str:
    """A short JSON-flavoured description of a bad value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if type(v) in (int, float):
        s = repr(v)
        return s if len(s) <= 24 else s[:21] + "..."
    if isinstance(v, str):
        return f"string {v!r}" if len(v) <= 30 else f"string {v[:27]!r}..."
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return "an object"
    kind = type(v)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
