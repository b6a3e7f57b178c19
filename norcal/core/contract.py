"""The ONNX contract: graph I/O names, the NorCal node's names, and every metadata key, once.

An exported detector records in its ``metadata_props`` how its input must be prepared and
what its class indices mean (runtime keys: exporters and calibration write them, runners read
them) and, once calibrated, what the NorCal node baked in (node keys: the surgery writes them,
stripping removes exactly them). Values are strings (ONNX metadata is string to string).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from norcal.core.errors import NorcalError
# the resize rules are part of the contract's names
from norcal.core.resize_rules import (RESIZE, RESIZE_RULE_TABLE, RESIZE_RULES, RESIZE_STRETCH,  # noqa: F401
                                      RESIZE_TORCHVISION, ResizeRule, resize_rule)


# The graph I/O of an exported detector: images float32 [B,3,H,W] (BGR 0-255, resized and padded by
# the host), image_sizes int64 [B,2] (each image's resized H, W); fixed-size padded outputs.
INPUT_NAMES = ("images", "image_sizes")
OUTPUT_NAMES = ("num_detections", "boxes", "scores", "classes", "masks")
MASK_PROTOS = "mask_protos"  # and, where MASK_PASTE is "ultralytics", the prototypes
# a graph exported with the NMS left to the host (norcal.detector's "nms": "host") ends at these:
# every anchor's box [B, A, 4] in input pixels, its calibrated class scores [B, A, C] and, for a
# segment model, its mask coefficients [B, A, nm] beside mask_protos (norcal.runtime.host_nms)
# (a RetinaNet's: its levels' top candidates, boxes [B, R, 4], scores [B, R] and classes [B, R])
CANDIDATE_BOXES, CANDIDATE_SCORES, CANDIDATE_COEFS = "candidate_boxes", "candidate_scores", "candidate_coefs"
CANDIDATE_CLASSES = "candidate_classes"

# A checkpoint export names its box classifier's logits [B, R, C+1] (the tensor the classifier's
# Softmax reads) so that surgery finds it by name; CLASSIFIER_LOGITS (below) records the name.
CLS_LOGITS_TENSOR = "cls_logits"
# A cascade has one classifier per stage: its logits are named "cls_logits_stage1", ... and
# CLASSIFIER_LOGITS (like the node keys LOGITS, OUTPUT and NODE) then holds a comma-separated list.
LIST_SEP = ","


def cls_logits_tensors(stages: int = 1) -> list[str]:
    """The names a checkpoint export gives its classifiers' logits: one, or one per cascade stage."""
    return [CLS_LOGITS_TENSOR] if stages <= 1 else [f"{CLS_LOGITS_TENSOR}_stage{k + 1}" for k in range(stages)]


def split_names(value: str | None) -> list[str]:
    """The tensor or node names of a metadata value (one name, or a comma-separated list)."""
    return [v for v in (value or "").split(LIST_SEP) if v]


PREFIX = "norcal."  # every metadata key of ours starts with it

# Runtime keys: how to prepare inputs and what the class indices mean. Exports and calibration
# write them; runners read them; stripping NorCal keeps them.
MIN_SIZE_TEST = "norcal.min_size_test"  # ResizeShortestEdge short edge, e.g. "800"
MAX_SIZE_TEST = "norcal.max_size_test"  # ResizeShortestEdge long-edge cap, e.g. "1333"
INPUT_FORMAT = "norcal.input_format"  # channel order the graph wants: "BGR" or "RGB"
SIZE_DIVISIBILITY = "norcal.size_divisibility"  # pad H and W to a multiple of this, e.g. "32"
NUM_CLASSES = "norcal.num_classes"  # foreground classes C
TABLE = "norcal.table"  # calibration table name (maps class index -> category id)
CATEGORY_IDS = "norcal.category_ids"  # optional JSON list: class index -> dataset category id
DETECTOR = "norcal.detector"  # JSON: the PyTorch detector's settings (depth, mask_on, score_thresh_test, ...)
# optional JSON list: class index -> class name, written when the export knows them (the
# calibration table's names; an Ultralytics model's own). Category ids taken from an annotation
# file for the model's classes are refused unless its category names, in id order, are these.
CLASS_NAMES = "norcal.class_names"
INPUT_SIZE = "norcal.input_size"  # letterbox: side S of the square input, e.g. "640"
# shortest_edge with this key: the graph's input is fixed at the S x S square every resized image is
# padded to (ViTDet's square_pad), so a max_size override above S is refused
PAD_VALUE = "norcal.pad_value"  # letterbox: the padding's pixel value 0-255 (absent: 114)
# "false": boxes mapped to the original image are not clipped to it (Ultralytics' RT-DETR
# predictor leaves them as decoded); absent: clipped, as detectron2's detector_postprocess
CLIP_BOXES = "norcal.clip_boxes"
# "true": a detection whose pasted mask is empty is dropped, as Ultralytics' predictor drops it
# (SegmentationPredictor.construct_result keeps masks.amax() > 0): YOLO segment models exported
# with the best-class (the predictor's) decoding; absent: every detection is kept
DROP_EMPTY_MASKS = "norcal.drop_empty_masks"
RUNTIME_KEYS = frozenset({MIN_SIZE_TEST, MAX_SIZE_TEST, INPUT_FORMAT, SIZE_DIVISIBILITY, NUM_CLASSES,
                          TABLE, CATEGORY_IDS, DETECTOR, RESIZE, INPUT_SIZE, PAD_VALUE, CLASS_NAMES, CLIP_BOXES,
                          DROP_EMPTY_MASKS})
# absent on ResizeShortestEdge models (the first three), on models whose class names are unknown
OPTIONAL_RUNTIME_KEYS = frozenset({RESIZE, INPUT_SIZE, PAD_VALUE, CLASS_NAMES, CLIP_BOXES, DROP_EMPTY_MASKS})

# Graph key: written by a checkpoint export, kept by stripping (it describes the plain graph).
CLASSIFIER_LOGITS = "norcal.classifier_logits"  # the box classifiers' logits tensor(s), e.g. "cls_logits"
# where the classifier's background slot is (last, first, none); absent: last. A RetinaNet export
# writes "none": its cls_logits are every level's anchors concatenated, [B, sum(H*W*A), C], sigmoid.
CLASSIFIER_BACKGROUND = "norcal.classifier_background"
# which ROIs the mask head runs on: "valid" (the detections only; NonZero, data-dependent
# shapes) or "static" (all K slots, padding included; fixed shapes). Mask models only.
MASK_HEAD_ROIS = "norcal.mask_head_rois"
MASK_HEAD_ROIS_VALUES = ("valid", "static")  # the first is the export's default
# "true": the graph masks batch padding in its feature maps (any batch / padded size);
# "false": exported for one image padded to its own size divisibility only
PADDING_MASKS = "norcal.padding_masks"
# What masks holds (absent: "torchvision" for RESIZE torchvision, else "detectron2"): [B, K, M, M]
# box-relative probabilities pasted as that library's paste_masks_in_image; "ultralytics": [B, K, nm]
# coefficients over MASK_PROTOS [B, nm, S/4, S/4], pasted as Ultralytics' process_mask_native.
MASK_PASTE = "norcal.mask_paste"
MASK_PASTES = ("detectron2", "torchvision", "ultralytics")
# what the export says about the graph itself (kept by --strip, like the runtime keys)
GRAPH_KEYS = frozenset({CLASSIFIER_LOGITS, CLASSIFIER_BACKGROUND, MASK_HEAD_ROIS, PADDING_MASKS, MASK_PASTE})


def drop_empty_masks(meta: dict[str, str]) -> bool:
    """Whether the host drops detections whose pasted mask is empty (:data:`DROP_EMPTY_MASKS`)."""
    value = meta.get(DROP_EMPTY_MASKS, "false")
    if value not in ("true", "false"):
        raise NorcalError(f"model metadata {DROP_EMPTY_MASKS}={value!r} is not true or false")
    return value == "true"


def mask_paste(meta: dict[str, str]) -> str:
    """How the host turns a graph's masks output into image masks (:data:`MASK_PASTE`)."""
    value = meta.get(MASK_PASTE) or resize_rule(meta.get(RESIZE)).mask_paste
    if value not in MASK_PASTES:
        raise NorcalError(f"model metadata {MASK_PASTE}={value!r} is not one of {', '.join(MASK_PASTES)}")
    return value


@dataclass(frozen=True)
class Classifier:
    """Where a detector's class logits are in its exported graph, and how they are laid out.

    logits: the tensor names the export gives them (one per cascade stage); class_axis: the
    axis of the C (+ background) classes (-1 for [B, R, C+1], 1 for YOLO's [B, C, anchors]);
    background: "last", "first" or "none"; activation: "softmax" or "sigmoid" (the op NorCal
    replaces)."""

    logits: tuple[str, ...]
    class_axis: int
    background: str
    activation: str


def classifier_metadata(classifier: Classifier) -> dict[str, str]:
    """The graph keys recording ``classifier`` in an export's metadata: its logits' name(s) and,
    unless it is last (the default), its background slot. The exported logits keep the class
    axis last, which is what an absent :data:`CLASS_AXIS` says."""
    if classifier.class_axis != -1:
        raise ValueError(f"an export's classifier logits have their class axis last, got {classifier.class_axis}")
    meta = {CLASSIFIER_LOGITS: LIST_SEP.join(classifier.logits)}
    if classifier.background != "last":
        meta[CLASSIFIER_BACKGROUND] = classifier.background
    return meta


def recorded_logits(meta: dict[str, str]) -> list[str]:
    """The classifier logits tensor(s) an export records ([] for a graph not exported by us)."""
    return split_names(meta.get(CLASSIFIER_LOGITS))


def recorded_background(meta: dict[str, str]) -> str | None:
    """Where an export's classifier has its background slot (None: not our export, the caller
    must say)."""
    if not meta.get(CLASSIFIER_LOGITS):
        return None
    return meta.get(CLASSIFIER_BACKGROUND, "last")


def classifier_tensors(meta: dict[str, str]) -> list[str]:
    """The box classifiers' logits tensor(s) a graph records: the export's, else (a calibrated
    graph not exported by us) its NorCal node's input ([] for neither)."""
    return recorded_logits(meta) or split_names(meta.get(LOGITS))


# Precision keys: what `norcal quantize` did to the graph (absent: an fp32 graph). They describe
# the graph, not the NorCal node, so stripping keeps them.
PRECISION = "norcal.precision"  # int8 (explicit Q/DQ) or fp16 (mixed: NorCal, NMS, decoding in fp32)
QUANTIZATION = "norcal.quantization"  # how: tool, version, method, e.g. "onnxruntime 1.32.0 quantize_static ..."
CALIBRATION_IMAGES = "norcal.calibration_images"  # int8: how many images calibrated the activation ranges
# int8: which Q/DQ layout. "tensorrt": signed, symmetric, Q/DQ on layer inputs only (what TensorRT
# builds); "ort": uint8 activations, int32 biases, Q/DQ on layer outputs too (ONNX Runtime's CPU
# int8 kernels; TensorRT does not build it). Absent on an int8 model: tensorrt (written before the key).
INT8_FORM = "norcal.int8_form"
INT8_FORMS = ("tensorrt", "ort")  # the first is the default
PRECISION_KEYS = frozenset({PRECISION, QUANTIZATION, CALIBRATION_IMAGES, INT8_FORM})

# The NorCal node: ai.norcal::NorCal(logits, norcal.log_prior) backed by a model-local function.
NODE_DOMAIN = "ai.norcal"
NODE_OP_TYPE = "NorCal"
NODE_NAME = "NorCal"
PRIOR_NAME = "norcal.log_prior"  # initializer [K]: log a_c per class, -log b at the background slot
INLINE_PREFIX = "norcal/"  # node and tensor names of the inlined body (--inline)

# Node keys: what the NorCal node baked in. The surgery writes them; stripping removes exactly these.
GAMMA = "norcal.gamma"
FACTOR = "norcal.factor"  # cdt or ens
MECHANISM = "norcal.mechanism"  # exp, prob or logit
RENORMALIZE = "norcal.renormalize"  # "true" or "false"
ACTIVATION = "norcal.activation"  # softmax or sigmoid: the activation the node replaced
BACKGROUND = "norcal.background"  # last, first or none
BACKGROUND_SCALE = "norcal.background_scale"
COUNT_TYPE = "norcal.count_type"  # image or instance counts
TABLE_SHA256 = "norcal.table_sha256"  # the calibration table the prior came from
LOGITS = "norcal.logits"  # tensor the node reads (comma-separated, one per node, for a cascade)
OUTPUT = "norcal.output"  # tensor the node writes (the replaced activation's output); likewise
NODE = "norcal.node"  # name of the replaced activation node (strip restores it); likewise
INLINE = "norcal.inline"  # "true": the body's ops are written into the graph
BACKGROUND_INDEX = "norcal.background_index"  # index of the background slot, -1 for none
TOOL_VERSION = "norcal.tool_version"
MIN_COUNT = "norcal.min_count"  # K of --min-count (absent when unused)
MIN_COUNT_CLAMPED = "norcal.min_count_clamped"  # how many classes had a count below K
# the logits' class axis the prior is broadcast along, as a non-negative index into the logits'
# shape (e.g. "1" for YOLO's [B, C, A]); absent: the last axis
CLASS_AXIS = "norcal.class_axis"
NODE_KEYS = frozenset({GAMMA, FACTOR, MECHANISM, RENORMALIZE, ACTIVATION, BACKGROUND, BACKGROUND_SCALE,
                       COUNT_TYPE, TABLE_SHA256, LOGITS, OUTPUT, NODE, INLINE, BACKGROUND_INDEX,
                       TOOL_VERSION, MIN_COUNT, MIN_COUNT_CLAMPED, CLASS_AXIS})
# written only when used: --min-count, and a class axis other than the last
OPTIONAL_NODE_KEYS = frozenset({MIN_COUNT, MIN_COUNT_CLAMPED, CLASS_AXIS})

# detectron2's defaults (config/defaults.py) when a model carries no metadata.
DEFAULTS = {MIN_SIZE_TEST: "800", MAX_SIZE_TEST: "1333", INPUT_FORMAT: "BGR", SIZE_DIVISIBILITY: "32"}


LETTERBOX_PAD_VALUE = 114  # Ultralytics' LetterBox default


@dataclass
class Preprocessing:
    """How host code prepares images for one model (see :data:`RESIZE` for the rules).

    The host feeds float32 0-255 pixels in ``input_format`` order; the graph normalises.
    Letterbox: ``min_size`` = ``max_size`` = ``input_size`` (the same scale as ResizeShortestEdge
    with both at S, which the size checks use) and ``divisibility`` = ``input_size``."""

    min_size: int
    max_size: int
    input_format: str = "BGR"
    divisibility: int = 32
    resize: str = "shortest_edge"
    input_size: int = 0  # letterbox / stretch: the square; shortest_edge: the fixed padded square, or 0
    pad_value: int = 0  # the padding's pixel value (shortest_edge: 0)
    clip_boxes: bool = True  # the host clips boxes to the original image (CLIP_BOXES)

    @property
    def rule(self) -> ResizeRule:
        return resize_rule(self.resize)

    @property
    def square(self) -> bool:
        """Every image becomes the one input_size square (letterbox, stretch)."""
        return self.rule.square

    @property
    def mask_paste(self) -> str:
        """How masks are pasted when the model's metadata does not say (:data:`MASK_PASTE`)."""
        return self.rule.mask_paste

    def metadata(self) -> dict[str, str]:
        """The runtime keys that record this preprocessing in a graph's metadata."""
        meta = {INPUT_FORMAT: self.input_format} | ({} if self.clip_boxes else {CLIP_BOXES: "false"})
        if self.square:
            meta.update({RESIZE: self.resize, INPUT_SIZE: str(self.input_size),
                         MIN_SIZE_TEST: str(self.input_size), MAX_SIZE_TEST: str(self.input_size),
                         SIZE_DIVISIBILITY: str(self.input_size)})
            if self.rule.pads:
                meta[PAD_VALUE] = str(self.pad_value)
        else:
            meta.update({MIN_SIZE_TEST: str(self.min_size), MAX_SIZE_TEST: str(self.max_size),
                         SIZE_DIVISIBILITY: str(self.divisibility)})
            if self.input_size:
                meta[INPUT_SIZE] = str(self.input_size)
            if self.resize != RESIZE_RULES[0]:
                meta[RESIZE] = self.resize
        return meta


def square_preprocessing(rule: str, input_size: int, input_format: str = "RGB", pad_value: int = 0,
                         clip_boxes: bool = True) -> Preprocessing:
    """A square rule's preprocessing: every image to the ``input_size`` square (``min_size`` =
    ``max_size`` = ``divisibility`` = ``input_size``)."""
    return Preprocessing(min_size=input_size, max_size=input_size, input_format=input_format,
                         divisibility=input_size, resize=rule, input_size=input_size, pad_value=pad_value,
                         clip_boxes=clip_boxes)


def letterbox_preprocessing(input_size: int, input_format: str = "RGB",
                            pad_value: int = LETTERBOX_PAD_VALUE) -> Preprocessing:
    """Ultralytics' LetterBox to an ``input_size`` square (centred, ``pad_value`` padding)."""
    return square_preprocessing("letterbox", input_size, input_format, pad_value)


def stretch_preprocessing(input_size: int, input_format: str = "RGB", clip_boxes: bool = True) -> Preprocessing:
    """Every image resized to the ``input_size`` square, aspect not kept (Ultralytics' RT-DETR)."""
    return square_preprocessing(RESIZE_STRETCH, input_size, input_format, clip_boxes=clip_boxes)


def check_detector(where: str, inputs: Sequence[str], outputs: Sequence[str],
                   meta: dict[str, str]) -> None:
    """Refuse a model that is not a detector graph of this contract (a classifier, another
    tool's detector), saying what it lacks, before any image is run."""
    missing_in = [n for n in INPUT_NAMES if n not in inputs]
    missing_out = [n for n in OUTPUT_NAMES[:4] if n not in outputs]
    if not missing_in and not missing_out:
        return
    lacks = []
    if missing_in:
        lacks.append(f"inputs {', '.join(missing_in)} (it takes {', '.join(inputs) or 'none'})")
    if missing_out:
        lacks.append(f"outputs {', '.join(missing_out)}")
    no_meta = [k for k in (MIN_SIZE_TEST, MAX_SIZE_TEST, NUM_CLASSES) if k not in meta]
    if no_meta:
        lacks.append(f"metadata {', '.join(no_meta)}")
    raise NorcalError(f"{where}: not a norcal detector graph: it has no {'; no '.join(lacks)} "
                      "(export a detectron2 checkpoint with norcal export)")


def _int(meta: dict[str, str], key: str) -> int:
    raw = meta.get(key, DEFAULTS.get(key))
    try:
        value = int(float(raw))
    except (TypeError, ValueError):
        raise NorcalError(f"model metadata {key}={raw!r} is not an integer") from None
    if value <= 0:
        raise NorcalError(f"model metadata {key}={raw!r} must be positive")
    return value


def input_spec(meta: dict[str, str], min_size: int | None = None, max_size: int | None = None,
               input_format: str | None = None) -> Preprocessing:
    """The model's preprocessing settings from its metadata, with explicit overrides winning
    (a letterbox model takes no size override: its graph is built for one square)."""
    fmt = (input_format or meta.get(INPUT_FORMAT) or DEFAULTS[INPUT_FORMAT]).upper()
    if fmt not in ("BGR", "RGB"):
        raise NorcalError(f"input format must be BGR or RGB, got {fmt!r}")
    spec = _input_spec(meta, min_size, max_size, fmt)
    clip = meta.get(CLIP_BOXES, "true")
    if clip not in ("true", "false"):
        raise NorcalError(f"model metadata {CLIP_BOXES}={clip!r} is not true or false")
    spec.clip_boxes = clip == "true"
    return spec


def _input_spec(meta: dict[str, str], min_size: int | None, max_size: int | None, fmt: str) -> Preprocessing:
    rule = resize_rule(meta.get(RESIZE))
    if rule.square:
        if min_size is not None or max_size is not None:
            raise NorcalError(f"min_size and max_size cannot change a {rule.name} model's input "
                              f"({RESIZE}={rule.name}, {INPUT_SIZE}={meta.get(INPUT_SIZE)!r})",
                              param=("min_size", "max_size"))
        if INPUT_SIZE not in meta:
            raise NorcalError(f"model metadata {RESIZE}={rule.name} needs {INPUT_SIZE}")
        return square_preprocessing(rule.name, _int(meta, INPUT_SIZE), fmt, _pad_value(meta) if rule.pads else 0)
    spec = Preprocessing(
        min_size=int(min_size) if min_size is not None else _int(meta, MIN_SIZE_TEST),
        max_size=int(max_size) if max_size is not None else _int(meta, MAX_SIZE_TEST),
        input_format=fmt,
        divisibility=_int(meta, SIZE_DIVISIBILITY),
        resize=rule.name,
        input_size=_int(meta, INPUT_SIZE) if INPUT_SIZE in meta else 0,
    )
    if spec.min_size <= 0 or spec.max_size <= 0:
        raise NorcalError(f"min_size and max_size must be positive, got {spec.min_size}, {spec.max_size}",
                          param=("min_size", "max_size"))
    if spec.input_size and spec.max_size > spec.input_size:
        # ResizeShortestEdge's long edge reaches max_size: the image would not fit the fixed square
        raise NorcalError(f"max_size {spec.max_size} exceeds the model's fixed {spec.input_size}x{spec.input_size} "
                          f"input ({INPUT_SIZE}={spec.input_size}): a resized image must fit that square",
                          param=("min_size", "max_size"))
    return spec


def _pad_value(meta: dict[str, str]) -> int:
    pad = meta.get(PAD_VALUE, str(LETTERBOX_PAD_VALUE))
    try:
        pad_value = int(pad)
    except ValueError:
        pad_value = -1
    if not 0 <= pad_value <= 255:
        raise NorcalError(f"model metadata {PAD_VALUE}={pad!r} is not an integer 0-255")
    return pad_value


def metadata_category_ids(meta: dict[str, str]) -> list[int] | None:
    """The class index -> category id list a model carries, or None."""
    raw = meta.get(CATEGORY_IDS)
    if not raw:
        return None
    try:
        ids = [int(v) for v in json.loads(raw)]
    except (ValueError, TypeError):
        raise NorcalError(f"model metadata {CATEGORY_IDS} is not a JSON list of integers") from None
    return ids


def class_names_metadata(names: Sequence[str] | None) -> dict[str, str]:
    """The :data:`CLASS_NAMES` key recording ``names`` (class index order); none when they are
    unknown or Ultralytics' placeholders "0", "1", ... (they name no category)."""
    if not names or list(names) == [str(i) for i in range(len(names))]:
        return {}
    return {CLASS_NAMES: json.dumps([str(n) for n in names])}


def metadata_class_names(meta: dict[str, str]) -> list[str] | None:
    """The class index -> class name list a model records, or None (names unknown)."""
    raw = meta.get(CLASS_NAMES)
    if raw is None:
        return None
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise NorcalError(f"model metadata {CLASS_NAMES} is not a JSON list of class names")
    n = meta.get(NUM_CLASSES)
    if n is not None and n.isdigit() and int(n) != len(names):
        raise NorcalError(f"model metadata {CLASS_NAMES} lists {len(names)} names but {NUM_CLASSES} is {n}")
    return names


def class_name_key(name: object) -> str:
    """A class name as compared with another: case, underscores and runs of spaces ignored
    ("Traffic_light" is "traffic light")."""
    return " ".join(str(name).replace("_", " ").lower().split())


def check_class_names(model_names: Sequence[str] | None, names: Sequence[str | None],
                      ids: Sequence[int], where: str, param: str | None = None,
                      harm: str = "its detections would be written under another category") -> None:
    """Refuse category ids taken for the model's classes in order (``ids``, with their ``names``,
    from ``where``) unless their names are the model's recorded class names (None: unknown, not
    judged): another set or order puts every detection under another category (``harm`` says
    what goes wrong for the caller)."""
    if model_names is None or len(model_names) != len(names):
        return  # unknown, or a class count the caller refuses
    ours = [class_name_key(n) for n in model_names]
    theirs = [None if n is None else class_name_key(n) for n in names]
    if ours == theirs:
        return
    i = next(k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    shown = "no name" if names[i] is None else repr(names[i])
    how = "the model's classes in another order" if sorted(ours) == sorted(t or "" for t in theirs) \
        else "not the model's classes"
    raise NorcalError(f"{where}: its categories are {how}: class {i} of the model is {model_names[i]!r} "
                      f"but category {ids[i]} (the {_ordinal(i + 1)} by id) has {shown}; {harm}", param=param)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
