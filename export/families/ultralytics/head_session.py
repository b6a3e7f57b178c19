"""Tune's network pass for the Ultralytics family as ``norcal infer`` runs the export: the
detector's head (the torch code the export traces) traced once into an ONNX Runtime CPU session."""

from __future__ import annotations

from typing import Callable, Sequence

from norcal.export.pytorch.onnx_trace import MIN_OPSET, trace_onnx


def head_session(module, head: Callable, shape: Sequence[int], output_names: Sequence[str], opset: int = MIN_OPSET):
    """An ONNX Runtime CPU session over ``head(module, images)`` (``images`` [B,3,H,W] float32
    -> a tuple of tensors named ``output_names``; ``module`` the torch module holding the
    weights), traced at ``shape`` with the batch dynamic, as the export traces it; intra-op
    threads torch's (tune's thread setting), not spinning between runs."""
    import onnxruntime as ort
    import torch

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.graph = module

        def forward(self, images):
            return tuple(head(self.graph, images))

    images = torch.rand(tuple(shape), generator=torch.Generator().manual_seed(0)) * 255.0
    graph = trace_onnx(Head().eval(), (images,), ["images"], output_names, opset,
                       {n: {0: "batch"} for n in ("images", *output_names)})
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    # tune runs host code (torch) between two runs: threads spinning for the next run would take its cores
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(graph.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
