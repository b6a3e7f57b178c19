"""The NVIDIA libraries norcal builds with, and what each needs beyond its ONNX parser's op table: the ops its parser imports
as plugins (and the library that holds them), and what TensorRT for RTX cannot build.

TensorRT 10 and 11 build ``RoiAlign`` from the plugin ``ROIAlign_TRT`` (TensorRT >= 8.5) in
NVIDIA's plugin library ``libnvinfer_plugin``, which must be registered before parsing
(Python ``trt.init_libnvinfer_plugins(logger, "")``) and before deserializing an engine that
holds it (C++ ``initLibNvInferPlugins``, linked ``nvinfer_plugin``). The engine sidecar lists
the plugins so that a runner can refuse an engine whose plugin it cannot load.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import onnx

from norcal.core.errors import NorcalError

PLUGIN_LIBRARY = "libnvinfer_plugin"  # NVIDIA's plugin library (link name nvinfer_plugin)


@dataclass(frozen=True)
class PluginImport:
    """An ONNX op that TensorRT's parser imports as a plugin."""

    op_type: str
    plugin: str  # the plugin creator's name in the registry
    since: str  # the first TensorRT that imports the op this way
    library: str = PLUGIN_LIBRARY


PLUGIN_OPS = {p.op_type: p for p in (PluginImport("RoiAlign", "ROIAlign_TRT", "8.5"),)}


@dataclass(frozen=True)
class RtxGap:
    """An op TensorRT for RTX does not build although TensorRT 10/11 does, and NVIDIA's reason."""

    op_type: str
    reason: str


# What NVIDIA's TensorRT for RTX 1.7.1.116 says of each (its parser's or builder's own words,
# measured here); TensorRT 10/11 build all three natively or from libnvinfer_plugin
RTX_GAPS = {g.op_type: g for g in (
    RtxGap("NonZero", "TensorRT for RTX imports NonZero as a plugin it does not ship ('NonZero plugin "
                      "creator version 1 was not found in plugin registry'): its output size depends on the data"),
    RtxGap("NonMaxSuppression", "TensorRT for RTX has no layer for it ('has no runners that implement it'): "
                                "its output size depends on the data"),
    RtxGap("RoiAlign", "TensorRT for RTX registers ROIAlign_TRT but cannot create it ('ROIAlign plugin "
                       "was not found in the plugin registry!'): it ships no plugin library"),
)}

# an op outside the ONNX domains: both parsers look it up as a plugin; TensorRT 10/11 find
# NVIDIA's (EfficientNMS_TRT, ...) in libnvinfer_plugin, RTX has no such library
RTX_CUSTOM_OP = RtxGap("(custom domain)", "TensorRT for RTX ships no plugin library: an op outside the "
                                          "ONNX domains imports as a plugin, which it cannot find")

# compute capabilities TensorRT for RTX builds for (no Hopper: H100/H200 are not RTX-class)
RTX_CAPABILITIES = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")
RTX_DEFAULT_CAPABILITIES = ("8.0", "8.6", "8.9", "12.0", "12.1")  # 7.5 (Turing) on request


def _all_nodes(model: onnx.ModelProto):
    """Every node of the graph and of its model-local functions (the NorCal node's body)."""
    yield from model.graph.node
    for f in model.functions:
        yield from f.node


def plugins_needed(model: onnx.ModelProto) -> list[dict]:
    """The plugins an engine built from the model holds: plugin, library, since, the nodes."""
    found: dict[str, dict] = {}
    for node in _all_nodes(model):
        p = PLUGIN_OPS.get(node.op_type)
        if p is not None:
            entry = found.setdefault(p.plugin, {"plugin": p.plugin, "library": p.library,
                                                "since": p.since, "op_type": p.op_type, "nodes": []})
            entry["nodes"].append(node.name or f"({node.op_type})")
    return list(found.values())


def rtx_gaps(model: onnx.ModelProto) -> dict[str, list[str]]:
    """op type -> the model's nodes of it that TensorRT for RTX cannot build."""
    found: dict[str, list[str]] = {}
    for node in _all_nodes(model):
        if node.op_type in RTX_GAPS:
            found.setdefault(node.op_type, []).append(node.name or f"({node.op_type})")
    return found


@dataclass(frozen=True)
class Library:
    """One NVIDIA builder library: how to import it and what it builds for."""

    target: str  # what --target names
    module: str  # its Python import name
    title: str  # how messages name it
    install: str  # how to get it
    min_major: int
    ahead_of_time: bool  # builds without the target GPU, for the capabilities it is given

    def load(self):
        """The library's module, or a NorcalError saying it is missing (or too old)."""
        try:
            trt = importlib.import_module(self.module)
        except ImportError:
            raise NorcalError(f"{self.title}'s Python package is not installed (module {self.module}; "
                              f"{self.install})") from None
        major = int(str(trt.__version__).split(".")[0])
        if major < self.min_major:
            raise NorcalError(f"{self.title} {trt.__version__} is too old: norcal needs "
                              f"{self.title} {self.min_major} or newer")
        return trt


LIBRARIES = {lib.target: lib for lib in (
    Library("tensorrt", "tensorrt", "TensorRT",
            "pip install 'norcal-deploy[tensorrt]'; on a Jetson it comes with JetPack", 10, False),
    Library("rtx", "tensorrt_rtx_bindings", "TensorRT for RTX",
            "pip install 'norcal-deploy[tensorrt-rtx]'", 1, True),
)}


def library(target: str) -> Library:
    """The library a --target names."""
    if target not in LIBRARIES:
        raise NorcalError(f"target '{target}': one of {', '.join(LIBRARIES)}", param="target")
    return LIBRARIES[target]
