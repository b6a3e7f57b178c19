"""TensorRT optimization profiles for the detector contract's inputs (min/opt/max shapes).

Shared by the compatibility check (every dynamic dim must be covered) and the engine builder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx

from norcal.core.contract import INPUT_NAMES, input_spec
from norcal.core.errors import NorcalError

DEFAULT_BATCH = (1, 4, 8)  # min, opt, max images per batch when no profile is given

@dataclass(frozen=True)
class Profile:
    """An optimization-profile entry for one input: min, opt and max shapes."""

    input: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]
    source: str = "given"  # "given" or "default"

    def text(self) -> str:
        """``name:1x3x32x32:4x3x800x1088:8x3x1344x1344`` (NAME:MIN:OPT:MAX)."""
        return f"{self.input}:{_dims(self.min)}:{_dims(self.opt)}:{_dims(self.max)}"


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def make_profile(name: str, lo, opt, hi, source: str = "given") -> Profile:
    """A validated profile: equal ranks and min <= opt <= max in every dim."""
    lo, opt, hi = tuple(lo), tuple(opt), tuple(hi)
    if not (len(lo) == len(opt) == len(hi)):
        raise NorcalError(f"profile for {name!r}: min, opt and max have different ranks "
                          f"({_dims(lo)}, {_dims(opt)}, {_dims(hi)})")
    for i, (a, b, c) in enumerate(zip(lo, opt, hi)):
        if not a <= b <= c:
            raise NorcalError(f"profile for {name!r}: dim {i} needs min <= opt <= max, got {a}, {b}, {c}")
    return Profile(name, lo, opt, hi, source)


def _ceil_to(x: float, m: int) -> int:
    return int(math.ceil(x / m) * m)


def image_size_range(metadata: dict[str, str]) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(min HxW, opt HxW, max HxW) of a padded detector input, from the model's resize settings.

    ResizeShortestEdge makes the short edge min_size unless the long edge would pass max_size,
    then the host pads to size_divisibility: H and W each lie in [d, ceil_d(max_size)] in either
    orientation. opt is a 4:3 landscape image at the short-edge size (800x1088 for 800/1333).
    """
    spec = input_spec(metadata)
    d = spec.divisibility
    top = _ceil_to(spec.max_size, d)
    opt_h = _ceil_to(spec.min_size, d)
    opt_w = min(_ceil_to(round(spec.min_size * 4 / 3), d), top)
    return (d, d), (opt_h, opt_w), (top, top)


def detector_profiles(batch=DEFAULT_BATCH, hw_min=None, hw_opt=None, hw_max=None, metadata=None,
                      source: str = "given") -> dict[str, Profile]:
    """Profiles for the ONNX contract's inputs: images [B,3,H,W] and image_sizes [B,2]."""
    if hw_min is None or hw_opt is None or hw_max is None:
        d_min, d_opt, d_max = image_size_range(metadata or {})
        hw_min, hw_opt, hw_max = hw_min or d_min, hw_opt or d_opt, hw_max or d_max
    b = tuple(batch)
    if len(b) != 3:
        raise NorcalError(f"batch needs (min, opt, max), got {b}", param="batch")
    return {
        "images": make_profile("images", (b[0], 3, *hw_min), (b[1], 3, *hw_opt), (b[2], 3, *hw_max), source),
        "image_sizes": make_profile("image_sizes", (b[0], 2), (b[1], 2), (b[2], 2), source),
    }


def input_dims(model: onnx.ModelProto) -> dict[str, list]:
    """Graph inputs (initializers excluded) -> dims: an int when fixed, else the dim's name or None."""
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for v in model.graph.input:
        if v.name not in inits:
            out[v.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                           for d in v.type.tensor_type.shape.dim]
    return out


def fit_static(profile: Profile, dims: list, axes) -> Profile:
    """``profile`` with each of ``axes`` that the model fixes set to the model's value."""
    lo, opt, hi = list(profile.min), list(profile.opt), list(profile.max)
    if len(dims) != len(lo):
        return profile  # a rank mismatch is reported by the profile check
    for a in axes:
        if isinstance(dims[a], int):
            lo[a] = opt[a] = hi[a] = dims[a]
    return Profile(profile.input, tuple(lo), tuple(opt), tuple(hi), profile.source)


# axes of the contract inputs that a default profile fills in: batch, and H, W of images
DEFAULTED_AXES = {"images": (0, 2, 3), "image_sizes": (0,)}


def default_profiles(model: onnx.ModelProto) -> tuple[dict[str, Profile], str]:
    """Profiles for the contract inputs a model has, and a sentence saying what they assume.

    Dims the model fixes keep their value; the dynamic ones get batch 1:4:8 and the padded
    image range of the model's resize metadata (:func:`image_size_range`).
    """
    dims = input_dims(model)
    if not set(dims) & set(INPUT_NAMES):
        return {}, "no default profile: the model has no 'images' / 'image_sizes' input"
    meta = {p.key: p.value for p in model.metadata_props}
    lo, opt, hi = image_size_range(meta)
    profiles = {k: fit_static(v, dims[k], DEFAULTED_AXES[k])
                for k, v in detector_profiles(DEFAULT_BATCH, lo, opt, hi, source="default").items()
                if k in dims}
    return profiles, (f"default profile assumes batch {DEFAULT_BATCH[0]}:{DEFAULT_BATCH[1]}:{DEFAULT_BATCH[2]} "
                      f"and padded images from {_dims(lo)} to {_dims(hi)} (opt {_dims(opt)}), from the "
                      f"model's resize metadata (detectron2 defaults 800/1333/32 where absent), "
                      f"wherever the model leaves those dims dynamic")
