"""Build a TensorRT engine from an exported detector, or print the trtexec line that does.

The engine gets one optimization profile over the ONNX contract's inputs, images [B,3,H,W] and
image_sizes [B,2]. The ONNX model's ``metadata_props`` (what NorCal baked in, how to resize)
go into a sidecar ``<engine>.json``, since an engine file cannot carry them. TensorRT is
imported only when an engine is built or run, so this module imports without it.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from norcal.core.contract import INT8_FORM, PRECISION, SIZE_DIVISIBILITY, input_spec
from norcal.core.errors import NorcalError
from norcal.core.ranges import check_range
from norcal.core.profiles import (DEFAULT_BATCH, Profile, detector_profiles, fit_static,
                                     image_size_range, input_dims)
from norcal.core.files.fileio import write_bytes, write_json
from norcal.core.tensorrt_targets import LIBRARIES, RTX_GAPS, Library, library, plugins_needed, rtx_gaps
from norcal.runtime.tensorrt_library import check_capabilities, register_plugins, set_capabilities

SIDECAR_FORMAT = "norcal-engine-sidecar/1"


def import_tensorrt():
    """The ``tensorrt`` module, or a NorcalError saying it is missing and what to do instead."""
    return LIBRARIES["tensorrt"].load()


# ----------------------------------------------------------------------------- options

@dataclass
class BuildOptions:
    """An engine build: the model, the engine file, precision, the profile's batch and padded
    image ranges ((min, opt, max) each), workspace and timing cache."""

    onnx_path: Path
    engine_path: Path
    fp16: bool = False
    int8: bool = False  # explicit quantization: the model must carry Q/DQ nodes (norcal quantize)
    batch: tuple[int, int, int] | None = None  # None: 1:4:8 where the model's batch is dynamic
    hw: tuple | None = None  # (min, opt, max) (H, W); None: the model's resize metadata
    workspace_gb: float | None = None  # None: TensorRT's default (the device's memory)
    timing_cache: Path | None = None
    target: str = "tensorrt"  # a key of LIBRARIES: tensorrt (10/11, this GPU) or rtx (ahead of time)
    capabilities: tuple[str, ...] | None = None  # rtx: compute capabilities; None: RTX_DEFAULT_CAPABILITIES


def _check_padded_sizes(options: BuildOptions, meta: dict[str, str]) -> None:
    """Refuse an H or W range with no multiple of the model's size divisibility: the host pads
    every image to one, so the engine would refuse every batch it is given."""
    d = input_spec(meta).divisibility
    if d <= 1:
        return
    for axis, side in ((0, "height"), (1, "width")):
        lo, hi = options.hw[0][axis], options.hw[2][axis]
        if -(-lo // d) * d > hi:
            size = str(lo) if lo == hi else f"{lo}..{hi}"
            raise NorcalError(f"{options.onnx_path}: image {side} {size} (hw) holds no multiple of the model's "
                              f"{SIZE_DIVISIBILITY} {d}: the host pads every image to one, so the engine "
                              f"would take no input; use multiples of {d}", param="hw")


def engine_profiles(model: onnx.ModelProto, options: BuildOptions) -> dict[str, Profile]:
    """The optimization profile for the model's contract inputs (images, image_sizes).

    Ranges the user left to defaults follow the model where it fixes a dim (a static batch of 1
    stays 1); ranges the user gave are kept as given, and the check reports a clash.
    """
    meta = {p.key: p.value for p in model.metadata_props}
    if options.hw is not None:
        _check_padded_sizes(options, meta)
    hw = options.hw or image_size_range(meta)
    profiles = detector_profiles(options.batch or DEFAULT_BATCH, *hw)
    dims = input_dims(model)
    names = list(dims)
    if "images" not in names:
        raise NorcalError(f"{options.onnx_path}: no 'images' input (inputs: {', '.join(names)}); "
                          f"norcal build expects the detector contract images [B,3,H,W], image_sizes [B,2]")
    others = [n for n in names if n not in profiles]
    if others:
        raise NorcalError(f"{options.onnx_path}: inputs {others} are not in the detector contract; "
                          f"build it with trtexec and your own min/opt/max shapes for them")
    defaulted = {"images": ((0,) if options.batch is None else ()) + ((2, 3) if options.hw is None else ()),
                 "image_sizes": (0,) if options.batch is None else ()}
    return {n: fit_static(p, dims[n], defaulted[n]) for n, p in profiles.items() if n in names}


def _shapes_arg(profiles: dict[str, Profile], which: str) -> str:
    return ",".join(f"{p.input}:{'x'.join(str(d) for d in getattr(p, which))}" for p in profiles.values())


def trtexec_command(onnx_path, engine_path, profiles: dict[str, Profile], fp16: bool = False,
                    workspace_gb: float | None = None, timing_cache=None, int8: bool = False) -> str:
    """The trtexec command line that builds the same engine (for machines without Python TensorRT)."""
    args = ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine_path}"]
    if profiles:
        args += [f"--minShapes={_shapes_arg(profiles, 'min')}",
                 f"--optShapes={_shapes_arg(profiles, 'opt')}",
                 f"--maxShapes={_shapes_arg(profiles, 'max')}"]
    if fp16:
        args.append("--fp16")
    if int8:
        args.append("--int8")  # with Q/DQ in the model: explicit quantization, no calibration
    if workspace_gb is not None:
        args.append(f"--memPoolSize=workspace:{workspace_mib(workspace_gb)}M")
    if timing_cache is not None:
        args.append(f"--timingCacheFile={timing_cache}")
    return " ".join(shlex.quote(a) for a in args)


def workspace_mib(gb: float) -> int:
    """Workspace GiB -> whole MiB (trtexec's ``M`` suffix is base 2)."""
    if not gb > 0:
        raise NorcalError(f"workspace_gb {gb}: must be a positive number of GiB", param="workspace_gb")
    check_range("workspace_gb", gb, 0, MAX_WORKSPACE_GB, why="no GPU has more memory")
    return max(1, int(round(gb * 1024)))


MAX_WORKSPACE_GB = 4096


# ----------------------------------------------------------------------------- sidecar

def sidecar_path(engine_path) -> Path:
    """``model.engine`` -> ``model.engine.json``."""
    p = Path(engine_path)
    return p.with_name(p.name + ".json")




def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sidecar_content(model: onnx.ModelProto, options: BuildOptions, profiles: dict[str, Profile],
                    trtexec: str | None, built_by: str, tensorrt_version: str | None = None,
                    device: str | None = None, library: str = "TensorRT",
                    capabilities: tuple[str, ...] = ()) -> dict:
    """What the sidecar records: the ONNX metadata and I/O, and how the engine was built."""
    from norcal.core.version import __version__
    from norcal.core.files.onnx_io import graph_io

    inputs, outputs = graph_io(model)
    return {
        "format": SIDECAR_FORMAT,
        "engine": Path(options.engine_path).name,
        "onnx": str(options.onnx_path),
        "onnx_sha256": file_sha256(options.onnx_path),
        "metadata": {p.key: p.value for p in model.metadata_props},
        "inputs": inputs,
        "outputs": outputs,
        "profile": {n: {"min": list(p.min), "opt": list(p.opt), "max": list(p.max)} for n, p in profiles.items()},
        "precision": precision_name(options),
        "workspace_gb": options.workspace_gb,
        "timing_cache": str(options.timing_cache) if options.timing_cache else None,
        "built_by": built_by,
        "tensorrt_version": tensorrt_version,
        "library": library,  # TensorRT or TensorRT for RTX
        "compute_capabilities": list(capabilities),  # rtx: what the engine was built for
        "device": device,
        # what a runner must register before deserializing (C++: initLibNvInferPlugins)
        "plugins": plugins_needed(model),
        "trtexec": trtexec,
        "norcal_version": __version__,
    }


def read_sidecar(engine_path) -> dict | None:
    """The sidecar next to an engine, or None when there is none; a malformed one is an error."""
    from norcal.core.files.fileio import read_json

    path = sidecar_path(engine_path)
    if not path.is_file():
        return None
    data = read_json(path, "engine sidecar")
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        raise NorcalError(f"{path}: not a norcal engine sidecar (format {SIDECAR_FORMAT} expected)")
    return data


# ----------------------------------------------------------------------------- build

def precision_name(options: BuildOptions) -> str:
    """What the sidecar records: fp32, fp16, int8 or int8+fp16 (int8 layers, fp16 for the rest)."""
    if options.int8:
        return "int8+fp16" if options.fp16 else "int8"
    return "fp16" if options.fp16 else "fp32"


def refuse_ort_form(model: onnx.ModelProto, options: BuildOptions) -> None:
    """The int8 form written for ONNX Runtime's CPU kernels is no TensorRT input: say so in one line."""
    if {p.key: p.value for p in model.metadata_props}.get(INT8_FORM) == "ort":
        raise NorcalError(f"{options.onnx_path} is int8 in ONNX Runtime's form ({INT8_FORM}=ort: uint8 activations "
                          f"with zero points, int32 biases), which TensorRT does not build; quantize the fp32 "
                          f"model in the tensorrt form (form='tensorrt') for an engine", param="form='tensorrt'")


def check_int8_model(model: onnx.ModelProto, options: BuildOptions) -> None:
    """An int8 build takes an explicitly quantized model: TensorRT 10 deprecates the implicit
    calibrator, so the ranges must be in the graph (norcal quantize writes them), in the form
    TensorRT takes."""
    refuse_ort_form(model, options)
    if not any(n.op_type == "QuantizeLinear" for n in model.graph.node):
        done = {p.key: p.value for p in model.metadata_props}.get(PRECISION)
        if done:  # norcal quantize refuses a converted model: point at the one it came from
            raise NorcalError(f"{options.onnx_path} is {done} ({PRECISION}) and has no QuantizeLinear nodes: "
                              f"int8 builds take an explicitly quantized (Q/DQ) model; run norcal quantize on "
                              f"the fp32 model it came from and build its output", param="int8")
        raise NorcalError(f"{options.onnx_path} has no QuantizeLinear nodes: int8 builds take an explicitly "
                          f"quantized (Q/DQ) model; run norcal quantize on {options.onnx_path} with "
                          f"calibration images first and build its output", param="int8")


def check_precision(model: onnx.ModelProto, options: BuildOptions) -> None:
    """Refuse to build a quantized model (``norcal.precision`` int8) as a float engine: without
    the INT8 flag TensorRT runs its Q/DQ pairs in float, and the sidecar would say fp32."""
    refuse_ort_form(model, options)
    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get(PRECISION) == "int8":
        raise NorcalError(f"{options.onnx_path} is a quantized (Q/DQ) model, as its {PRECISION} "
                          "metadata records; build it with int8", param="int8")


def prepare(options: BuildOptions) -> tuple[onnx.ModelProto, dict[str, Profile], str]:
    """Load the model; return it, its profiles and the trtexec line (the TensorRT check is the caller's)."""
    from norcal.core.files.onnx_io import load_onnx

    model = load_onnx(options.onnx_path)
    if options.int8:
        check_int8_model(model, options)
    else:
        check_precision(model, options)
    profiles = engine_profiles(model, options)
    cmd = trtexec_command(options.onnx_path, options.engine_path, profiles, options.fp16,
                          options.workspace_gb, options.timing_cache, int8=options.int8)
    return model, profiles, cmd


def write_trtexec_sidecar(options: BuildOptions, model, profiles, cmd) -> dict:
    """Write the sidecar for an engine that trtexec will build; returns its content."""
    content = sidecar_content(model, options, profiles, cmd, built_by="trtexec")
    write_json(sidecar_path(options.engine_path), content)
    return content


def _make_logger(trt, verbose: bool, on_message: Callable[[str], None] | None):
    """A TensorRT logger that passes warnings and errors (all messages with ``verbose``) to
    ``on_message`` and keeps the errors for the report."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            bad = severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR)
            if bad:
                self.errors.append(msg)
            if on_message and (verbose or bad or severity == trt.ILogger.WARNING):
                on_message(f"[TensorRT] {msg}")

    return Logger()


def _parse(trt, builder, log, options: BuildOptions, title: str):
    """The network NVIDIA's parser makes of the model, plugins registered first; parser errors
    name each node."""
    register_plugins(trt, log, title)  # RoiAlign imports as ROIAlign_TRT while parsing
    network = builder.create_network(0)  # TensorRT 10 networks are always explicit-batch
    parser = trt.OnnxParser(network, log)
    # parse_from_file resolves external weights relative to the model's folder
    if not parser.parse_from_file(str(options.onnx_path)):
        errors = []
        for i in range(parser.num_errors):
            e = parser.get_error(i)
            # node_name/node_operator exist in the 10.x bindings; older ones only have node()
            name = getattr(e, "node_name", lambda: "")() or f"#{e.node()}"
            op = getattr(e, "node_operator", lambda: "")() or "?"
            where = f"node '{name}' ({op})" if e.node() >= 0 else "model"
            errors.append(f"{where}: {e.desc()}")
        raise NorcalError(f"{title} {trt.__version__} could not parse {options.onnx_path}: "
                          + "; ".join(errors or log.errors or ["no reason given"]))
    return network, parser


def _set_precision(trt, config, model: onnx.ModelProto, options: BuildOptions, title: str) -> None:
    """The builder flags for fp16 / int8, where the library still has them."""
    if options.fp16:
        # weak typing (the FP16 flag) is deprecated since 10.12 and gone in TensorRT 11 and RTX
        if not hasattr(trt.BuilderFlag, "FP16"):
            raise NorcalError(f"{title} {trt.__version__} has no FP16 builder flag: convert the ONNX "
                              f"model to mixed precision first and build without fp16", param="fp16")
        config.set_flag(trt.BuilderFlag.FP16)
    if options.int8:
        check_int8_model(model, options)
        # explicit quantization: the Q/DQ scales are the ranges, no int8_calibrator is set.
        # TensorRT 10's weakly typed networks take the INT8 flag with Q/DQ; TensorRT 11 removed
        # it (networks are strongly typed, the Q/DQ nodes alone make the layers int8)
        if hasattr(trt.BuilderFlag, "INT8"):
            config.set_flag(trt.BuilderFlag.INT8)


def _add_profile(builder, network, config, profiles: dict[str, Profile]) -> None:
    """One optimization profile over the network's dynamic inputs."""
    profile, dynamic = builder.create_optimization_profile(), 0
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if all(d >= 0 for d in tensor.shape):
            continue  # a static input takes no profile entry
        p = profiles.get(tensor.name)
        if p is None:
            raise NorcalError(f"input '{tensor.name}' {tuple(tensor.shape)} is dynamic and has no profile")
        profile.set_shape(tensor.name, p.min, p.opt, p.max)
        dynamic += 1
    if dynamic:
        config.add_optimization_profile(profile)


def _configure(trt, builder, network, model, options: BuildOptions, profiles, lib: Library,
               capabilities: tuple[str, ...]):
    """The builder config: workspace, precision, profile, targets, timing cache (and its path)."""
    config = builder.create_builder_config()
    if options.workspace_gb is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib(options.workspace_gb) << 20)
    _set_precision(trt, config, model, options, lib.title)
    _add_profile(builder, network, config, profiles)
    set_capabilities(trt, config, capabilities)
    cache_path = Path(options.timing_cache) if options.timing_cache else None
    if cache_path is not None:
        blob = cache_path.read_bytes() if cache_path.is_file() else b""
        config.set_timing_cache(config.create_timing_cache(blob), ignore_mismatch=False)
    return config, cache_path


def _gpu_name() -> str | None:
    """The CUDA device torch sees (what a TensorRT 10/11 engine is built for), if any."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def refuse_rtx_gaps(model: onnx.ModelProto, options: BuildOptions) -> None:
    """TensorRT for RTX builds no data-dependent layer and no plugin: name the nodes, and why."""
    gaps = rtx_gaps(model)
    if gaps:
        parts = [f"{op} ({', '.join(nodes[:3])}{', ...' if len(nodes) > 3 else ''}): {RTX_GAPS[op].reason}"
                 for op, nodes in gaps.items()]
        raise NorcalError(f"{options.onnx_path} cannot be built for TensorRT for RTX: " + "; ".join(parts),
                          param="target")


def build_engine(options: BuildOptions, model: onnx.ModelProto, profiles: dict[str, Profile],
                 trtexec: str, verbose: bool = False,
                 on_message: Callable[[str], None] | None = None) -> dict:
    """Build and serialize the engine with TensorRT's Python API; write it and its sidecar.

    Returns the sidecar content. TensorRT 10/11 needs a GPU; the rtx target (TensorRT for RTX)
    builds ahead of time without one. on_message: receives the library's warnings and errors
    (every message with ``verbose``), one line each.
    """
    lib = library(options.target)
    if lib.ahead_of_time:
        refuse_rtx_gaps(model, options)
    capabilities = check_capabilities(options.capabilities, lib)
    try:
        trt = lib.load()
    except NorcalError as e:
        raise NorcalError(f"{e}; or build with the trtexec command printed above") from None
    log = _make_logger(trt, verbose, on_message)
    builder = trt.Builder(log)
    network, _parser = _parse(trt, builder, log, options, lib.title)  # the parser owns the weights
    config, cache_path = _configure(trt, builder, network, model, options, profiles, lib, capabilities)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise NorcalError(f"{lib.title} {trt.__version__} failed to build {options.onnx_path}: "
                          + ("; ".join(log.errors) or "no reason given"))
    if cache_path is not None:
        write_bytes(cache_path, bytes(memoryview(config.get_timing_cache().serialize())))
    write_bytes(options.engine_path, bytes(memoryview(serialized)))
    # trtexec builds for TensorRT 10/11 only: an rtx engine's sidecar names no trtexec line
    content = sidecar_content(model, options, profiles, None if lib.ahead_of_time else trtexec,
                              built_by="norcal build",
                              tensorrt_version=str(trt.__version__),
                              device=None if lib.ahead_of_time else _gpu_name(),
                              library=lib.title, capabilities=capabilities)
    write_json(sidecar_path(options.engine_path), content)
    return content
