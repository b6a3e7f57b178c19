"""Export our GeneralizedRCNN to ONNX with the project's contract (norcal.core.contract, docs/architecture.md).

Inputs ``images`` float32 [B,3,H,W] (BGR 0-255, zero-padded to a multiple of 32) and
``image_sizes`` int64 [B,2]; outputs ``num_detections`` int64 [B], ``boxes`` [B,K,4],
``scores`` [B,K], ``classes`` int64 [B,K], ``masks`` [B,K,28,28]. B, H and W are dynamic
unless fixed. Uses the TorchScript exporter (``dynamo=False``): the model's NMS and ROIAlign
carry their own ONNX symbolics, so the graph holds plain NonMaxSuppression / RoiAlign-16.
The box classifier's logits [B, R, C+1] are named ``cls_logits`` and the name is recorded in
the metadata (``norcal.classifier_logits``), so surgery needs no search for them; a cascade's
stages' logits are ``cls_logits_stage1``, ... and the metadata lists them all.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager, nullcontext

import onnx
import torch

from norcal.core.contract import (CANDIDATE_BOXES, CANDIDATE_CLASSES, CANDIDATE_SCORES, INPUT_NAMES, MASK_HEAD_ROIS,
                                  OUTPUT_NAMES, PADDING_MASKS, classifier_metadata)
from norcal.core.errors import NorcalError

from norcal.export.pytorch.onnx_trace import MIN_OPSET, drop_outputs, require_opset, trace_onnx

from .modeling.folding import frozen_bn_folded
from .padding_switch import join_branches, placeholder_backbone, switchable, trace_branches
from .modeling.roi_heads import MASK_ROIS, MASK_ROIS_STATIC, MASK_ROIS_VALID
from .spec import RETINANET, ModelSpec, box_classifier

def _dummy_size(value: int | None, default: int, div: int) -> int:
    v = default if value is None else int(value)
    if v <= 0 or (div > 1 and v % div):
        raise NorcalError(f"export size {v} must be a positive multiple of {div}")
    return v


def _fix_detection_dim(proto: onnx.ModelProto, k: int, batch: int | None = None) -> None:
    """Outputs are padded to K detections (like EfficientNMS): say so in their shapes, so
    TensorRT, Triton and users see [B, K, ...] instead of a traced symbol; likewise B when the
    batch is fixed."""
    for out in proto.graph.output:
        dims = out.type.tensor_type.shape.dim
        if batch is not None and len(dims) >= 1:
            dims[0].Clear()
            dims[0].dim_value = batch
        if out.name != "num_detections" and len(dims) >= 2:
            dims[1].Clear()
            dims[1].dim_value = k


def needs_padding_masks(batch: int | None, height: int | None, width: int | None,
                        host_divisibility: int = 1, own_divisibility: int = 1) -> bool:
    """Can padding beyond an image's own size-divisibility multiple reach the graph? Yes with
    more than one image per batch (padded to the largest) or a fixed input size (padded up to
    it); a batch of one at a dynamic size is padded by the host to its multiple of
    ``host_divisibility``, which is the image's own only when detectron2 pads it alike
    (``own_divisibility``: FPN 32; C4 and DC5 pad to no multiple, so their host padding is extra)."""
    extra = max(int(host_divisibility), 1) > max(int(own_divisibility), 1)
    return batch != 1 or height is not None or width is not None or extra


@contextmanager
def _graph_choices(model: torch.nn.Module, padding_masks: bool, mask_head_rois: str):
    """Set the export's choices on ``model`` for the trace; the model gets its own back. The
    static form (no data-dependent shapes) also pools every box at every FPN level."""
    from .modeling.poolers import ROIPooler

    heads = getattr(model, "roi_heads", None)
    saved = (getattr(model, "padding_masks", None), getattr(heads, "mask_rois", None))
    poolers = [m for m in model.modules() if isinstance(m, ROIPooler)]
    saved_select = [m.select_rois for m in poolers]
    if saved[0] is not None:
        model.padding_masks = padding_masks
    if saved[1] is not None:
        heads.mask_rois = mask_head_rois
    for m in poolers:
        m.select_rois = mask_head_rois != MASK_ROIS_STATIC
    try:
        yield
    finally:
        if saved[0] is not None:
            model.padding_masks = saved[0]
        if saved[1] is not None:
            heads.mask_rois = saved[1]
        for m, v in zip(poolers, saved_select):
            m.select_rois = v


def export_onnx(model: torch.nn.Module, spec: ModelSpec, *, batch: int | None = None,
                height: int | None = None, width: int | None = None,
                opset: int = MIN_OPSET, mask_head_rois: str = MASK_ROIS_VALID,
                padding_masks: bool | None = None, padding_switch: bool = False,
                check: bool = True, host_nms: bool = False) -> onnx.ModelProto:
    """Trace ``model`` (from ``modeling.model_from_state``) to an ONNX model in memory.

    ``batch``/``height``/``width``: fix that dimension (height/width a multiple of the spec's
    size divisibility); left None it stays dynamic. ``mask_head_rois``: "valid" runs the mask
    head on the detections only (NonZero: data-dependent shapes), "static" on all K slots.
    ``padding_masks``: mask batch padding in the feature maps; None: where padding can reach
    (:func:`needs_padding_masks`). False with a fixed size promises images that fill it.
    ``padding_switch`` (with padding masks, R-CNN backbones): the backbone is traced with and
    without masks and the graph picks the unmasked one when every image fills the input to its
    own multiple of the size divisibility (``norcal.export.rcnn.padding_switch``).
    FrozenBN is folded into the convolutions. With ``check`` the graph is checked with
    ``onnx.checker.check_model(full_check=True)`` before it is returned (a caller that checks
    the final graph anyway, like the export job, passes False: a full check of a full-size
    model costs a second). ``host_nms`` (RetinaNet): the graph's outputs are its candidates
    (norcal.core.contract CANDIDATE_*), the NMS left to the host.
    """
    require_opset(opset)
    height, width, padding_masks = _checked_choices(model, spec, batch, height, width, mask_head_rois,
                                                    padding_masks)
    images, sizes = _dummy_inputs(spec, batch, height, width)
    model = model.eval()
    dynamic = _dynamic_axes(batch, height, width)
    names = ([CANDIDATE_BOXES, CANDIDATE_SCORES, CANDIDATE_CLASSES] if host_nms
             else [n for n in OUTPUT_NAMES if n != "masks" or spec.mask_on])
    classifier = box_classifier(spec)  # its logits become named outputs, then internal again
    logits = list(classifier.logits)
    switch = padding_masks and padding_switch and switchable(model)
    proto = _trace(model, images, sizes, dynamic, opset, names, logits, switch, padding_masks, mask_head_rois,
                   {"candidates": True} if host_nms else {})
    drop_outputs(proto, logits)
    props = classifier_metadata(classifier)
    if spec.meta_architecture != RETINANET:  # RetinaNet always masks padding, has no mask head
        props[PADDING_MASKS] = "true" if padding_masks else "false"
        if spec.mask_on:
            props[MASK_HEAD_ROIS] = mask_head_rois
    onnx.helper.set_model_props(proto, props)
    if not host_nms:
        _fix_detection_dim(proto, int(spec.detections_per_image), batch)
    if check:
        onnx.checker.check_model(proto, full_check=True)
    return proto


def _checked_choices(model: torch.nn.Module, spec: ModelSpec, batch: int | None, height: int | None,
                     width: int | None, mask_head_rois: str,
                     padding_masks: bool | None) -> tuple[int | None, int | None, bool]:
    """The export's (height, width, padding_masks) once checked: a square-padded model's fixed
    side, the padding masks resolved where None."""
    if mask_head_rois not in MASK_ROIS:
        raise NorcalError(f"mask_head_rois must be one of {', '.join(MASK_ROIS)}, "
                          f"got {mask_head_rois!r}")
    square = int(getattr(getattr(model, "backbone", None), "square", 0))
    if square:  # ViTDet: its absolute positions are those of one token grid
        if {height, width} - {None, square}:
            raise NorcalError(f"this model takes images padded to its {square}x{square} square only, not "
                              f"{height}x{width}", param=("height", "width"))
        height = width = square
    if padding_masks is None:
        padding_masks = needs_padding_masks(batch, height, width, spec.size_divisibility,
                                            getattr(model, "size_divisibility", spec.size_divisibility))
    elif not padding_masks and (batch is None or batch > 1):
        raise NorcalError("padding_masks=False needs batch=1: a batch pads its images to the "
                          "largest")
    return height, width, padding_masks


def _dummy_inputs(spec: ModelSpec, batch: int | None, height: int | None,
                  width: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The trace's (images, image_sizes): seeded random pixels at the fixed or a default size."""
    div = max(int(spec.size_divisibility), 1)
    b = 1 if batch is None else int(batch)
    if b <= 0:
        raise NorcalError(f"export batch must be positive, got {b}")
    # the trace is valid for any size (a square-padded model's: its square); a small default keeps it quick
    h = _dummy_size(height, max(128, div), div)
    w = _dummy_size(width, max(128, div), div)
    gen = torch.Generator().manual_seed(0)
    images = torch.rand((b, 3, h, w), generator=gen) * 255.0
    sizes = torch.tensor([[h, w]] * b, dtype=torch.int64)
    return images, sizes


def _dynamic_axes(batch: int | None, height: int | None, width: int | None) -> dict[str, dict[int, str]]:
    """Each input's and output's dynamic axes: those of the dimensions left None."""
    dynamic: dict[str, dict[int, str]] = {name: {} for name in INPUT_NAMES + OUTPUT_NAMES}
    if batch is None:
        for name in dynamic:
            dynamic[name][0] = "batch"
    if height is None:
        dynamic["images"][2] = "height"
    if width is None:
        dynamic["images"][3] = "width"
    return dynamic


def _trace(model: torch.nn.Module, images: torch.Tensor, sizes: torch.Tensor, dynamic: dict, opset: int,
           names: list[str], logits: list[str], switch: bool, padding_masks: bool,
           mask_head_rois: str, forward_options: dict) -> onnx.ModelProto:
    """The traced graph, with the classifier's ``logits`` as extra outputs and, with ``switch``,
    the padding switch's two backbone branches joined in."""
    with torch.no_grad(), warnings.catch_warnings(), frozen_bn_folded(model), \
            _graph_choices(model, padding_masks, mask_head_rois):
        warnings.simplefilter("ignore")  # tracer chatter about Python ints and constants
        branches = trace_branches(model, images, sizes, dynamic, opset) if switch else None
        with placeholder_backbone(model) if switch else nullcontext():
            # the logits as more outputs get their name; dropped as outputs once the branches are in
            proto = trace_onnx(model, (images, sizes, {"with_cls_logits": True, **forward_options}), INPUT_NAMES,
                               [*names, *logits],
                               opset, {k: v for k, v in dynamic.items() if v and (k in INPUT_NAMES or k in names)},
                               autograd_inlining=False)
    if switch:
        join_branches(proto, *branches, model.size_divisibility)
    return proto
