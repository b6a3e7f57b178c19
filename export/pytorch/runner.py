"""TorchRunner: our PyTorch detector behind the Runner interface, the reference for parity.

It takes the same feeds (``images`` float32 [B,3,H,W] BGR, ``image_sizes`` int64 [B,2]) and
returns the same named outputs as the exported ONNX graph, so parity code never knows which
backend it compares. A NorCal ONNX model is compared against the PyTorch model with the same
calibration: :func:`onnx_calibration` reads what surgery baked in (the ``norcal.log_prior``
initializer and the ``norcal.*`` metadata) and :func:`calibrated` gives it to the box predictor.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from norcal.core import contract
from norcal.core.calibration.meta import calibration_from_metadata
from norcal.core.calibration.spec import Calibration
from norcal.core.errors import NorcalError
from norcal.core.contract import INPUT_NAMES, OUTPUT_NAMES, PRIOR_NAME


def onnx_calibration(model) -> Calibration | None:
    """The NorCal calibration of an ONNX model (a path or ModelProto), its prior as stored (the
    graph's dtype's values); None for a plain model."""
    import onnx
    from onnx import numpy_helper

    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise NorcalError(f"{path}: no such ONNX file")
        try:
            model = onnx.load(str(path))
        except Exception as e:  # protobuf's DecodeError and friends: not an ONNX file
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise NorcalError(f"{path}: not a readable ONNX model ({why})") from None
    meta = {p.key: p.value for p in model.metadata_props if p.key.startswith(contract.PREFIX)}
    prior = next((t for t in model.graph.initializer if t.name == PRIOR_NAME), None)
    if prior is None:
        if contract.GAMMA in meta:
            raise NorcalError(f"the model's metadata says NorCal gamma {meta[contract.GAMMA]} but it has "
                              f"no {PRIOR_NAME} initializer")
        return None
    return calibration_from_metadata(meta, numpy_helper.to_array(prior).copy())


def box_predictor(model):
    """The model's FastRCNNOutputLayers (``roi_heads.box_predictor``)."""
    pred = getattr(getattr(model, "roi_heads", None), "box_predictor", None)
    if pred is None and hasattr(model, "set_log_prior"):
        pred = model  # RetinaNet: the model's own sigmoid head
    if pred is None or not hasattr(pred, "set_log_prior"):
        raise NorcalError("the PyTorch model has no NorCal-capable box predictor (roi_heads.box_predictor)")
    return pred


@contextlib.contextmanager
def predictor_state(pred):
    """Save a box predictor's NorCal state (log_prior, mechanism, renormalize, all of which
    ``set_log_prior`` sets) and restore it on exit."""
    saved = (pred.log_prior, pred.mechanism, pred.renormalize)
    try:
        yield pred
    finally:
        pred.log_prior, pred.mechanism, pred.renormalize = saved


@contextlib.contextmanager
def calibrated(model, calibration: Calibration | None):
    """Within the block the model's box predictor scores with ``calibration`` (None: plain
    scores); its previous state comes back after."""
    with predictor_state(box_predictor(model)) as pred:
        _apply(pred, calibration)
        yield model


def _apply(pred, cal: Calibration | None) -> None:
    if cal is None:
        pred.set_log_prior(None)
        return
    model_act = "sigmoid" if pred.use_sigmoid else "softmax"
    if cal.activation != model_act:
        raise NorcalError(f"the ONNX model's NorCal node uses {cal.activation} but the PyTorch classifier "
                          f"uses {model_act}: they are not the same model")
    # a background-first classifier (torchvision) and a prior laid out otherwise would misalign
    slot = getattr(pred, "background", "last")
    if "first" in (slot, cal.background) and cal.background != slot:
        raise NorcalError(f"the calibration puts the background {cal.background or 'last'} but the PyTorch "
                          f"classifier has it {slot}: the prior would be misaligned")
    # checks the width (C+1)
    pred.set_log_prior(cal.log_prior(), cal.mechanism, cal.renormalized)


class TorchRunner:
    """Runner over our PyTorch GeneralizedRCNN (``norcal.export.rcnn.modeling``), CPU by default.

    model: the detector (``load_detector``); calibration: NorCal to apply while inferring
    (see :func:`onnx_calibration`); metadata: what an ONNX runner's ``metadata`` would hold
    (resize sizes), for tools that prepare inputs from it.
    """

    def __init__(self, model, name: str = "pytorch", calibration: Calibration | None = None,
                 metadata: dict[str, str] | None = None, device: str = "cpu", threads: int | None = None):
        import torch

        self.model = model.eval().to(device)
        self.device = torch.device(device)
        self.name = name
        self.calibration = calibration
        self.threads = threads
        self.metadata: dict[str, str] = dict(metadata or {})
        self.input_names = list(INPUT_NAMES)
        has_masks = getattr(getattr(model, "roi_heads", None), "mask_head", None) is not None
        self.output_names = [n for n in OUTPUT_NAMES if n != "masks" or has_masks]
        if calibration is not None:
            box_predictor(model)  # fail now, not at the first batch

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """images float32 [B,3,H,W], image_sizes int64 [B,2] -> outputs by name (numpy)."""
        import torch

        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise NorcalError(f"{self.name}: missing inputs {', '.join(missing)}")
        dtype = next(self.model.parameters()).dtype  # float64 for :meth:`in_float64`'s copy
        images = torch.as_tensor(np.ascontiguousarray(feeds["images"], np.float32), device=self.device).to(dtype)
        sizes = torch.as_tensor(np.asarray(feeds["image_sizes"], np.int64), device=self.device)
        old_threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(int(self.threads))
        try:
            with torch.no_grad(), calibrated(self.model, self.calibration):
                out = self.model.inference(images, sizes)
        finally:
            torch.set_num_threads(old_threads)
        return {k: out[k].detach().cpu().numpy() for k in self.output_names}

    def in_float64(self, name: str | None = None) -> "TorchRunner":
        """This runner with its model copied to float64 (same calibration, metadata and outputs):
        its outputs differ from this runner's by this runner's own float32 rounding alone, the
        reference's noise floor that parity judges fp32 candidates against."""
        import copy

        twin = copy.copy(self)
        twin.model = copy.deepcopy(self.model).double()
        twin.name = name or f"{self.name}-fp64"
        return twin
