"""Whole-model checks (opsets, I/O types, optimization profiles) and :func:`check_model`."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from norcal.core.contract import INT8_FORM
from norcal.core.errors import NorcalError
from norcal.core.profiles import Profile, default_profiles
from norcal.core.tensorrt_targets import plugins_needed
from norcal.export.trt_check import support as ts

from .folding import Facts, collect_types, fold, read_initializer, shape_text, type_name
from .graph_walk import Flattener, is_default
from .node_rules import check_node
from .report import Finding, Report


def check_opsets(model, findings) -> int | None:
    default = None
    for o in model.opset_import:
        if is_default(o.domain):
            default = o.version
    for f in model.functions:
        for o in f.opset_import:
            if is_default(o.domain) and not ts.OPSET_MIN <= o.version <= ts.OPSET_MAX:
                findings.append(Finding("error", f"function {f.domain}.{f.name}", "-",
                                        f"opset {o.version} is outside TensorRT {ts.TENSORRT_VERSION}'s "
                                        f"range {ts.OPSET_MIN}..{ts.OPSET_MAX}"))
    if default is None:
        findings.append(Finding("error", "model", "-", "no default-domain opset import"))
    elif not ts.OPSET_MIN <= default <= ts.OPSET_MAX:
        findings.append(Finding("error", "model", "-", f"opset {default} is outside TensorRT "
                                f"{ts.TENSORRT_VERSION}'s range {ts.OPSET_MIN}..{ts.OPSET_MAX}"))
    for (domain, name) in {(f.domain, f.name) for f in model.functions}:
        if name in ts.OPERATORS:
            findings.append(Finding(
                "error", f"function {domain}.{name}", name,
                f"a local function named like the built-in ONNX op {name}: TensorRT imports the "
                f"built-in op for every {name} node and never uses the function's body"))
    return default


def check_io_types(model, facts, findings) -> None:
    g = model.graph
    for kind, values in (("input", g.input), ("output", g.output)):
        for v in values:
            t = v.type.tensor_type.elem_type
            name = ts.MATRIX_TYPE.get(t)
            if name == "DOUBLE":
                findings.append(Finding("warning", f"graph {kind} '{v.name}'", "-",
                                        "DOUBLE: TensorRT casts it down to FLOAT"))
            elif t and (name is None or name in ts.QUANTIZED_TYPES):
                findings.append(Finding("error", f"graph {kind} '{v.name}'", "-",
                                        f"type {type_name(t)} is not a TensorRT I/O type"))
    for init in g.initializer:
        if init.data_type == TensorProto.DOUBLE:
            findings.append(Finding("warning", f"initializer '{init.name}'", "-",
                                    "DOUBLE: TensorRT casts it down to FLOAT"))


def check_profiles(model, facts, profiles, findings) -> None:
    inits = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    names = {v.name for v in inputs}
    for extra in sorted(set(profiles) - names):
        raise NorcalError(f"profile for {extra!r}: the model has no such input "
                          f"(inputs: {', '.join(sorted(names)) or 'none'})")
    for v in inputs:
        dims = facts.shapes.get(v.name)
        where = f"graph input '{v.name}'"
        if dims is None:
            findings.append(Finding("error", where, "-", "has no shape: TensorRT needs the input's rank"))
            continue
        dynamic = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int) or d <= 0]
        prof = profiles.get(v.name)
        if prof is None:
            if dynamic:
                what = ", ".join(f"dim {i} ({d or '?'})" for i, d in dynamic)
                findings.append(Finding("error", where, "-",
                                        f"dynamic {what} not covered by any profile; give input "
                                        f"{v.name!r} a profile ({v.name}:MIN:OPT:MAX)"))
            continue
        if len(prof.min) != len(dims) and prof.source == "given":
            # the user's profile is wrong, not the model: refuse it rather than list a finding
            raise NorcalError(f"profile {prof.text()}: rank {len(prof.min)}, but input {v.name!r} "
                              f"has rank {len(dims)} {shape_text(dims)}", param="profile")
        if len(prof.min) != len(dims):
            findings.append(Finding("error", where, "-", f"profile {prof.text()} has rank "
                                    f"{len(prof.min)}, the input has rank {len(dims)} {shape_text(dims)}"))
            continue
        for i, d in enumerate(dims):
            if isinstance(d, int) and d > 0 and not (prof.min[i] == prof.opt[i] == prof.max[i] == d):
                findings.append(Finding("error", where, "-", f"profile {prof.text()} sets dim {i}, "
                                        f"which the model fixes at {d}"))


def tie_shared_dims(model, profiles: dict) -> dict:
    """Profiles that agree on every symbolic dim the model's inputs share (``batch`` of images
    and image_sizes): a default profile takes a given one's range on such a dim; two given
    profiles that disagree there are refused (TensorRT would refuse them at build)."""
    from norcal.core.profiles import Profile

    inits = {i.name for i in model.graph.initializer}
    tied: dict[str, list[tuple[str, int]]] = {}
    for v in model.graph.input:
        if v.name in inits or v.name not in profiles:
            continue
        for axis, d in enumerate(v.type.tensor_type.shape.dim):
            if d.dim_param and axis < len(profiles[v.name].min):
                tied.setdefault(d.dim_param, []).append((v.name, axis))
    out = dict(profiles)

    def span(name, axis):
        p = out[name]
        return p.min[axis], p.opt[axis], p.max[axis]

    for dim, uses in tied.items():
        given = [(n, a) for n, a in uses if out[n].source == "given"]
        for n, a in given[1:]:
            if span(n, a) != span(*given[0]):
                n0, a0 = given[0]
                raise NorcalError(f"profile {out[n0].text()} and profile {out[n].text()} disagree on dim "
                                  f"{dim!r}, which the model ties ({':'.join(map(str, span(n0, a0)))} vs "
                                  f"{':'.join(map(str, span(n, a)))}): give both the same range", param="profile")
        if not given:
            continue
        lo, opt, hi = span(*given[0])
        for n, a in uses:
            p = out[n]
            if p.source != "given":
                out[n] = Profile(n, p.min[:a] + (lo,) + p.min[a + 1:], p.opt[:a] + (opt,) + p.opt[a + 1:],
                                 p.max[:a] + (hi,) + p.max[a + 1:], p.source)
    return out


def _given_profiles(profiles) -> dict[str, Profile]:
    """{input: Profile} from a dict or a list of ``--profile`` entries (one per input)."""
    if isinstance(profiles, (list, tuple)):
        seen = {}
        for p in profiles:  # two profiles for one input: which one holds would be a guess
            if p.input in seen:
                raise NorcalError(f"profile for {p.input!r} given twice ({seen[p.input].text()} and "
                                  f"{p.text()}): give one per input", param="profile")
            seen[p.input] = p
        profiles = seen
    return dict(profiles or {})


def _facts(model: onnx.ModelProto, flat: Flattener, notes: list[str]) -> Facts:
    """Types, shapes and folded constants of the expanded graph (a note where inference fails)."""
    facts = Facts()
    g = model.graph
    flat_graph = helper.make_graph([n.proto for n in flat.top], g.name or "main", g.input, g.output,
                                   g.initializer, value_info=g.value_info)
    flat_model = helper.make_model(flat_graph, opset_imports=[o for o in model.opset_import],
                                   ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(flat_model, check_type=False, strict_mode=False,
                                                     data_prop=True)
        collect_types(inferred.graph, facts)
    except Exception as e:  # a model ONNX Runtime runs can still trip the inferencer
        notes.append(f"shape inference failed ({type(e).__name__}); type checks use declared types only")
        collect_types(flat_graph, facts)
    for init in g.initializer:
        facts.initializers.add(init.name)
        facts.consts[init.name] = read_initializer(init)
    fold(flat.top + flat.sub, facts)
    return facts


def check_model(model: onnx.ModelProto | str | Path, profiles=None, nvidia: bool = True) -> Report:
    """Check an ONNX model against the TensorRT 10.15 ONNX parser without TensorRT.

    ``profiles``: {input name: Profile} or a list of Profiles (``--profile`` entries); inputs not
    named there get :func:`default_profiles` (the detector contract's inputs only). ``nvidia``:
    also run NVIDIA's own parser where one is installed (TensorRT for RTX); a node it refuses
    that no listed RTX-only gap explains is an error.
    """
    if not isinstance(model, onnx.ModelProto):
        from norcal.core.files.onnx_io import load_onnx

        model = load_onnx(model)
    given = _given_profiles(profiles)
    findings: list[Finding] = []
    form = {p.key: p.value for p in model.metadata_props}.get(INT8_FORM)
    if form == "ort":
        findings.append(Finding("error", "model", "-", f"{INT8_FORM}=ort: int8 in ONNX Runtime's form (uint8 "
                                f"activations with zero points, int32 biases), which TensorRT does not build; "
                                f"quantize the fp32 model in the tensorrt form for TensorRT"))
    opset = check_opsets(model, findings)
    flat = Flattener(model, opset or ts.OPSET_MAX)
    flat.run(model.graph)

    notes = []
    facts = _facts(model, flat, notes)
    g = model.graph

    check_io_types(model, facts, findings)
    io_names = {v.name for v in (*g.input, *g.output)}
    nodes = flat.top + flat.sub
    for n in nodes:
        check_node(n, facts, io_names, findings)

    defaults, assumption = default_profiles(model)
    merged = tie_shared_dims(model, {**defaults, **given})
    if any(p.source == "default" for p in merged.values()):
        notes.append(assumption)
    followed = [n for n, p in merged.items() if p != defaults.get(n, p) and n not in given]
    if followed:
        notes.append(f"default profile of {', '.join(followed)} takes the given profile's range on the dims "
                     f"the inputs share")
    check_profiles(model, facts, merged, findings)
    verdict = nvidia_verdict(model, findings) if nvidia else None
    return Report(ts.TENSORRT_VERSION, opset, len(nodes), sorted({n.proto.op_type for n in nodes}),
                  findings, merged, notes, plugins_needed(model), verdict)


def nvidia_verdict(model: onnx.ModelProto, findings: list[Finding]):
    """NVIDIA's parser on the model where installed (None otherwise); its refusals that our table
    passed and no RTX-only gap explains become errors: one of the two verdicts is wrong."""
    from .nvidia_parser import installed_parser, parse_model

    trt = installed_parser()
    if trt is None:
        return None
    verdict = parse_model(model, trt)
    # our findings name a node inside a local function by its path ("norcal > sub")
    ours = {f.node.rsplit(" > ", 1)[-1] for f in findings if f.severity == "error"}
    for r in verdict.unexplained():
        if r.node not in ours:
            findings.append(Finding("error", r.node, r.op_type, f"{verdict.library}'s parser refuses it, "
                                    f"and no RTX-only gap explains that: {r.reason}"))
    return verdict
