"""An Ultralytics YOLOv8 / YOLO11 / YOLO26 detect or segment model as a :class:`Detector`: the graph
is ours around the Ultralytics network (:mod:`norcal.export.families.ultralytics.yolo_graph`):
letterbox input, ``cls_logits`` [B, A, C] before one Sigmoid (NorCal's sigmoid variant,
background none), class-wise NMS to our fixed-K outputs (an end-to-end head's one-to-one top-k
instead, as Ultralytics predicts it), box-relative masks for segment models."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from norcal.core import contract
from norcal.core.decoding import Decoding
from norcal.core.errors import NorcalError
from norcal.core.ranges import MAX_EXPORT_SIDE, check_range
from norcal.export.families.base import Classifier, Detector, TuneCache, sigmoid_classifier, square_size
from norcal.export.families.ultralytics.checkpoint import ordered_names
from norcal.export.pytorch.onnx_trace import trace_onnx

# Ultralytics' validation settings (DetectionValidator: conf 0.001, iou 0.7, max_det 300):
# the AP-measuring defaults, as detectron2's LVIS configs keep every detection above 1e-4
SCORE_THRESH, NMS_THRESH, DETECTIONS = 0.001, 0.7, 300
DEFAULT_IMGSZ = 640


def head_stride(head, path) -> int:
    """The head's largest stride (the input side must be a multiple of it); each saved stride
    must be a whole number of pixels in 1..MAX_EXPORT_SIDE."""
    strides = [float(s) for s in getattr(head, "stride", ())]
    if not strides:
        raise NorcalError(f"{path}: the head saves no stride")
    for s in strides:
        check_range(f"{path}: saved stride", s if not s.is_integer() else int(s), 1, MAX_EXPORT_SIDE,
                    integer=True, why="the largest export side")
    return int(max(strides))


def model_names(model, path) -> list[str]:
    """The class names of a loaded Ultralytics model, in index order (placeholders "0", "1", ...
    when it names none); refused when they do not match its head's class count."""
    nc = check_range(f"{path}: the head's nc", model.model[-1].nc, 1, integer=True)
    saved = model.yaml.get("nc") if isinstance(getattr(model, "yaml", None), dict) else None
    if saved is not None and saved != nc:
        raise NorcalError(f"{path}: the model's yaml says nc {saved!r} but its head predicts {nc} classes")
    names = ordered_names(getattr(model, "names", None), path)
    if names is None:
        names = [str(i) for i in range(nc)]
    if len(names) != nc:
        raise NorcalError(f"{path}: the model names {len(names)} classes but its head predicts {nc}")
    return names


@dataclass
class YoloTuneCache(TuneCache):
    """Per image: the anchors that pass the score threshold at some prior of the sweep, with
    their boxes (letterboxed-input pixels), class logits and mask coefficients, and the
    prototypes; ``input_hw`` the letterboxed input's (h, w); image_sizes / original_sizes int64
    [N, 2] as :class:`TuneCache` says."""

    keep_empty_boxes = True  # Ultralytics keeps boxes clipped to no area
    mask_paste = "ultralytics"  # coefficients over the prototypes (contract.MASK_PASTE)

    image_ids: list
    boxes: list  # [a_i, 4] float32 per image
    logits: list  # [a_i, C] float32
    coefs: list  # [a_i, nm] float32, or None (no masks cached)
    protos: list  # [nm, h, w] float32, or None
    image_sizes: np.ndarray
    original_sizes: np.ndarray
    input_hw: tuple
    drop_empty_masks: bool = False  # the best-class decoding of a segment model: as the predictor

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for part in (self.boxes, self.logits, self.coefs, self.protos)
                       for a in part if a is not None))

    @classmethod
    def concat(cls, parts: Sequence["YoloTuneCache"]) -> "YoloTuneCache":
        if len({tuple(c.input_hw) for c in parts}) != 1:
            raise NorcalError("caches of different input sizes do not join")
        return cls(*([x for c in parts for x in getattr(c, k)]
                     for k in ("image_ids", "boxes", "logits", "coefs", "protos")),
                   np.concatenate([c.image_sizes for c in parts]),
                   np.concatenate([c.original_sizes for c in parts]), parts[0].input_hw,
                   parts[0].drop_empty_masks)


class YoloDetector(Detector):
    """A loaded YOLOv8 / YOLO11 / YOLO26 detect or segment model; a head with ``end2end`` True
    (YOLO26's one-to-one branch selected) is exported as Ultralytics predicts it: that branch,
    its top-k, no NMS (``nms_thresh`` then refused)."""

    family = "ultralytics"

    def __init__(self, model, path, *, imgsz: int = DEFAULT_IMGSZ, detections_per_image: int | None = None,
                 score_thresh: float | None = None, nms_thresh: float | None = None,
                 decoding: Decoding | None = None):
        from norcal.export.families.ultralytics.yolo_graph import YoloGraph, is_end2end

        if nms_thresh is not None and is_end2end(model.model[-1]):
            raise NorcalError(f"{path}: an end-to-end YOLO head (one-to-one, no NMS): nms_thresh does not apply",
                              param="nms_thresh")
        decoding = decoding or Decoding()
        if decoding.best_class and is_end2end(model.model[-1]):
            raise NorcalError(f"{path}: an end-to-end YOLO head decodes as Ultralytics' one-to-one top-k; "
                              "the best-class decoding does not apply", param="decoding")
        if decoding.host_nms and is_end2end(model.model[-1]):
            raise NorcalError(f"{path}: an end-to-end YOLO head (one-to-one top-k) has no NMS to leave to the "
                              "host: nms='host' does not apply", param="nms")
        score_thresh = decoding.score_thresh(score_thresh)
        self.decoding = decoding
        self.path = Path(path)
        self.names = model_names(model, path)
        self.num_classes = len(self.names)
        self.topk = int(detections_per_image or DETECTIONS)
        self.imgsz = int(imgsz)
        self.stride = head_stride(model.model[-1], path)
        self.task = "segment" if type(model).__name__ == "SegmentationModel" else "detect"
        self.model = YoloGraph(model, num_classes=self.num_classes,
                               score_thresh=SCORE_THRESH if score_thresh is None else float(score_thresh),
                               nms_thresh=NMS_THRESH if nms_thresh is None else float(nms_thresh),
                               detections_per_image=self.topk, decoding=decoding).eval()

    @property
    def classifier(self) -> Classifier:
        return sigmoid_classifier()

    @property
    def preprocessing(self) -> contract.Preprocessing:
        return contract.letterbox_preprocessing(self.imgsz)

    @property
    def has_masks(self) -> bool:
        return self.model.has_masks

    def settings(self) -> dict[str, Any]:
        """What ``norcal.detector`` records (parity reads score_thresh_test)."""
        m = self.model
        out = {"family": self.family, "task": self.task, "input_size": self.imgsz,
               "score_thresh_test": m.score_thresh, "nms_thresh_test": m.nms_thresh,
               "detections_per_image": self.topk, "multi_label": True, "names": self.names}
        if m.end2end:  # no NMS: the one-to-one branch's top-k
            del out["nms_thresh_test"], out["multi_label"]
            out["selection"] = m.selection.name
        else:
            out |= {"multi_label": not self.decoding.best_class, **self.decoding.record()}
        return out

    def describe(self) -> list[tuple[str, str]]:
        """The head, the letterbox input, and the decoding :meth:`settings` records (rule,
        score threshold, NMS IoU, max_det; an end-to-end head's top-k selection has no NMS)."""
        s, p = self.settings(), self.preprocessing
        head = "end-to-end (one-to-one) " if "selection" in s else ""
        rows = [("architecture", f"YOLO {s['task']} {head}(stride {self.stride}), {self.num_classes} classes, "
                                 f"{'mask' if self.has_masks else 'box'} head"),
                ("input rule", f"{p.input_format} letterboxed to {s['input_size']} x {s['input_size']} "
                          f"(padding {p.pad_value})")]
        if "selection" in s:
            rule = f"{s['selection']}, no NMS"
        else:
            rule = (f"{s.get('decoding', 'multi-label')}{', class-agnostic' if s.get('agnostic_nms') else ''} "
                    f"NMS IoU {s['nms_thresh_test']:g}{' on the host' if self.decoding.host_nms else ''}")
        return rows + [("decoding", f"{rule}, conf > {s['score_thresh_test']:g}, "
                                    f"max_det {s['detections_per_image']}")]

    def runtime_metadata(self) -> dict[str, str]:
        meta = self.preprocessing.metadata()
        meta[contract.NUM_CLASSES] = str(self.num_classes)
        meta[contract.DETECTOR] = json.dumps(self.settings())
        meta.update(contract.class_names_metadata(self.names))
        if self.has_masks:
            meta[contract.MASK_PASTE] = YoloTuneCache.mask_paste  # coefficients over the prototypes
        if self._drops_empty_masks:
            meta[contract.DROP_EMPTY_MASKS] = "true"
        return meta

    @property
    def _drops_empty_masks(self) -> bool:
        """Ultralytics' predictor (the best-class decoding) drops a detection whose mask is empty."""
        return self.has_masks and self.decoding.best_class

    def _input_size(self, options) -> int:
        h = square_size(options, "a YOLO model", "letterbox")
        if h is None:
            return self.imgsz
        if int(h) <= 0 or int(h) % self.stride:
            raise NorcalError(f"export size {h} must be a positive multiple of the model's stride {self.stride}",
                              param=("height", "width"))
        return int(h)

    def export_options(self, options) -> Any:
        """The export job's options, checked before the export: a square size that is a
        multiple of the stride (default the trained imgsz), a positive batch."""
        self._input_size(options)
        batch = getattr(options, "batch", None)
        if batch is not None and int(batch) <= 0:
            raise NorcalError(f"export batch must be positive, got {batch}", param="batch")
        return options

    def export(self, options=None) -> Any:
        """The plain ONNX graph: fixed S x S input (the model's imgsz, or the options' equal
        height and width), batch dynamic unless the options fix it."""
        import onnx
        import torch

        size = self._input_size(options)
        self.imgsz = size
        batch = getattr(options, "batch", None)
        opset = int(getattr(options, "opset", 17) or 17)
        b = 1 if batch is None else int(batch)
        if b <= 0:
            raise NorcalError(f"export batch must be positive, got {b}", param="batch")
        gen = torch.Generator().manual_seed(0)
        images = torch.rand((b, 3, size, size), generator=gen) * 255.0
        sizes = torch.tensor([[size, size]] * b, dtype=torch.int64)
        from norcal.export.families.ultralytics.yolo_graph import output_names

        host = self.decoding.host_nms
        names = output_names(self.has_masks, host_nms=host)
        (logits,) = self.classifier.logits
        dynamic = {n: {0: "batch"} for n in (*contract.INPUT_NAMES, *names)} if batch is None else None
        proto = trace_onnx(self.model.eval(), (images, sizes, {"with_cls_logits": True, "candidates": host}),
                           contract.INPUT_NAMES, [*names, logits], opset, dynamic, internal=[logits])  # logits named
        for out in proto.graph.output:  # padded to K like EfficientNMS: say so in the shapes
            dims = out.type.tensor_type.shape.dim
            if batch is not None and dims:
                dims[0].Clear()
                dims[0].dim_value = b
            if not host and out.name not in ("num_detections", contract.MASK_PROTOS) and len(dims) >= 2:
                dims[1].Clear()
                dims[1].dim_value = self.topk
        props = self.runtime_metadata() | contract.classifier_metadata(self.classifier)
        if self.has_masks:
            props[contract.MASK_HEAD_ROIS] = "static"  # the K slots' masks, no data-dependent shapes
        onnx.helper.set_model_props(proto, props)
        return proto

    def torch_runner(self, calibration=None, name: str = "pytorch"):
        from norcal.export.families.ultralytics.yolo_graph import output_names
        from norcal.export.pytorch.runner import TorchRunner

        runner = TorchRunner(self.model, name=name, calibration=calibration, metadata=self.runtime_metadata())
        runner.output_names = output_names(self.has_masks)
        return runner

    # --- tuning
    def _anchors(self) -> int:
        return sum(math.ceil(self.imgsz / float(s)) ** 2 for s in self.model.head.stride)

    def cache_bytes(self, num_images: int, num_gammas: int) -> int:
        per_anchor = 4 + self.num_classes + (self.model.head.nm if self.has_masks else 0)
        protos = (self.model.head.nm * (self.imgsz // 4) ** 2) if self.has_masks else 0
        return int(num_images) * 4 * (self._anchors() * per_anchor + protos)

    def cache(self, batches: Iterable[tuple[list, Any]], priors: Sequence[np.ndarray | None], mechanism: str,
              on_step: Callable[[int], None] | None = None, with_masks: bool = False) -> YoloTuneCache:
        """One network pass over the host's prepared (letterboxed) batches; per image the
        anchors whose score reaches the threshold under some prior of the sweep (no other
        anchor can be a candidate of the graph's NMS at any of them, nor pass the threshold
        after an end-to-end head's top-k: that top-k is re-run per prior by :meth:`rescore`)."""
        import torch

        from norcal.core.calibration.formula import calibrate

        lps = [None if p is None else torch.as_tensor(np.asarray(p, np.float64), dtype=torch.float32)
               for p in priors]
        for lp in lps:
            if lp is not None and lp.shape != (self.num_classes,):
                raise NorcalError(f"log prior has shape {tuple(lp.shape)}, the YOLO head needs ({self.num_classes},)")
        # the predictor's decoding drops detections by their masks: box AP needs them too
        masks = (with_masks or self._drops_empty_masks) and self.has_masks
        thresh = self.model.score_thresh
        ids, boxes, logits, coefs, protos, sizes, originals = [], [], [], [], [], [], []
        input_hw = None
        with torch.no_grad():
            for chunk_ids, b in batches:
                hw = tuple(int(v) for v in b.images.shape[2:])
                if input_hw not in (None, hw):
                    raise NorcalError(f"batches of different input sizes {input_hw} and {hw}")
                input_hw = hw
                head = self._head_outputs(b.images)
                for j in range(len(chunk_ids)):
                    lg = head["cls_logits"][j]
                    best = np.zeros(lg.shape[0], dtype=bool)
                    for lp in lps or [None]:
                        p = torch.sigmoid(lg) if lp is None else calibrate(
                            lg, lp, mechanism=mechanism, activation="sigmoid", background="none")
                        # numpy: torch's threads wake for each small reduction, milliseconds per image
                        best |= (p.numpy() >= thresh).any(axis=1)
                    keep = np.flatnonzero(best)
                    boxes.append(head["boxes"][j].numpy()[keep])
                    logits.append(lg.numpy()[keep])
                    coefs.append(head["coefs"][j].numpy()[keep] if masks else None)
                    protos.append(head["protos"][j].numpy() if masks else None)
                sizes.append(np.asarray(b.image_sizes, np.int64).reshape(-1, 2))
                originals.append(np.asarray(b.original_sizes, np.int64).reshape(-1, 2))
                ids.extend(chunk_ids)
                if on_step:
                    on_step(len(chunk_ids))
        if not ids:
            raise NorcalError("no images to cache")
        return YoloTuneCache(ids, boxes, logits, coefs, protos, np.concatenate(sizes), np.concatenate(originals),
                             input_hw, self._drops_empty_masks)

    def _head_outputs(self, images: np.ndarray) -> dict:
        """The head's outputs (:meth:`YoloGraph.head_outputs`, as torch tensors) of a prepared
        batch, run as ``norcal infer`` runs the export: ONNX Runtime on their trace (traced once
        per input size)."""
        import torch

        from norcal.export.families.ultralytics.head_session import head_session

        names = ("boxes", "cls_logits", *(("coefs", "protos") if self.has_masks else ()))
        x = np.ascontiguousarray(images, np.float32)
        held = getattr(self, "_head_session", None)
        if held is None or held[0] != x.shape[1:]:
            session = head_session(self.model, lambda m, t: [m.head_outputs(t)[k] for k in names], (1, *x.shape[1:]),
                                   names)
            held = self._head_session = (x.shape[1:], session)
        return dict(zip(names, (torch.from_numpy(a) for a in held[1].run(None, {"images": x}))))

    def rescore(self, cache: YoloTuneCache, index: int, prior: np.ndarray | None, mechanism: str,
                batch_size: int) -> dict[str, np.ndarray]:
        """The cached anchors scored with ``prior`` through the graph's own selection (NMS, or
        an end-to-end head's top-k), top K and masks: the contract's outputs in resized-image
        coordinates, in cache order. Images are batched with their anchor lists padded by
        anchors no prior can score (logit -1e4), to at least as many as the selection needs to
        fill its K slots as the whole image's anchors would (an end-to-end top-k takes
        min(K, A) pairs)."""
        import torch

        from norcal.export.pytorch.tools import join_outputs, torch_threads
        from norcal.export.pytorch.runner import predictor_state

        if batch_size < 1:
            raise NorcalError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
        least = self.model.selection.least_anchors(self.topk, self.num_classes, self._anchors())
        out = []
        with torch.no_grad(), predictor_state(self.model):
            self.model.set_log_prior(prior, mechanism)
            for s in range(0, len(cache), batch_size):
                sl = slice(s, s + batch_size)
                a = max([least, *(len(x) for x in cache.boxes[sl])])
                # copies, the selection's NMS loop and gathers give the same values on any number of
                # threads, and one is the fastest for these small ops; the scores keep tune's threads
                with torch_threads(1):
                    boxes = torch.stack([_pad(x, a, 0.0) for x in cache.boxes[sl]])
                    logits = torch.stack([_pad(x, a, -1e4) for x in cache.logits[sl]])
                    coefs = protos = None
                    if cache.coefs[s] is not None:
                        coefs = torch.stack([_pad(x, a, 0.0) for x in cache.coefs[sl]])
                        protos = torch.stack([torch.as_tensor(x) for x in cache.protos[sl]])
                scores = self.model.probs(logits)
                with torch_threads(1):
                    det = self.model.detections(boxes, scores, torch.from_numpy(cache.image_sizes[sl]),
                                                cache.input_hw, coefs, protos)
                    out.append({k: v.numpy() for k, v in det.items()})
        return join_outputs(out)


def _pad(x: np.ndarray, rows: int, value: float):
    """``x`` [a, ...] as a torch tensor padded with ``value`` rows to ``rows``."""
    import torch

    t = torch.as_tensor(x)
    if len(t) == rows:
        return t
    return torch.cat([t, torch.full((rows - len(t), *t.shape[1:]), value, dtype=t.dtype)])
