"""What differs between the NVIDIA libraries ``norcal build`` drives (the table of them is
norcal.core.tensorrt_targets.LIBRARIES).

TensorRT 10/11 (module ``tensorrt``) builds for the GPU it runs on; TensorRT for RTX (module
``tensorrt_rtx_bindings``, the same Python API) builds ahead of time on any machine, CPU-only
included, for the compute capabilities it is given, and compiles for the device on first run.
Here: the plugin registration and the targets; the builder code is one path for both.
"""

from __future__ import annotations

from norcal.core.errors import NorcalError
from norcal.core.tensorrt_targets import RTX_CAPABILITIES, RTX_DEFAULT_CAPABILITIES, Library


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
