"""RT-DETR (Ultralytics ``RTDETRDetectionModel``) as a :class:`Detector` of the Ultralytics family.

RT-DETR is a DETR: Q object queries (300), each with a box (cx, cy, w, h normalised to the
input) and C sigmoid class logits, no background and no NMS. Ultralytics (8.4) scores it as
``RTDETRDecoder.postprocess`` and ``RTDETRPredictor.postprocess`` do: sigmoid of the last
decoder layer's logits, the top K of all Q x C (query, class) scores (a query may appear with
several classes), then those above the confidence threshold, in descending order.

Our graph keeps exactly that and puts it into the output contract: the last decoder layer's
class logits are named ``cls_logits`` [B, Q, C] and feed one Sigmoid (NorCal's sigmoid variant,
background none, last axis); boxes come out as x0,y0,x1,y1 in the input's pixels (the image as
stretched, ``image_sizes`` = (H, W)). The host stretches every image to the model's square
size without keeping the aspect ratio, as the RT-DETR predictor does (LetterBox(auto=False,
scale_fill=True)); the graph takes RGB 0-255 and divides by 255. The metadata says so
(``norcal.resize`` = stretch, ``norcal.input_size`` = S, ``norcal.input_format`` = RGB).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np

from norcal.core import contract
from norcal.core.decoding import Decoding
from norcal.core.errors import NorcalError
from norcal.export.families.ultralytics.checkpoint import fused, ordered_names
from norcal.export.families.base import Classifier, Detector, TuneCache, sigmoid_classifier, square_size
from norcal.export.pytorch.onnx_trace import MIN_OPSET, require_opset, trace_onnx

ARCHITECTURE = "rtdetr"
DEFAULT_SCORE_THRESH = 0.001  # Ultralytics' validation conf: AP is measured over low scores too
DEFAULT_TOPK = 300  # Ultralytics' max_det


@dataclass
class RtdetrExportOptions:
    """batch: fixed batch size (None: dynamic); opset; check: onnx.checker full check; size:
    the square input side (None: the detector's imgsz)."""

    batch: int | None = None
    opset: int = MIN_OPSET
    check: bool = True
    size: int | None = None


def decode(boxes, scores, topk: int, score_thresh: float, image_sizes, best_class: bool = False):
    """Ultralytics' RT-DETR selection into our padded outputs (torch; traced into the graph).

    boxes [B,Q,4] cx,cy,w,h normalised; scores [B,Q,C]; image_sizes [B,2] (h, w) of the input
    as stretched -> num_detections [B], boxes [B,K,4] x0,y0,x1,y1 in those pixels, scores
    [B,K], classes [B,K]: the top K (query, class) scores (``best_class``: the top K queries by
    their best class's score, one label each), those at or below ``score_thresh`` zeroed after
    the valid ones."""
    import torch

    b, q, c = scores.shape
    if best_class:
        best, label = scores.max(dim=-1)  # [B,Q]: the first of equal maxima
        k = min(int(topk), q)
        top, query = best.topk(k, dim=1)
        classes = torch.gather(label, 1, query)
    else:
        k = min(int(topk), q * c)
        top, index = scores.flatten(1).topk(k, dim=1)
        query = torch.div(index, c, rounding_mode="floor")
        classes = index - query * c
    sel = boxes.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
    cx, cy, w, h = sel.unbind(-1)
    scale = image_sizes.flip(-1).repeat(1, 2).to(sel.dtype).unsqueeze(1)  # [B,1,4]: w, h, w, h
    xyxy = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1) * scale
    valid = top > score_thresh  # sorted: the valid ones come first
    num = valid.sum(dim=1)
    out = [xyxy * valid.unsqueeze(-1).to(xyxy.dtype), top * valid.to(top.dtype), classes * valid.to(classes.dtype)]
    if k < topk:  # fewer queries than K slots (best-class): zero slots, as the invalid ones
        out = [torch.nn.functional.pad(t, (0, 0, 0, int(topk) - k) if t.dim() == 3 else (0, int(topk) - k))
               for t in out]
    return (num, *out)


def _graph_module(detector: "RtdetrDetector"):
    """Our torch wrapper: contract feeds -> contract outputs (+ the class logits). NorCal in
    eager PyTorch (the parity reference, the tuning sweep) is the sigmoid heads' shared
    :class:`~norcal.export.pytorch.sigmoid_norcal.SigmoidNorCal`, which the PyTorch runner sets
    as it sets any of our heads."""
    import torch

    from norcal.export.pytorch.sigmoid_norcal import SigmoidNorCal

    class RtdetrGraph(SigmoidNorCal, torch.nn.Module):
        head_name = "the RT-DETR head"

        def __init__(self, model, num_classes: int, topk: int, score_thresh: float, best_class: bool):
            super().__init__()
            self.model = model
            self.num_classes, self.topk, self.score_thresh = num_classes, topk, score_thresh
            self.best_class = best_class
            self.init_norcal()

        def head(self, images):
            """The last decoder layer's boxes [B,Q,4] (cx,cy,w,h in [0,1]) and class logits [B,Q,C]."""
            out = self.model.predict(images / 255.0)
            if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], tuple)):
                raise NorcalError("the RT-DETR head returns no raw decoder outputs (is it in "
                                  "Ultralytics' export mode?); load the model afresh")
            dec_bboxes, dec_scores = out[1][:2]
            return dec_bboxes[-1], dec_scores[-1]

        def detections(self, boxes, logits, image_sizes) -> dict:
            """The contract's outputs by name from the head's boxes and class logits."""
            out = decode(boxes, self.probs(logits), self.topk, self.score_thresh, image_sizes, self.best_class)
            return dict(zip(contract.OUTPUT_NAMES[:4], out))

        def inference(self, images, image_sizes) -> dict:
            """Detections by name (what the PyTorch runner reads)."""
            return self.detections(*self.head(images), image_sizes)

        def forward(self, images, image_sizes, with_cls_logits: bool = False):
            boxes, logits = self.head(images)
            out = tuple(self.detections(boxes, logits, image_sizes).values())
            return (*out, logits) if with_cls_logits else out

    return RtdetrGraph(detector.model, detector.num_classes, detector.topk, detector.score_thresh,
                       detector.decoding.best_class).eval()


class RtdetrCache(TuneCache):
    """Per image the last decoder layer's boxes [Q,4] (cx,cy,w,h normalised) and class logits
    [Q,C], float32; image_sizes / original_sizes int64 [N,2] as :class:`TuneCache` says (the
    former all the stretched input's (H, W))."""

    keep_empty_boxes = True  # Ultralytics keeps boxes clipped to no area
    clip_boxes = False  # its RT-DETR predictor scales the boxes to the image, unclipped

    def __init__(self, image_ids: list, boxes: np.ndarray, logits: np.ndarray, image_sizes: np.ndarray,
                 original_sizes: np.ndarray):
        self.image_ids, self.boxes, self.logits = image_ids, boxes, logits
        self.image_sizes, self.original_sizes = image_sizes, original_sizes

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def nbytes(self) -> int:
        return int(self.boxes.nbytes + self.logits.nbytes + self.image_sizes.nbytes + self.original_sizes.nbytes)

    @classmethod
    def concat(cls, parts: Sequence["RtdetrCache"]) -> "RtdetrCache":
        return cls([i for c in parts for i in c.image_ids],
                   *(np.concatenate([getattr(c, k) for c in parts])
                     for k in ("boxes", "logits", "image_sizes", "original_sizes")))


class RtdetrDetector(Detector):
    """An Ultralytics RT-DETR in eval mode, fused in place as Ultralytics' predictor and exporter
    fuse it (:func:`~norcal.export.families.ultralytics.checkpoint.fused`), with its class names
    and input size.

    topk: detections per image (Ultralytics' max_det, 300); score_thresh: Ultralytics' conf
    (scores above it are kept); path: the checkpoint it was loaded from (None: built in memory);
    decoding: multi-label (default: the top K over queries x classes, Ultralytics 8.4's
    predictor and validator) or best-class (each query's best class, one label per query); an
    RT-DETR has no NMS, so ``agnostic_nms`` is refused; its ``conf`` is ``score_thresh``.
    """

    family: ClassVar[str] = "ultralytics"

    def __init__(self, model, names: Sequence[str], imgsz: int, topk: int = DEFAULT_TOPK,
                 score_thresh: float = DEFAULT_SCORE_THRESH, path=None, decoding: Decoding | None = None):
        head = model.model[-1]
        if type(head).__name__ != "RTDETRDecoder":
            raise NorcalError(f"not an RT-DETR: the model's head is {type(head).__name__}, not RTDETRDecoder")
        self.model = fused(model.eval())
        self.names = [str(n) for n in names]
        self.num_classes = int(head.nc)
        if len(self.names) != self.num_classes:
            raise NorcalError(f"names lists {len(self.names)} classes but the RT-DETR head has "
                              f"{self.num_classes}", param="names")
        self.num_queries = int(head.num_queries)
        # Ultralytics' RT-DETR predictor takes square sizes only ("must be square and scale-filled")
        if isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz <= 0 or imgsz % 32:
            raise NorcalError(f"imgsz {imgsz!r} must be a positive multiple of 32 (the model's stride; "
                              "RT-DETR's input is square)", param="imgsz")
        self.height = self.width = int(imgsz)
        if not 1 <= int(topk) <= self.num_queries * self.num_classes:
            raise NorcalError(f"topk must be in 1..{self.num_queries * self.num_classes}, got {topk}",
                              param="topk")
        self.topk = int(topk)
        if not (math.isfinite(score_thresh) and 0 <= score_thresh < 1):
            raise NorcalError(f"score_thresh must be in [0, 1), got {score_thresh}", param="score_thresh")
        self.score_thresh = float(score_thresh)
        self.path = None if path is None else Path(path)
        self.decoding = decoding or Decoding()
        if self.decoding.agnostic_nms:
            raise NorcalError("an RT-DETR has no NMS: agnostic_nms does not apply", param="agnostic_nms")
        if self.decoding.host_nms:  # its top K has no data-dependent shape: TensorRT for RTX builds it as it is
            raise NorcalError("an RT-DETR has no NMS to leave to the host: nms='host' does not apply", param="nms")
        if self.decoding.conf is not None:
            self.score_thresh = float(self.decoding.conf)

    @classmethod
    def from_model(cls, model, names: Sequence[str] | dict | None = None, imgsz: int = 640,
                   **options) -> "RtdetrDetector":
        """An Ultralytics ``RTDETRDetectionModel`` already in memory (``RTDETR(...).model``);
        names default to the model's own (``model.names``)."""
        names = ordered_names(getattr(model, "names", None) if names is None else names, "names")
        if names is None:
            names = [str(i) for i in range(int(model.model[-1].nc))]
        return cls(model, list(names), imgsz, **options)

    # ------------------------------------------------------------------ what the product reads
    @property
    def classifier(self) -> Classifier:
        return sigmoid_classifier()

    @property
    def preprocessing(self) -> contract.Preprocessing:
        # Ultralytics' RTDETRPredictor scales the boxes to the original image and clips nothing
        return contract.stretch_preprocessing(self.height, clip_boxes=False)

    def settings(self) -> dict[str, Any]:
        """The detector settings recorded in ``norcal.detector``."""
        # score_thresh_test: the key parity and verify read (as for every family)
        return {"family": self.family, "architecture": ARCHITECTURE, "num_queries": self.num_queries,
                "topk": self.topk, "score_thresh_test": self.score_thresh, "imgsz": self.height,
                "names": self.names, **self.decoding.record()}

    def describe(self) -> list[tuple[str, str]]:
        """The decoder, the stretched input, and the decoding :meth:`settings` records (rule,
        score threshold, max_det; an RT-DETR has no NMS)."""
        s = self.settings()
        return [("architecture", f"RT-DETR ({s['num_queries']} queries), {self.num_classes} classes, box head"),
                ("input rule", f"{self.preprocessing.input_format} stretched to {s['imgsz']} x {s['imgsz']}"),
                ("decoding", f"{s.get('decoding', 'multi-label')}, no NMS, conf > {s['score_thresh_test']:g}, "
                             f"max_det {s['topk']}")]

    def metadata(self) -> dict[str, str]:
        """The runtime and graph keys of the plain export."""
        return {**self.preprocessing.metadata(),
                contract.NUM_CLASSES: str(self.num_classes),
                contract.DETECTOR: json.dumps(self.settings(), sort_keys=True),
                **contract.classifier_metadata(self.classifier), **contract.class_names_metadata(self.names)}

    def graph_module(self):
        """The torch module the export traces (and the PyTorch runner runs)."""
        return _graph_module(self)

    # ------------------------------------------------------------------ export
    def export_options(self, options) -> RtdetrExportOptions:
        """The export job's options (:class:`norcal.workflows.export_job.CheckpointExport`) as
        :meth:`export` takes them, checked first: a square height = width, a multiple of 32
        (default: the trained imgsz), a positive batch."""
        size = square_size(options, "an RT-DETR", "stretched")
        if size is not None:
            if size <= 0 or size % 32:
                raise NorcalError(f"export size {size} must be a positive multiple of 32 (the model's stride)",
                                  param=("height", "width"))
        batch = getattr(options, "batch", None)
        if batch is not None and int(batch) <= 0:
            raise NorcalError(f"export batch must be positive, got {batch}", param="batch")
        return RtdetrExportOptions(batch=None if batch is None else int(batch),
                                   opset=int(getattr(options, "opset", 17) or 17), size=size)

    def export(self, options: RtdetrExportOptions | None = None):
        """The plain ONNX graph: inputs ``images`` [B,3,H,W] (RGB 0-255, stretched to imgsz) and
        ``image_sizes``; the contract's four outputs with K = topk; ``cls_logits`` named."""
        import onnx
        import torch

        o = options or RtdetrExportOptions()
        require_opset(o.opset)
        if o.batch is not None and o.batch < 1:
            raise NorcalError(f"export batch must be positive, got {o.batch}", param="batch")
        if o.size is not None:  # checked by export_options; the metadata then says this size
            self.height = self.width = int(o.size)
        b = o.batch or 1
        gen = torch.Generator().manual_seed(0)
        images = torch.rand((b, 3, self.height, self.width), generator=gen) * 255.0
        sizes = torch.tensor([[self.height, self.width]] * b, dtype=torch.int64)
        names = list(contract.OUTPUT_NAMES[:4])
        dynamic = {} if o.batch else {n: {0: "batch"} for n in (*contract.INPUT_NAMES, *names)}
        proto = trace_onnx(self.graph_module(), (images, sizes, {"with_cls_logits": True}), contract.INPUT_NAMES,
                           [*names, contract.CLS_LOGITS_TENSOR], o.opset, dynamic,
                           internal=[contract.CLS_LOGITS_TENSOR])  # the logits named
        _check_classifier(proto)
        for out in proto.graph.output:  # padded to K, like EfficientNMS: say so in the shapes
            dims = out.type.tensor_type.shape.dim
            if out.name != "num_detections" and len(dims) >= 2:
                dims[1].Clear()
                dims[1].dim_value = self.topk
        onnx.helper.set_model_props(proto, self.metadata())
        if o.check:
            onnx.checker.check_model(proto, full_check=True)
        return proto

    # ------------------------------------------------------------------ PyTorch reference
    def torch_runner(self, calibration=None, name: str = "pytorch"):
        """A :class:`norcal.export.pytorch.runner.TorchRunner` over our torch wrapper (the graph
        the export traces), NorCal applied per ``calibration`` (None: plain)."""
        from norcal.export.pytorch.runner import TorchRunner

        return TorchRunner(self.graph_module(), name=name, calibration=calibration, metadata=self.metadata())

    # ------------------------------------------------------------------ tuning
    def cache_bytes(self, num_images: int, num_gammas: int) -> int:
        per_image = self.num_queries * (self.num_classes + 4) * 4 + 32
        return int(num_images) * per_image

    def head_outputs(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(boxes [B,Q,4] cx,cy,w,h normalised, class logits [B,Q,C]) of a prepared batch, run
        as ``norcal infer`` runs the export: ONNX Runtime on the network the export traces (the
        head traced once per detector, at torch's intra-op threads)."""
        from norcal.export.families.ultralytics.head_session import head_session

        session = getattr(self, "_head_session", None)
        if session is None:
            session = self._head_session = head_session(self.graph_module(), lambda m, x: m.head(x),
                                                        (1, 3, self.height, self.width), ("boxes", "logits"))
        boxes, logits = session.run(None, {"images": np.ascontiguousarray(images, np.float32)})
        return boxes, logits

    def cache(self, batches: Iterable[tuple[list, Any]], priors: Sequence[np.ndarray | None], mechanism: str,
              on_step: Callable[[int], None] | None = None, with_masks: bool = False) -> RtdetrCache:
        """One network pass over the host's prepared (stretched) batches: each image's boxes and
        class logits. The priors play no part: every query stays (NorCal reorders the top K of
        queries x classes, so no query can be dropped before it), re-scored by :meth:`rescore`."""
        if with_masks:
            raise NorcalError("RT-DETR has no mask head: tune it on boxes", param="with_masks")
        ids, boxes, logits, sizes, originals = [], [], [], [], []
        for chunk_ids, b in batches:
            bx, lg = self.head_outputs(b.images)
            ids.extend(chunk_ids)
            boxes.append(bx)
            logits.append(lg)
            sizes.append(np.asarray(b.image_sizes, np.int64).reshape(-1, 2))
            originals.append(np.asarray(b.original_sizes, np.int64).reshape(-1, 2))
            if on_step is not None:
                on_step(len(chunk_ids))
        if not ids:
            raise NorcalError("no images to cache")
        return RtdetrCache(ids, np.concatenate(boxes), np.concatenate(logits), np.concatenate(sizes),
                           np.concatenate(originals))

    def rescore(self, cache: RtdetrCache, index: int, prior: np.ndarray | None, mechanism: str,
                batch_size: int) -> dict[str, np.ndarray]:
        """The cached queries scored with ``prior`` ([C] log a_c; None: the plain sigmoid) and
        selected as the graph does (top K of queries x classes, conf): the contract's outputs in
        the stretched input's pixels, in cache order."""
        import torch

        from norcal.export.pytorch.tools import join_outputs

        if batch_size < 1:
            raise NorcalError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
        module = self.graph_module()
        module.set_log_prior(prior, mechanism)
        out = []
        with torch.no_grad():
            for s in range(0, len(cache), batch_size):
                sl = slice(s, s + batch_size)
                det = module.detections(torch.from_numpy(cache.boxes[sl]), torch.from_numpy(cache.logits[sl]),
                                        torch.from_numpy(cache.image_sizes[sl]))
                out.append({k: v.numpy() for k, v in det.items()})
        return join_outputs(out)


def _check_classifier(proto) -> None:
    """The traced graph has ``cls_logits`` feeding exactly one Sigmoid (where NorCal goes)."""
    readers = [n for n in proto.graph.node if contract.CLS_LOGITS_TENSOR in n.input]
    if [n.op_type for n in readers] != ["Sigmoid"]:
        raise NorcalError(f"RT-DETR export: {contract.CLS_LOGITS_TENSOR} feeds "
                          f"{', '.join(n.op_type for n in readers) or 'nothing'}, not one Sigmoid "
                          "(a changed Ultralytics decoder?)")
