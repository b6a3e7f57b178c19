"""NorCal in eager PyTorch for sigmoid heads without a background slot (RetinaNet, YOLO, RT-DETR)."""

from __future__ import annotations

import numpy as np
import torch

from norcal.core.calibration.formula import calibrate, check_variant
from norcal.core.errors import NorcalError


class SigmoidNorCal:
    """Mixin for a detector module with ``num_classes`` whose scores are sigmoid(class logits):
    the log prior and variant the PyTorch runner sets (named like FastRCNNOutputLayers' state,
    so the runner treats every head alike), and the calibrated scores."""

    head_name = "the head"  # said in the shape error

    def init_norcal(self) -> None:
        self.log_prior: torch.Tensor | None = None
        self.mechanism, self.renormalize, self.use_sigmoid = "exp", False, True

    def set_log_prior(self, log_prior, mechanism: str = "exp", renormalize: bool | None = None) -> None:
        """``log_prior`` [C] (background none) from ``norcal.core.calibration.formula.log_prior``; None
        restores the plain sigmoid."""
        self.renormalize = check_variant(mechanism, renormalize, "sigmoid")
        self.mechanism = mechanism
        if log_prior is None:
            self.log_prior = None
            return
        lp = torch.as_tensor(np.asarray(log_prior, dtype=np.float64), dtype=torch.float32)
        if lp.shape != (self.num_classes,):
            raise NorcalError(f"log prior has shape {tuple(lp.shape)}, {self.head_name} needs "
                              f"({self.num_classes},) (C classes, no background)")
        self.log_prior = lp

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Class probabilities: the plain sigmoid, or NorCal's sigmoid variant in eager mode."""
        if self.log_prior is None:
            return torch.sigmoid(logits)
        if torch.onnx.is_in_onnx_export():
            raise NorcalError("export the plain model (no log prior set); the NorCal node is "
                              "inserted into the ONNX graph afterwards (norcal.export.graph.surgery)")
        return calibrate(logits, self.log_prior.to(logits.device), mechanism=self.mechanism,
                         renormalize=self.renormalize, activation="sigmoid", background="none")
