"""TensorRTRunner: the Runner interface over a serialized TensorRT 10/11 or TensorRT for RTX engine.

Device memory comes from torch CUDA tensors (no pycuda), and the engine runs with
``execute_async_v3`` on a torch stream. Model metadata (NorCal settings, resize sizes) is
read from the sidecar ``<engine>.json`` written by ``norcal build``, and so is the library
that built the engine (``library``: TensorRT -> module ``tensorrt``, TensorRT for RTX ->
``tensorrt_rtx_bindings``, looked up in norcal.core.tensorrt_targets.LIBRARIES); without a
sidecar, TensorRT. An RTX engine is refused before it is deserialized on a GPU whose compute
capability it was not built for or TensorRT for RTX does not run on (Hopper).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file
from norcal.runtime.backends.base import BackendRunner
from norcal.runtime.tensorrt_build import read_sidecar
from norcal.runtime.tensorrt_library import engine_library, load_engine_library, refuse_gpu, register_plugins


class NoSidecarWarning(UserWarning):
    """An engine without its sidecar: the default resize sizes apply."""

    params = ("min_size", "max_size")  # what the message names, for front ends to spell


def _torch_cuda():
    try:
        import torch
    except ImportError:
        raise NorcalError("the TensorRT runner needs torch with CUDA (pip install 'norcal-deploy[torch]')") from None
    if not torch.cuda.is_available():
        raise NorcalError("the TensorRT runner needs a CUDA GPU, and torch sees none")
    return torch


def engine_metadata(engine_path, sidecar: dict | None = None) -> tuple[dict, dict[str, str]]:
    """(sidecar, model metadata) of an engine (``sidecar``: the one already read, else read
    here). Without a sidecar ``<engine>.json`` the resize sizes are unknown: a warning on
    stderr says the defaults apply unless given explicitly (``norcal infer --min-size/--max-size``)."""
    sidecar = read_sidecar(engine_path) if sidecar is None else sidecar
    if sidecar is None:
        from norcal.core.contract import DEFAULTS, MAX_SIZE_TEST, MIN_SIZE_TEST
        from norcal.runtime.tensorrt_build import sidecar_path

        warnings.warn(f"{sidecar_path(engine_path)} not found (norcal build writes it next to the "
                      f"engine): no model metadata, so images are resized to the default "
                      f"{DEFAULTS[MIN_SIZE_TEST]}/{DEFAULTS[MAX_SIZE_TEST]} unless min_size/max_size "
                      "are given", NoSidecarWarning, stacklevel=3)
        sidecar = {}
    return sidecar, dict(sidecar.get("metadata", {}))


class TensorRTRunner(BackendRunner):
    """Run a TensorRT engine: ``infer({"images": [B,3,H,W] f32, "image_sizes": [B,2] i64})``."""

    def __init__(self, engine_path, device: int = 0):
        self.engine_path = Path(engine_path)
        sidecar = read_sidecar(self.engine_path)
        self.library = engine_library(self.engine_path, sidecar)  # the one that built it
        trt = load_engine_library(self.engine_path, self.library)
        torch = _torch_cuda()
        self._trt, self._torch = trt, torch
        readable_file(self.engine_path)  # missing, or a folder, a FIFO, a device: said as such
        self.sidecar, self.metadata = engine_metadata(self.engine_path, sidecar)
        self.device = torch.device("cuda", device)
        major, minor = torch.cuda.get_device_capability(self.device)
        refuse_gpu(self.engine_path, sidecar, self.library, f"{major}.{minor}",
                   torch.cuda.get_device_name(self.device))
        torch.cuda.set_device(self.device)
        title = self.library.title
        self.engine = self._deserialize(trt, title)
        built = self.sidecar.get("tensorrt_version") or "an unknown version"
        if self.engine is None:
            raise NorcalError(f"{self.engine_path}: {title} {trt.__version__} cannot load it (built with "
                              f"{title} {built} on {self.sidecar.get('device') or 'an unknown GPU'}; "
                              f"engines only load on the {title} version and GPU model that built them)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        prefix = "tensorrt-rtx" if self.library.ahead_of_time else "tensorrt"
        self.name = f"{prefix}-{self.sidecar.get('precision', 'fp32')}"
        self._stream = torch.cuda.Stream(device=self.device)

    def _deserialize(self, trt, title: str = "TensorRT"):
        """The engine, NVIDIA's plugin library registered first: an engine holding ROIAlign_TRT
        (every R-CNN) finds its plugin creator while it deserializes."""
        self._logger = trt.Logger(trt.Logger.WARNING)
        register_plugins(trt, self._logger, title)
        self._runtime = trt.Runtime(self._logger)
        return self._runtime.deserialize_cuda_engine(self.engine_path.read_bytes())

    def _torch_dtype(self, name: str):
        trt, torch = self._trt, self._torch
        table = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16,
                 trt.DataType.INT32: torch.int32, trt.DataType.INT64: torch.int64,
                 trt.DataType.BOOL: torch.bool, trt.DataType.UINT8: torch.uint8,
                 trt.DataType.INT8: torch.int8, trt.DataType.BF16: torch.bfloat16}
        dtype = self.engine.get_tensor_dtype(name)
        if dtype not in table:
            raise NorcalError(f"engine tensor '{name}' has type {dtype}, which the runner cannot hold")
        return table[dtype]

    def input_bounds(self, name: str):
        """The engine's static dims, or its optimization profile's min .. max."""
        fixed = tuple(int(d) for d in self.engine.get_tensor_shape(name))
        if all(d >= 0 for d in fixed):
            return fixed, fixed  # a static input: no profile to consult
        lo, _, hi = (tuple(int(x) for x in d) for d in self.engine.get_tensor_profile_shape(name, 0))
        return lo, hi

    def shape_refusal(self, name: str, shape: tuple[int, ...], lo, hi) -> str:
        return (f"input '{name}' has shape {shape}, outside the engine's profile {lo} .. {hi}; rebuild the "
                "engine with a profile that covers it (batch, image sizes)")

    def missing_inputs(self, missing: list[str]) -> str:
        return f"missing inputs {missing} (the engine takes {self.input_names})"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch on the GPU; returns host arrays by output name."""
        torch = self._torch
        keep = []  # device tensors must outlive the launch
        with torch.cuda.stream(self._stream):
            for name in self.input_names:
                dtype = self._torch_dtype(name)
                host = torch.from_numpy(np.ascontiguousarray(feeds[name])).to(dtype)
                dev = host.to(self.device, non_blocking=False).contiguous()
                keep.append(dev)
                self.context.set_input_shape(name, tuple(dev.shape))
                self.context.set_tensor_address(name, dev.data_ptr())
            outputs = {}
            for name in self.output_names:
                shape = tuple(self.context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise NorcalError(f"output '{name}' has a data-dependent shape {shape}; the ONNX "
                                      f"contract's outputs are fixed-size (padded)")
                out = torch.empty(shape, dtype=self._torch_dtype(name), device=self.device)
                outputs[name] = out
                self.context.set_tensor_address(name, out.data_ptr())
            if not self.context.execute_async_v3(self._stream.cuda_stream):
                raise NorcalError(f"{self.engine_path}: TensorRT execution failed")
        self._stream.synchronize()
        return {name: t.cpu().numpy() for name, t in outputs.items()}
