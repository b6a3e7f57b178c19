"""What differs between the NVIDIA libraries ``norcal build`` drives (the table of them is
norcal.core.tensorrt_targets.LIBRARIES).

TensorRT 10/11 (module ``tensorrt``) builds for the GPU it runs on; TensorRT for RTX (module
``tensorrt_rtx_bindings``, the same Python API) builds ahead of time on any machine, CPU-only
included, for the compute capabilities it is given, and compiles for the device on first run.
Here: the plugin registration and the targets; the builder code is one path for both. For
running: which library an engine was built with (its sidecar's ``library``) and whether this
GPU can run it (an RTX engine runs only on the compute capabilities it was built for).
"""

from __future__ import annotations

from norcal.core.errors import NorcalError
from norcal.core.tensorrt_targets import LIBRARIES, RTX_CAPABILITIES, RTX_DEFAULT_CAPABILITIES, Library


def register_plugins(trt, logger, title: str = "TensorRT") -> None:
    """Register NVIDIA's plugin library (ROIAlign_TRT for RoiAlign): the parser looks plugins up
    while it imports a node, and the runtime while it deserializes an engine that holds one."""
    if not trt.init_libnvinfer_plugins(logger, ""):
        raise NorcalError(f"{title} {trt.__version__} could not register its plugin library "
                          "(libnvinfer_plugin); a model with RoiAlign needs it")


def check_capabilities(capabilities: tuple[str, ...] | None, lib: Library) -> tuple[str, ...]:
    """The compute capabilities an ahead-of-time build targets (the defaults when None)."""
    if not lib.ahead_of_time:
        if capabilities:
            raise NorcalError(f"{lib.title} builds for the GPU it runs on: compute capabilities are "
                              "given only with the rtx target", param="capabilities")
        return ()
    chosen = tuple(capabilities or RTX_DEFAULT_CAPABILITIES)
    bad = [c for c in chosen if c not in RTX_CAPABILITIES]
    if bad:
        raise NorcalError(f"compute capability {', '.join(bad)}: {lib.title} builds for "
                          f"{', '.join(RTX_CAPABILITIES)} (RTX-class GPUs; not Hopper H100/H200)",
                          param="capabilities")
    return tuple(dict.fromkeys(chosen))


def set_capabilities(trt, config, capabilities: tuple[str, ...]) -> None:
    """Point an ahead-of-time build at the given compute capabilities ("8.9" -> SM89)."""
    if not capabilities:
        return
    config.num_compute_capabilities = len(capabilities)
    for i, cc in enumerate(capabilities):
        config.set_compute_capability(getattr(trt.ComputeCapability, "SM" + cc.replace(".", "")), i)


# ----------------------------------------------------------------------------- running an engine

def engine_library(engine_path, sidecar: dict | None) -> Library:
    """The library an engine was built with: its sidecar's ``library`` (the title norcal build
    writes, "TensorRT" or "TensorRT for RTX", or a --target key); TensorRT without a sidecar."""
    name = (sidecar or {}).get("library")
    if name is None:
        return LIBRARIES["tensorrt"]
    for lib in LIBRARIES.values():
        if name in (lib.title, lib.target):
            return lib
    raise NorcalError(f"{engine_path}: its sidecar names library {name!r}, which norcal does not run "
                      f"(one of {', '.join(repr(lib.title) for lib in LIBRARIES.values())})")


def load_engine_library(engine_path, lib: Library):
    """The module of the library that built the engine, or one line naming the engine and the
    module that is missing."""
    try:
        return lib.load()
    except NorcalError as e:
        raise NorcalError(f"cannot run {lib.title} engine {engine_path}: {e}") from None


def refuse_gpu(engine_path, sidecar: dict | None, lib: Library, capability: str, gpu: str) -> None:
    """Refuse, in one line saying why, an ahead-of-time (RTX) engine on a GPU it cannot run on:
    one whose compute capability TensorRT for RTX does not run on (Hopper H100/H200 is 9.0) or
    that the engine was not built for (its sidecar's ``compute_capabilities``). TensorRT 10/11
    engines are built on their GPU: their loading says what went wrong."""
    if not lib.ahead_of_time:
        return
    if capability not in RTX_CAPABILITIES:
        raise NorcalError(f"{engine_path} is a {lib.title} engine and cannot run on {gpu} (compute capability "
                          f"{capability}): {lib.title} engines run on RTX-class GPUs, compute capability "
                          f"{', '.join(RTX_CAPABILITIES)} only (not Hopper H100/H200); on this GPU build a "
                          f"TensorRT engine (target 'tensorrt')")
    built = [str(c) for c in (sidecar or {}).get("compute_capabilities") or ()]
    if built and capability not in built:
        raise NorcalError(f"{engine_path} was built for compute capability {', '.join(built)}, and {gpu} is "
                          f"{capability}: rebuild it for that GPU (target 'rtx', capabilities "
                          f"('{capability}',))")
