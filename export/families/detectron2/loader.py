"""One entry point: a detectron2 checkpoint (and optionally its config) -> (ModelSpec, state dict)."""

from __future__ import annotations

import re

from norcal.core.calibration.classifier_option import SIGMOID, SOFTMAX, ClassifierActivation, check_classifier
from norcal.core.errors import NorcalError

from norcal.export.families.checkpoints import clean_state_dict, read_checkpoint
from norcal.export.families.detectron2.yacs_config.spec import load_config
from norcal.export.families.detectron2.weights.architecture import (ACTIVATION_UNREADABLE, FED_LOSS_IMPLIES_SIGMOID, architecture, cascade_stages,
                                layout_label, spec_from_weights, weights_layout)
from norcal.export.rcnn.spec import RETINANET, ModelSpec

# what each architecture field is called in a detectron2 config, for error messages
_CONFIG_KEYS = {
    "backbone_name": "MODEL.BACKBONE.NAME", "roi_heads_name": "MODEL.ROI_HEADS.NAME",
    "backbone_out_feature": "MODEL.RESNETS.OUT_FEATURES", "regnet": "model.backbone.bottom_up (RegNet)",
    "depth": "MODEL.RESNETS.DEPTH", "norm": "MODEL.RESNETS.NORM",
    "stem_out_channels": "MODEL.RESNETS.STEM_OUT_CHANNELS", "res2_out_channels": "MODEL.RESNETS.RES2_OUT_CHANNELS",
    "num_groups": "MODEL.RESNETS.NUM_GROUPS", "width_per_group": "MODEL.RESNETS.WIDTH_PER_GROUP",
    "fpn_out_channels": "MODEL.FPN.OUT_CHANNELS", "fpn_norm": "MODEL.FPN.NORM",
    "num_classes": "MODEL.ROI_HEADS.NUM_CLASSES", "cls_agnostic_bbox_reg": "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG",
    "box_head_num_conv": "MODEL.ROI_BOX_HEAD.NUM_CONV", "box_head_num_fc": "MODEL.ROI_BOX_HEAD.NUM_FC",
    "box_head_conv_dim": "MODEL.ROI_BOX_HEAD.CONV_DIM", "box_head_fc_dim": "MODEL.ROI_BOX_HEAD.FC_DIM",
    "box_head_norm": "MODEL.ROI_BOX_HEAD.NORM", "pooler_resolution": "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION",
    "mask_on": "MODEL.MASK_ON", "mask_head_num_conv": "MODEL.ROI_MASK_HEAD.NUM_CONV",
    "mask_head_conv_dim": "MODEL.ROI_MASK_HEAD.CONV_DIM", "mask_head_norm": "MODEL.ROI_MASK_HEAD.NORM",
    "cls_agnostic_mask": "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK",
    "anchors_per_location": "MODEL.ANCHOR_GENERATOR.SIZES x ASPECT_RATIOS",
    "rpn_conv_widths": "MODEL.RPN.CONV_DIMS", "vit.square_pad": "model.backbone.square_pad",
    "mvit.square_pad": "model.backbone.square_pad", "mvit": "model.backbone.bottom_up (MViT)",
}
# the same for a LazyConfig (config.yaml saved by LazyConfig.save): its own keys, not the yacs ones
_BOTTOM_UP, _BOX_HEAD, _MASK_HEAD = "model.backbone.bottom_up", "model.roi_heads.box_head", "model.roi_heads.mask_head"
_LAZY_CONFIG_KEYS = {
    "backbone_name": "model.backbone", "roi_heads_name": "model.roi_heads", "regnet": f"{_BOTTOM_UP} (RegNet)",
    "backbone_out_feature": "model.backbone.in_features", "depth": f"{_BOTTOM_UP}.stages.depth",
    "norm": f"{_BOTTOM_UP}.stages.norm", "stem_out_channels": f"{_BOTTOM_UP}.stem.out_channels",
    "num_groups": f"{_BOTTOM_UP}.stages.num_groups", "fpn_out_channels": "model.backbone.out_channels",
    "fpn_norm": "model.backbone.norm", "num_classes": "model.roi_heads.num_classes",
    "cls_agnostic_bbox_reg": "model.roi_heads.box_predictor.cls_agnostic_bbox_reg",
    "box_head_num_conv": f"{_BOX_HEAD}.conv_dims", "box_head_num_fc": f"{_BOX_HEAD}.fc_dims",
    "box_head_conv_dim": f"{_BOX_HEAD}.conv_dims", "box_head_fc_dim": f"{_BOX_HEAD}.fc_dims",
    "box_head_norm": f"{_BOX_HEAD}.conv_norm", "pooler_resolution": "model.roi_heads.box_pooler.output_size",
    "mask_on": "model.roi_heads.mask_head", "mask_head_num_conv": f"{_MASK_HEAD}.conv_dims",
    "mask_head_conv_dim": f"{_MASK_HEAD}.conv_dims", "mask_head_norm": f"{_MASK_HEAD}.conv_norm",
    "cls_agnostic_mask": f"{_MASK_HEAD}.num_classes",
    "anchors_per_location": "model.proposal_generator.anchor_generator.sizes x aspect_ratios",
    "rpn_conv_widths": "model.proposal_generator.head.conv_dims", "vit": "model.backbone.net",
    "vit.square_pad": "model.backbone.square_pad", "mvit.square_pad": "model.backbone.square_pad",
    "mvit": _BOTTOM_UP,
}


def _config_key(field: str, lazy: bool) -> str:
    """A ModelSpec field's name in the user's config: ``vit.depth`` -> model.backbone.net.depth."""
    keys = _LAZY_CONFIG_KEYS if lazy else _CONFIG_KEYS
    if field in keys:
        return keys[field]
    head, _, rest = field.partition(".")
    if lazy and head in ("vit", "mvit") and rest:
        return f"{keys[head]}.{rest}"
    return keys.get(head, field)


def _check_consistent(config_spec: ModelSpec, weights_spec: ModelSpec, config, weights) -> None:
    want, have = architecture(config_spec), architecture(weights_spec)
    lazy = str(config_spec.provenance.get("source", "")).startswith("LazyConfig")
    if want.get("regnet") is not None and have.get("regnet") is not None:  # name the RegNet's first differing field
        for arch in (want, have):
            arch.update({f"regnet.{k}": v for k, v in vars(arch.pop("regnet")).items()})
    if want["num_classes"] != have["num_classes"]:
        n = have["num_classes"]
        if config_spec.meta_architecture == RETINANET:  # a sigmoid head: no background row
            raise NorcalError(f"{config} sets MODEL.RETINANET.NUM_CLASSES = {want['num_classes']} but {weights} "
                              f"has head.cls_score for {n} classes")
        raise NorcalError(f"{config} sets {_config_key('num_classes', lazy)} = {want['num_classes']} but {weights} has "
                          f"roi_heads.box_predictor.cls_score with {n + 1} rows ({n} classes + background)")
    for field in [*want, *(k for k in have if k not in want)]:  # stable order: the first cause first
        if want.get(field) != have.get(field):
            raise NorcalError(f"{config} and {weights} disagree on {field} ({_config_key(field, lazy)}): "
                              f"config {want.get(field)!r}, weights {have.get(field)!r}")


# FastRCNNOutputLayers with MODEL.ROI_HEADS.USE_FED_LOSS registers the classes' sampling weights
# for the federated loss as a buffer (one per cascade stage); inference never reads it
_FED_LOSS = re.compile(r"roi_heads\.box_predictor(\.\d+)?\.fed_loss_cls_weights")


def _check_fed_loss_weights(found: dict, spec: ModelSpec, weights) -> None:
    """The federated-loss buffers must be the ones this model's predictors would hold."""
    from norcal.export.rcnn.spec import RETINANET

    stages = len(spec.cascade_bbox_reg_weights)
    names = [f"roi_heads.box_predictor.{k}.fed_loss_cls_weights" for k in range(stages)] if stages \
        else ["roi_heads.box_predictor.fed_loss_cls_weights"]
    for name, value in found.items():
        if name not in names or spec.meta_architecture == RETINANET:
            raise NorcalError(f"{weights}: {name} does not belong to this model's box predictor "
                              f"(a federated-loss buffer is {' or '.join(names)})")
        shape = tuple(getattr(value, "shape", ()))
        if shape != (spec.num_classes,):
            raise NorcalError(f"{weights}: {name} has shape {shape}, but federated-loss weights hold "
                              f"one value per class ({spec.num_classes},)")


def _activation(sigmoid: bool) -> str:
    return SIGMOID if sigmoid else SOFTMAX


def _check_config_activation(spec: ModelSpec, classifier, config) -> None:
    """The config settles the activation; a ``classifier`` saying otherwise is refused."""
    if spec.meta_architecture == RETINANET:
        if classifier not in (None, SIGMOID):
            raise NorcalError(f"classifier {classifier} given, but {config} describes a RetinaNet, whose "
                              "head is sigmoid", param="classifier")
        return
    said = _activation(spec.use_sigmoid_ce)
    if classifier not in (None, said):
        raise NorcalError(f"{config} sets MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE {spec.use_sigmoid_ce} (a {said} "
                          f"box head) but classifier {classifier} was given", param="classifier")
    given = f"; classifier {classifier} agrees" if classifier else ""
    spec.provenance["use_sigmoid_ce"] = (f"{said} classifier: {config} sets MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE "
                                         f"{spec.use_sigmoid_ce}{given}")


def _check_weights_activation(spec: ModelSpec, classifier, fed_loss: str | None, weights) -> None:
    """Without a config: a RetinaNet's head and a federated-loss buffer say sigmoid (a
    ``classifier`` saying otherwise is refused); any other R-CNN's weights say nothing, and
    without ``classifier`` the checkpoint is refused."""
    if spec.meta_architecture == RETINANET:
        if classifier not in (None, SIGMOID):
            raise NorcalError(f"classifier {classifier} given, but {weights} holds a RetinaNet (head.cls_score), "
                              "whose head is sigmoid", param="classifier")
    elif fed_loss is not None:
        if classifier not in (None, SIGMOID):
            raise NorcalError(f"classifier {classifier} given, but {weights} holds {fed_loss}, "
                              f"{FED_LOSS_IMPLIES_SIGMOID}: a sigmoid head's weights", param="classifier")
    elif classifier is None:
        raise NorcalError(f"{weights}: a detectron2 R-CNN's weights do not tell a softmax box head from a sigmoid "
                          f"one, as {ACTIVATION_UNREADABLE}; give its config, or classifier softmax or sigmoid",
                          param=("config", "classifier"))


def load_detector_spec(weights, config=None, classifier: ClassifierActivation | None = None) -> tuple[ModelSpec, dict]:
    """Read a detectron2 checkpoint and return ``(spec, state_dict)``.

    ``weights``: ``.pth``/``.pt`` or model-zoo ``.pkl``. ``config``: the model's detectron2
    YAML; when given it defines the spec and must agree with the weights' shapes
    (a mismatch is a :class:`NorcalError` naming both values); otherwise the spec is
    inferred from the weights (see :func:`~norcal.export.families.detectron2.weights.architecture.spec_from_weights`).
    ``classifier``: the R-CNN box head's activation, "softmax" or "sigmoid"
    (:mod:`norcal.core.calibration.classifier_option`), which a config-less R-CNN without a federated-loss
    buffer needs (refused without it); one the config, the buffer or a RetinaNet contradicts
    is refused. ``state_dict``: ``{name: torch.Tensor}`` without entries inference ignores.
    """
    check_classifier(classifier)
    raw = read_checkpoint(weights)
    fed_loss = {k: raw.pop(k) for k in [k for k in raw if _FED_LOSS.fullmatch(k)]}
    spec = load_config(config) if config is not None else None
    if spec is not None:
        want, have = layout_label(spec), weights_layout(raw)
        # said first: the anchor and shape checks below would only show its symptoms; weights
        # cannot tell a dilated res5 (DC5) from an undilated one (C5)
        if want != have and (want, have) != ("C5", "DC5"):
            raise NorcalError(f"{config} describes a {want} model but {weights} holds a {have} model's weights")
    if spec is not None and spec.cascade_bbox_reg_weights and \
            cascade_stages(raw) not in (0, len(spec.cascade_bbox_reg_weights)):
        # detectron2 would drop the stages the config does not list (or leave them untrained)
        raise NorcalError(f"{config} gives {len(spec.cascade_bbox_reg_weights)} cascade stages "
                          f"(MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS) but {weights} holds "
                          f"{cascade_stages(raw)} (roi_heads.box_predictor.0-{cascade_stages(raw) - 1})")
    # inferred from the raw dict: num_batches_tracked still tells BN from FrozenBN
    inferred = spec_from_weights(raw, (spec.anchor_sizes, spec.anchor_aspect_ratios) if spec else None,
                                 spec.cascade_bbox_reg_weights if spec else None, next(iter(fed_loss), None),
                                 spec.vit if spec else None, spec.mvit if spec else None,
                                 None if spec else classifier, config_norms=spec is not None)
    state = clean_state_dict(raw)
    _check_fed_loss_weights(fed_loss, spec or inferred, weights)
    if spec is not None:
        _check_config_activation(spec, classifier, config)
    if spec is not None and fed_loss and not spec.use_sigmoid_ce:
        raise NorcalError(f"{config} sets MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE False (a softmax classifier) but "
                          f"{weights} holds {next(iter(fed_loss))}, {FED_LOSS_IMPLIES_SIGMOID}: a sigmoid "
                          "classifier's weights")
    if spec is None:
        _check_weights_activation(inferred, classifier, next(iter(fed_loss), None), weights)
        inferred.provenance["weights"] = str(weights)
        return inferred, state
    _check_consistent(spec, inferred, config, weights)
    spec.provenance["weights"] = str(weights)
    stats = {k: tuple(float(v) for v in state[k].reshape(-1).tolist()) for k in ("pixel_mean", "pixel_std")
             if k in state}
    for key, values in stats.items():
        if values != getattr(spec, key):
            # detectron2 builds these buffers from the config (they are not loaded), so the config wins
            spec.provenance[key] = f"config {getattr(spec, key)}; the checkpoint's {values} ignored"
    return spec, state


def load_model(weights, config=None, *, detections_per_image: int | None = None,
               classifier: ClassifierActivation | None = None):
    """(spec, model in eval mode) from a detectron2 checkpoint and optional config;
    ``detections_per_image`` replaces the config's K (TEST.DETECTIONS_PER_IMAGE); ``classifier``:
    :func:`load_detector_spec`'s."""
    import dataclasses

    from norcal.export.rcnn.export import max_detections
    from norcal.export.rcnn.modeling.build import model_from_state

    spec, state = load_detector_spec(weights, config, classifier)
    if detections_per_image is not None:
        k, most = int(detections_per_image), max_detections(spec)
        if k > most:  # the graph's last TopK would take more than it has
            raise NorcalError(f"detections_per_image {k} is more than {weights} can return ({most}: "
                              f"its proposals or candidates x classes)", param="detections_per_image")
        spec = dataclasses.replace(spec, detections_per_image=k)
    model = model_from_state(spec, state).eval()
    return spec, model
