"""Our R-CNN (a ModelSpec and its PyTorch model) -> its ONNX graph with the runtime metadata."""

from __future__ import annotations

import json

import onnx

from norcal.export.pytorch.onnx_trace import MIN_OPSET
from norcal.export.rcnn.spec import ModelSpec
from norcal.core import contract


def max_detections(spec: ModelSpec) -> int:
    """The most detections the graph can return per image: the (box, class) pairs its last TopK
    chooses from (R-CNN: the RPN's proposals x classes; RetinaNet: 5 levels' candidates x classes)."""
    from norcal.export.rcnn.spec import RETINANET

    if spec.meta_architecture == RETINANET:
        return 5 * spec.retinanet_topk_candidates * spec.num_classes
    return spec.rpn_post_nms_topk_test * spec.num_classes


def runtime_metadata(spec: ModelSpec) -> dict[str, str]:
    """What runners need to prepare inputs (the keys of norcal.core.contract)."""
    resize = spec.convention.resize
    meta = {contract.RESIZE: resize} if resize else {}
    if spec.vit is not None:  # the graph's input is fixed at the square every image is padded to
        meta[contract.INPUT_SIZE] = str(spec.vit.square_pad)
    return meta | {
        contract.MIN_SIZE_TEST: str(spec.min_size_test),
        contract.MAX_SIZE_TEST: str(spec.max_size_test),
        contract.INPUT_FORMAT: "BGR",  # the graph takes BGR whatever the training format
        contract.SIZE_DIVISIBILITY: str(spec.size_divisibility),
        contract.NUM_CLASSES: str(spec.num_classes),
        contract.DETECTOR: json.dumps({"depth": spec.depth, "mask_on": spec.mask_on,
                                       "score_thresh_test": spec.score_thresh_test,
                                       "nms_thresh_test": spec.nms_thresh_test,
                                       "detections_per_image": spec.detections_per_image}),
    }


def export_detector(model, spec: ModelSpec, *, batch: int | None = None, height: int | None = None,
                    width: int | None = None, opset: int = MIN_OPSET, mask_head_rois: str = "valid",
                    padding_masks: bool | None = None, padding_switch: bool = False,
                    check: bool = True, host_nms: bool = False) -> onnx.ModelProto:
    """The batched ONNX graph (plain softmax classifier) with runtime metadata set; the
    options are :func:`norcal.export.rcnn.onnx_export.export_onnx`'s (``host_nms``: a RetinaNet
    ends at its candidates, recorded as ``"nms": "host"``)."""
    from norcal.core.decoding import Decoding
    from norcal.export.rcnn.onnx_export import export_onnx

    graph = export_onnx(model, spec, batch=batch, height=height, width=width, opset=opset,
                        mask_head_rois=mask_head_rois, padding_masks=padding_masks,
                        padding_switch=padding_switch, check=check, host_nms=host_nms)
    props = {p.key: p.value for p in graph.metadata_props}
    props.update(runtime_metadata(spec))
    if host_nms:
        settings = json.loads(props[contract.DETECTOR]) | Decoding(nms="host").record()
        props[contract.DETECTOR] = json.dumps(settings)
    onnx.helper.set_model_props(graph, props)
    return graph
