"""Padding masks that cost nothing where no image needs them: the backbone as an ONNX ``If``.

A graph that masks batch padding multiplies feature maps by per-image masks before its 3x3
convolutions. In ONNX Runtime those broadcast Muls break the blocked (NCHWc) convolution chain,
so each ResNet block's residual Add + Relu stays outside the fused convolution (about a tenth
of the time at batch 1, ``bench/graph_fusion.py``). Yet when every image of the batch fills the
input to its own multiple of the size divisibility (one image per batch, padded by the host as
the contract says; or a batch of equal sizes) every mask is all ones. The export therefore
traces the backbone twice, with and without masks, and joins the two as the branches of one
``If`` on "no image has padding beyond its own multiple": the same detections either way (the
masks are all ones there), and the unmasked branch fuses like a ``--batch 1`` export. The
price: each branch holds its own copy of the backbone's weights (ONNX Runtime blocks only
convolutions whose weights are in their own graph), the full-size R50-FPN's file grows by its
backbone (~27M parameters).

Only the backbone (ResNet + FPN) switches: the RPN and the ROI heads keep their masks in the
main graph, so the classifier logits and everything surgery looks for stay where they were.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn

from norcal.core.errors import NorcalError

from .modeling.layers import PaddingMasks

_DOMAIN = "norcal.switch"  # the trace's placeholder op; replaced before the graph is returned
_OP = "Backbone"
IF_NODE = "norcal.padding_switch"  # the If node's name; its condition nodes share the prefix


class _Placeholder(torch.autograd.Function):
    """The backbone as one opaque node in the main trace (its two forms are traced apart)."""

    @staticmethod
    def forward(ctx, x, image_sizes, backbone, divisibility, channels):
        # values only: the branches are traced apart, so the tracer must not record these ops
        state = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)
        try:
            return tuple(backbone(x, PaddingMasks(image_sizes, divisibility, True)))
        finally:
            torch._C._set_tracing_state(state)

    @staticmethod
    def symbolic(g, x, image_sizes, backbone, divisibility, channels):
        out = g.op(f"{_DOMAIN}::{_OP}", x, image_sizes, outputs=len(channels))
        out = out if isinstance(out, (list, tuple)) else [out]
        for o, c in zip(out, channels):  # [B, C, H, W] float maps; the shapes after them
            o.setType(x.type().with_sizes([None, c, None, None]))  # need C (mask head: 28x28)
        return out if len(out) > 1 else out[0]


def _channels(backbone: nn.Module) -> list[int]:
    """Channels of each feature map the backbone returns (FPN: every level alike)."""
    if hasattr(backbone, "out_feature"):  # ResNetBackbone: one stage
        return [int(backbone.out_channels[backbone.out_feature])]
    outs = [m.out_channels for n, m in backbone.named_children() if n.startswith("fpn_output")]
    if not outs:
        raise NorcalError("the padding switch knows ResNet and FPN backbones only")
    return [int(outs[0])] * len(backbone.strides)


class _PlaceholderBackbone(nn.Module):
    """Stands in for ``model.backbone`` during the main trace."""

    def __init__(self, backbone: nn.Module, divisibility: int):
        super().__init__()
        # not a submodule: its parameters belong to the branches, not to the main graph
        object.__setattr__(self, "inner", backbone)
        self.divisibility = divisibility
        self.strides = backbone.strides

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> list[torch.Tensor]:
        out = _Placeholder.apply(x, masks.image_sizes, self.inner, self.divisibility,
                                 _channels(self.inner))
        return list(out) if isinstance(out, tuple) else [out]


class _BackboneGraph(nn.Module):
    """The backbone alone, masked or not, for its own trace: (x, image_sizes) -> features."""

    def __init__(self, backbone: nn.Module, divisibility: int, masked: bool):
        super().__init__()
        self.backbone = backbone
        self.divisibility = divisibility
        self.masked = masked

    def forward(self, x: torch.Tensor, image_sizes: torch.Tensor):
        return tuple(self.backbone(x, PaddingMasks(image_sizes, self.divisibility, self.masked)))


def switchable(model: nn.Module) -> bool:
    """Does ``model`` have a backbone the switch can stand in for (GeneralizedRCNN)?"""
    backbone = getattr(model, "backbone", None)
    return (hasattr(model, "padding_masks") and hasattr(model, "proposal_generator")
            and isinstance(getattr(backbone, "strides", None), list))


@contextmanager
def placeholder_backbone(model: nn.Module):
    """``model.backbone`` replaced by the placeholder for the main trace."""
    inner = model.backbone
    model.backbone = _PlaceholderBackbone(inner, max(int(model.size_divisibility), 1))
    try:
        yield
    finally:
        model.backbone = inner


def _trace_backbone(model: nn.Module, masked: bool, images: torch.Tensor, sizes: torch.Tensor,
                    dynamic: dict, opset: int) -> onnx.GraphProto:
    module = _BackboneGraph(model.backbone, max(int(model.size_divisibility), 1), masked).eval()
    n = len(model.backbone.strides)
    x = (images - model.pixel_mean) / model.pixel_std
    outputs = [f"feature{i}" for i in range(n)]
    axes = {"x": dynamic.get("images", {}), "image_sizes": dynamic.get("image_sizes", {})}
    from norcal.export.pytorch.onnx_trace import trace_onnx

    return trace_onnx(module, (x, sizes), ["x", "image_sizes"], outputs, opset,
                      {k: v for k, v in axes.items() if v}).graph


def _as_branch(g: onnx.GraphProto, prefix: str, x_name: str, sizes_name: str) -> onnx.GraphProto:
    """``g`` as a branch body: its inputs read the main graph's x and image_sizes, every other
    name gets ``prefix``. The weights stay in the branch: ONNX Runtime's blocked (NCHWc)
    convolutions, and their fused residual Add + Relu, need initializers of the graph the
    convolution is in (read from the enclosing graph they run unblocked), so each branch holds
    its own copy."""
    rename = {"x": x_name, "image_sizes": sizes_name, "": ""}
    inits = []
    for init in g.initializer:
        rename[init.name] = prefix + init.name
        t = onnx.TensorProto()
        t.CopyFrom(init)
        t.name = rename[init.name]
        inits.append(t)
    nodes = []
    for node in g.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            raise NorcalError("the backbone's graph holds a subgraph; the padding switch cannot "
                              "move it into a branch")
        for o in node.output:
            rename.setdefault(o, prefix + o)
        n = onnx.NodeProto()
        n.CopyFrom(node)
        n.name = prefix + node.name
        n.input[:] = [rename[i] for i in node.input]
        n.output[:] = [rename[o] for o in node.output]
        nodes.append(n)
    outputs = [helper.make_tensor_value_info(rename[o.name], o.type.tensor_type.elem_type, None)
               for o in g.output]
    return helper.make_graph(nodes, prefix.rstrip("/"), [], outputs, initializer=inits)


def _condition(main: onnx.GraphProto, x_name: str, sizes_name: str, div: int) -> tuple[list, str]:
    """Nodes computing "every image fills the input to its own multiple of ``div``" (bool
    scalar): then every padding mask is all ones."""
    p = f"{IF_NODE}/"
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), p + name)  # noqa: E731
    main.initializer.extend([c("div_minus_1", div - 1), c("div", div), c("zero", 0)])
    nodes = [
        helper.make_node("Shape", [x_name], [p + "hw"], name=p + "hw", start=2, end=4),
        helper.make_node("Add", [sizes_name, p + "div_minus_1"], [p + "up"], name=p + "up"),
        helper.make_node("Div", [p + "up", p + "div"], [p + "blocks"], name=p + "blocks"),
        helper.make_node("Mul", [p + "blocks", p + "div"], [p + "padded"], name=p + "padded"),
        helper.make_node("Equal", [p + "padded", p + "hw"], [p + "fills"], name=p + "fills"),
        helper.make_node("Not", [p + "fills"], [p + "short"], name=p + "short"),
        helper.make_node("Cast", [p + "short"], [p + "short_i"], name=p + "short_i",
                         to=onnx.TensorProto.INT64),
        helper.make_node("ReduceMax", [p + "short_i"], [p + "any_short"], name=p + "any_short",
                         keepdims=0),
        helper.make_node("Equal", [p + "any_short", p + "zero"], [p + "cond"], name=p + "cond"),
    ]
    return nodes, p + "cond"


def join_branches(proto: onnx.ModelProto, masked: onnx.GraphProto, unmasked: onnx.GraphProto,
                  divisibility: int) -> None:
    """Replace the placeholder node in ``proto`` by the If of the two traced backbones."""
    g = proto.graph
    idx = [i for i, n in enumerate(g.node) if n.domain == _DOMAIN and n.op_type == _OP]
    if len(idx) != 1:
        raise NorcalError(f"expected one backbone placeholder in the traced graph, found {len(idx)}")
    place = g.node[idx[0]]
    x_name, sizes_name = place.input[0], place.input[1]
    if len(masked.output) != len(place.output) or len(unmasked.output) != len(place.output):
        raise NorcalError("the traced backbones' outputs do not match the placeholder's")
    then_g = _as_branch(unmasked, f"{IF_NODE}/unmasked/", x_name, sizes_name)
    else_g = _as_branch(masked, f"{IF_NODE}/masked/", x_name, sizes_name)
    cond_nodes, cond = _condition(g, x_name, sizes_name, max(int(divisibility), 1))
    if_node = helper.make_node("If", [cond], list(place.output), name=IF_NODE,
                               then_branch=then_g, else_branch=else_g)
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(nodes[:idx[0]] + cond_nodes + [if_node] + nodes[idx[0] + 1:])
    kept = [o for o in proto.opset_import if o.domain != _DOMAIN]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)


def trace_branches(model: nn.Module, images: torch.Tensor, sizes: torch.Tensor, dynamic: dict,
                   opset: int) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """(masked, unmasked) backbone graphs of ``model`` for :func:`join_branches`."""
    return (_trace_backbone(model, True, images, sizes, dynamic, opset),
            _trace_backbone(model, False, images, sizes, dynamic, opset))


def inline_masked(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` with the padding switch replaced by its masked branch (the graph a
    masked export had before the switch), for tools that do not look into subgraphs; ``proto``
    itself when it has no switch."""
    if not any(n.name == IF_NODE and n.op_type == "If" for n in proto.graph.node):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    nodes = []
    for n in g.node:
        if n.name == IF_NODE and n.op_type == "If":
            body = next(a.g for a in n.attribute if a.name == "else_branch")
            nodes.extend(body.node)
            g.initializer.extend(body.initializer)
            nodes.extend(helper.make_node("Identity", [b.name], [o], name=f"{o}/inlined")
                         for b, o in zip(body.output, n.output))
        elif not n.name.startswith(IF_NODE + "/"):  # the condition: nothing reads it now
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if not t.name.startswith(IF_NODE + "/") or t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return out
