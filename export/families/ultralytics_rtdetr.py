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

import io
import json
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from norcal.core import contract
from norcal.core.calibration import calibrate
from norcal.core.errors import NorcalError
from norcal.export.families.base import Classifier, Detections, Detector, PathLike, TuneCache

ARCHITECTURE = "rtdetr"
DEFAULT_SCORE_THRESH = 0.001  # Ultralytics' validation conf: AP is measured over low scores too
MIN_OPSET = 17

# (image paths) -> (images float32 [B,3,H,W] as the graph takes them, original sizes int64 [B,2]);
# the host pre-processing lives in norcal.runtime, which this layer does not import
Prepare = Callable[[Sequence[PathLike]], tuple[np.ndarray, np.ndarray]]


@dataclass
class RtdetrExportOptions:
    """batch: fixed batch size (None: dynamic); opset; check: onnx.checker full check."""

    batch: int | None = None
    opset: int = 17
    check: bool = True


def decode(boxes, scores, topk: int, score_thresh: float, image_sizes):
    """Ultralytics' RT-DETR selection into our padded outputs (torch; traced into the graph).

    boxes [B,Q,4] cx,cy,w,h normalised; scores [B,Q,C]; image_sizes [B,2] (h, w) of the input
    as stretched -> num_detections [B], boxes [B,K,4] x0,y0,x1,y1 in those pixels, scores
    [B,K], classes [B,K]: the top K (query, class) scores, those at or below ``score_thresh``
    zeroed after the valid ones."""
    import torch

    b, q, c = scores.shape
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
    return (num, xyxy * valid.unsqueeze(-1).to(xyxy.dtype), top * valid.to(top.dtype),
            classes * valid.to(classes.dtype))


def _graph_module(detector: "RtdetrDetector"):
    """Our torch wrapper: contract feeds -> contract outputs (+ the class logits)."""
    import torch

    class RtdetrGraph(torch.nn.Module):
        def __init__(self, model, topk: int, score_thresh: float, height: int, width: int):
            super().__init__()
            self.model = model
            self.topk, self.score_thresh = topk, score_thresh
            self.height, self.width = height, width
            self.log_prior: torch.Tensor | None = None  # NorCal in PyTorch (the parity reference)
            self.mechanism = "exp"

        def head(self, images):
            """The last decoder layer's boxes [B,Q,4] (cx,cy,w,h in [0,1]) and class logits [B,Q,C]."""
            out = self.model.predict(images / 255.0)
            if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], tuple)):
                raise NorcalError("the RT-DETR head returns no raw decoder outputs (is it in "
                                  "Ultralytics' export mode?); load the model afresh")
            dec_bboxes, dec_scores = out[1][:2]
            return dec_bboxes[-1], dec_scores[-1]

        def forward(self, images, image_sizes, with_cls_logits: bool = False):
            boxes, logits = self.head(images)
            if self.log_prior is None:
                scores = logits.sigmoid()
            else:
                scores = calibrate(logits, self.log_prior, self.mechanism, None, "sigmoid", "none")
            out = decode(boxes, scores, self.topk, self.score_thresh, image_sizes)
            return (*out, logits) if with_cls_logits else out

    return RtdetrGraph(detector.model, detector.topk, detector.score_thresh, detector.height,
                       detector.width).eval()


class RtdetrCache(TuneCache):
    """Per image the last decoder layer's boxes [Q,4] (cx,cy,w,h normalised) and class logits
    [Q,C], float32; original sizes [N,2]."""

    def __init__(self, image_ids: list, boxes: np.ndarray, logits: np.ndarray, original_sizes: np.ndarray):
        self.image_ids, self.boxes, self.logits, self.original_sizes = image_ids, boxes, logits, original_sizes

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def nbytes(self) -> int:
        return int(self.boxes.nbytes + self.logits.nbytes + self.original_sizes.nbytes)

    @classmethod
    def concat(cls, parts: Sequence["RtdetrCache"]) -> "RtdetrCache":
        return cls([i for c in parts for i in c.image_ids], np.concatenate([c.boxes for c in parts]),
                   np.concatenate([c.logits for c in parts]), np.concatenate([c.original_sizes for c in parts]))


class RtdetrDetector(Detector):
    """An Ultralytics RT-DETR in eval mode, with its class names and input size.

    topk: detections per image (Ultralytics' max_det, 300); score_thresh: Ultralytics' conf
    (scores above it are kept); prepare: the host pre-processing for :meth:`cache` (the
    workflow passes :func:`norcal.runtime.preprocess.prepare_stretch_batch` over read images).
    """

    family: ClassVar[str] = "ultralytics"

    def __init__(self, model, names: Sequence[str], imgsz: int, topk: int = 300,
                 score_thresh: float = DEFAULT_SCORE_THRESH, prepare: Prepare | None = None):
        head = model.model[-1]
        if type(head).__name__ != "RTDETRDecoder":
            raise NorcalError(f"not an RT-DETR: the model's head is {type(head).__name__}, not RTDETRDecoder")
        self.model = model.eval()
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
        self.prepare = prepare

    @classmethod
    def from_model(cls, model, names: Sequence[str] | dict | None = None, imgsz: int = 640,
                   **options) -> "RtdetrDetector":
        """An Ultralytics ``RTDETRDetectionModel`` already in memory (``RTDETR(...).model``);
        names default to the model's own (``model.names``)."""
        names = getattr(model, "names", None) if names is None else names
        if isinstance(names, dict):
            names = [names[k] for k in sorted(names)]
        if names is None:
            names = [str(i) for i in range(int(model.model[-1].nc))]
        return cls(model, list(names), imgsz, **options)

    # ------------------------------------------------------------------ what the product reads
    @property
    def classifier(self) -> Classifier:
        return Classifier(logits=(contract.CLS_LOGITS_TENSOR,), class_axis=-1, background="none",
                          activation="sigmoid")

    @property
    def preprocessing(self) -> contract.Preprocessing:
        return contract.stretch_preprocessing(self.height)

    def settings(self) -> dict[str, Any]:
        """The detector settings recorded in ``norcal.detector``."""
        return {"family": self.family, "architecture": ARCHITECTURE, "num_queries": self.num_queries,
                "topk": self.topk, "score_thresh": self.score_thresh, "imgsz": self.height}

    def metadata(self) -> dict[str, str]:
        """The runtime and graph keys of the plain export."""
        return {**self.preprocessing.metadata(),
                contract.NUM_CLASSES: str(self.num_classes),
                contract.DETECTOR: json.dumps(self.settings(), sort_keys=True),
                contract.CLASSIFIER_LOGITS: contract.CLS_LOGITS_TENSOR,
                contract.CLASSIFIER_BACKGROUND: "none"}

    def graph_module(self):
        """The torch module the export traces (and the PyTorch runner runs)."""
        return _graph_module(self)

    # ------------------------------------------------------------------ export
    def export(self, options: RtdetrExportOptions | None = None):
        """The plain ONNX graph: inputs ``images`` [B,3,H,W] (RGB 0-255, stretched to imgsz) and
        ``image_sizes``; the contract's four outputs with K = topk; ``cls_logits`` named."""
        import onnx
        import torch

        o = options or RtdetrExportOptions()
        if o.opset < MIN_OPSET:
            raise NorcalError(f"opset {o.opset} is too old: the export needs opset >= {MIN_OPSET}",
                              param="opset")
        if o.batch is not None and o.batch < 1:
            raise NorcalError(f"export batch must be positive, got {o.batch}", param="batch")
        b = o.batch or 1
        gen = torch.Generator().manual_seed(0)
        images = torch.rand((b, 3, self.height, self.width), generator=gen) * 255.0
        sizes = torch.tensor([[self.height, self.width]] * b, dtype=torch.int64)
        names = list(contract.OUTPUT_NAMES[:4])
        dynamic = {} if o.batch else {n: {0: "batch"} for n in (*contract.INPUT_NAMES, *names)}
        buf = io.BytesIO()
        module = self.graph_module()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer chatter about Python ints and constants
            torch.onnx.export(module, (images, sizes, {"with_cls_logits": True}), buf,
                              input_names=list(contract.INPUT_NAMES),
                              output_names=[*names, contract.CLS_LOGITS_TENSOR], dynamic_axes=dynamic,
                              opset_version=o.opset, dynamo=False, do_constant_folding=True)
        proto = onnx.load_from_string(buf.getvalue())
        proto.producer_name = "norcal-deploy"
        kept = [v for v in proto.graph.output if v.name != contract.CLS_LOGITS_TENSOR]
        del proto.graph.output[:]
        proto.graph.output.extend(kept)
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
        """A Runner over our torch wrapper (the graph the export traces), NorCal applied per
        ``calibration`` (an :class:`norcal.export.torch_runner.OnnxCalibration`; None: plain)."""
        return RtdetrTorchRunner(self, calibration, name)

    # ------------------------------------------------------------------ tuning
    def cache_bytes(self, num_images: int, num_gammas: int) -> int:
        per_image = self.num_queries * (self.num_classes + 4) * 4 + 16
        return int(num_images) * per_image

    def head_outputs(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(boxes [B,Q,4] cx,cy,w,h normalised, class logits [B,Q,C]) of a prepared batch."""
        import torch

        module = self.graph_module()
        with torch.no_grad():
            boxes, logits = module.head(torch.as_tensor(np.ascontiguousarray(images, np.float32)))
        return boxes.numpy().astype(np.float32), logits.numpy().astype(np.float32)

    def cache(self, images, priors, mechanism, batch_size, on_step=None, with_masks=False) -> RtdetrCache:
        """One network pass: each image's boxes and class logits (the priors play no part:
        NorCal and the top K are re-done per prior by :meth:`rescore`)."""
        if with_masks:
            raise NorcalError("RT-DETR has no mask head", param="with_masks")
        if self.prepare is None:
            raise NorcalError("RtdetrDetector.cache needs the host pre-processing: pass prepare",
                              param="prepare")
        if batch_size < 1:
            raise NorcalError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
        if not images:
            raise NorcalError("no images to cache")
        ids, boxes, logits, sizes = [], [], [], []
        for s in range(0, len(images), batch_size):
            chunk = images[s:s + batch_size]
            batch, original = self.prepare([p for _, p in chunk])
            b, lg = self.head_outputs(batch)
            ids += [i for i, _ in chunk]
            boxes.append(b)
            logits.append(lg)
            sizes.append(np.asarray(original, np.int64).reshape(-1, 2))
            if on_step is not None:
                on_step(len(chunk))
        return RtdetrCache(ids, np.concatenate(boxes), np.concatenate(logits), np.concatenate(sizes))

    def rescore(self, cache: RtdetrCache, index: int, prior, mechanism: str, batch_size: int) -> list[Detections]:
        """Each cached image's detections at ``prior`` ([C] log a_c; None: plain sigmoid), in
        original image coordinates (scaled per axis, clipped, empty boxes dropped as ``norcal
        infer`` does)."""
        import torch

        out = []
        for s in range(0, len(cache), max(1, int(batch_size))):
            logits = torch.from_numpy(cache.logits[s:s + batch_size])
            if prior is None:
                scores = logits.sigmoid()
            else:
                lp = np.asarray(prior, np.float64).reshape(-1)
                if lp.size != self.num_classes:
                    raise NorcalError(f"the prior has {lp.size} entries but the model has "
                                      f"{self.num_classes} classes", param="prior")
                scores = calibrate(logits, lp, mechanism, None, "sigmoid", "none")
            with torch.no_grad():
                num, boxes, sc, cls = (t.numpy() for t in decode(
                    torch.from_numpy(cache.boxes[s:s + batch_size]), scores, self.topk,
                    self.score_thresh, torch.tensor([[self.height, self.width]] * len(logits))))
            for j in range(len(num)):
                n = int(num[j])
                oh, ow = (int(v) for v in cache.original_sizes[s + j])
                bx = boxes[j, :n].astype(np.float32).copy()
                bx[:, 0::2] = np.clip(bx[:, 0::2] * np.float32(ow / self.width), 0, ow)
                bx[:, 1::2] = np.clip(bx[:, 1::2] * np.float32(oh / self.height), 0, oh)
                keep = (bx[:, 2] > bx[:, 0]) & (bx[:, 3] > bx[:, 1])
                out.append(Detections(boxes=bx[keep], scores=sc[j, :n].astype(np.float32)[keep],
                                      classes=cls[j, :n].astype(np.int64)[keep]))
        return out


def _check_classifier(proto) -> None:
    """The traced graph has ``cls_logits`` feeding exactly one Sigmoid (where NorCal goes)."""
    readers = [n for n in proto.graph.node if contract.CLS_LOGITS_TENSOR in n.input]
    if [n.op_type for n in readers] != ["Sigmoid"]:
        raise NorcalError(f"RT-DETR export: {contract.CLS_LOGITS_TENSOR} feeds "
                          f"{', '.join(n.op_type for n in readers) or 'nothing'}, not one Sigmoid "
                          "(a changed Ultralytics decoder?)")


class RtdetrTorchRunner:
    """Runner over an RT-DETR's torch wrapper on the contract's feeds (CPU)."""

    def __init__(self, detector: RtdetrDetector, calibration=None, name: str = "pytorch"):
        import torch

        self.name = name
        self.input_names = list(contract.INPUT_NAMES)
        self.output_names = list(contract.OUTPUT_NAMES[:4])
        self.metadata = detector.metadata()
        self.module = detector.graph_module()
        if calibration is not None:
            if calibration.activation != "sigmoid":
                raise NorcalError(f"the ONNX model's NorCal node uses {calibration.activation} but "
                                  "RT-DETR's classifier uses sigmoid: they are not the same model")
            lp = np.asarray(calibration.log_prior(), np.float64).reshape(-1)
            if lp.size != detector.num_classes:
                raise NorcalError(f"the ONNX model's NorCal prior has {lp.size} entries but the RT-DETR "
                                  f"has {detector.num_classes} classes")
            self.module.log_prior = torch.from_numpy(lp)
            self.module.mechanism = calibration.mechanism

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise NorcalError(f"{self.name}: missing inputs {', '.join(missing)}")
        images = torch.as_tensor(np.ascontiguousarray(feeds["images"], np.float32))
        sizes = torch.as_tensor(np.asarray(feeds["image_sizes"], np.int64))
        with torch.no_grad():
            out = self.module(images, sizes)
        return {k: v.numpy() for k, v in zip(self.output_names, out)}
