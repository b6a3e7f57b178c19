"""The Ultralytics family: YOLOv8 / YOLO11 / YOLO26 detect and segment checkpoints (``best.pt``,
loaded as :class:`norcal.export.families.ultralytics.yolo.YoloDetector`), RT-DETR ones (as
:class:`norcal.export.families.ultralytics.rtdetr.RtdetrDetector`), and Ultralytics' own ONNX
exports (converted to our contract by :mod:`.onnx_yolo` / :mod:`.onnx_rtdetr`).

Loading is safe (:mod:`norcal.export.families.ultralytics.checkpoint`): nothing from the file runs.
"""

from __future__ import annotations

from pathlib import Path

from norcal.core.decoding import LABEL_RULES, Decoding
from norcal.core.errors import NorcalError
from norcal.core.ranges import MAX_EXPORT_SIDE, check_range
from norcal.export.families.base import Detector, Family, refuse_decoding_of_kept_graph
from norcal.export.families.ultralytics.checkpoint import (RTDETR_TASK, TASKS, checkpoint_model,
                                                           import_ultralytics, read_ultralytics_checkpoint,
                                                           task_of)
from norcal.export.families.ultralytics.onnx_common import is_ultralytics
from norcal.export.families.ultralytics.yolo import DEFAULT_IMGSZ, YoloDetector, model_names

SUFFIXES = (".pt", ".pth")


def _imgsz(ckpt: dict, model, path) -> int:
    """The square input side the model was trained at (train_args / model.args imgsz), else 640."""
    args = ckpt.get("train_args") or getattr(model, "args", None) or {}
    raw = args.get("imgsz") if isinstance(args, dict) else getattr(args, "imgsz", None)
    if isinstance(raw, (list, tuple)):
        if len(set(raw)) != 1:
            raise NorcalError(f"{path}: trained at a non-square imgsz {list(raw)}: give the export height and width")
        raw = raw[0]
    if raw is None:
        return DEFAULT_IMGSZ
    # a value read from the file: a crafted one must not reach a giant allocation
    return int(check_range(f"{path}: saved imgsz", raw, 32, MAX_EXPORT_SIDE,
                           why="the largest export side"))


class UltralyticsFamily(Family):
    """Claims a torch zip checkpoint whose pickle names an Ultralytics task model (read from the
    pickle's opcodes, nothing unpickled); loads those of :data:`TASKS` and names the others."""

    name = "ultralytics"
    reads = ("YOLOv8 / YOLO11 / YOLO26 detect or segment and RT-DETR checkpoints (best.pt, last.pt) and their "
             "ONNX exports; RGB input, letterboxed (RT-DETR: stretched) to the trained imgsz")
    suffixes = SUFFIXES
    decodings = LABEL_RULES  # YOLO: the validator's multi-label NMS or the predictor's; RT-DETR: pairs or queries

    def claims(self, path: Path, config: Path | None) -> bool:
        # any Ultralytics task model is claimed, so that load names a pose / OBB / classify one
        return config is None and path.suffix.lower() in SUFFIXES and path.is_file() and task_of(path) is not None

    def check_export_options(self, options) -> None:
        """mask_head_rois is detectron2's (the YOLO graph's masks always cover the K slots)."""
        if getattr(options, "mask_head_rois", None) is not None:
            raise NorcalError(f"mask_head_rois does not apply to {self.name} checkpoints", param="mask_head_rois")

    def claims_graph(self, model) -> bool:
        """An ONNX graph whose metadata says Ultralytics exported it."""
        return is_ultralytics(model)

    def ingest_graph(self, model, path: Path, calibration, decoding: Decoding | None = None) -> tuple[object, str]:
        """Ultralytics' graph converted to our contract (NorCal then on ``cls_logits``; the NMS
        ``decoding``'s), unless the calibration names the logits: then it is kept as it is, NorCal
        on that tensor."""
        from norcal.export.families.ultralytics.onnx_yolo import ingest_ultralytics, summary

        if calibration.logits:
            refuse_decoding_of_kept_graph(path, decoding)
            return model, (f"Ultralytics ONNX kept as it is (logits {calibration.logits!r} given): NorCal placed on "
                           "that tensor, the outputs stay Ultralytics' (our infer and eval cannot read them)")
        model, head = ingest_ultralytics(model, str(path), decoding=decoding)
        return model, summary(head)

    def load(self, path: Path, config: Path | None = None, **options) -> Detector:
        """A :class:`YoloDetector`, or an RT-DETR's
        :class:`~norcal.export.families.ultralytics.rtdetr.RtdetrDetector` when the checkpoint
        holds an ``RTDETRDetectionModel``."""
        if config is not None:
            raise NorcalError(f"{config}: an Ultralytics checkpoint carries its own architecture; it takes no config",
                              param="config")
        task = task_of(path)
        if task not in TASKS:
            raise NorcalError(f"{path}: an Ultralytics {task}; only {', '.join(TASKS)} checkpoints are exported")
        import_ultralytics()
        ckpt = read_ultralytics_checkpoint(path)
        model = checkpoint_model(ckpt, path)
        imgsz = _imgsz(ckpt, model, path)
        if type(model).__name__ == RTDETR_TASK:
            return _load_rtdetr(model, path, imgsz, **options)
        return YoloDetector(model, path, imgsz=imgsz, **options)


def _load_rtdetr(model, path, imgsz: int, detections_per_image: int | None = None,
                 score_thresh: float | None = None, nms_thresh: float | None = None,
                 decoding: Decoding | None = None) -> Detector:
    """An RT-DETR checkpoint's model as its detector; errors name the file. It has no NMS, so
    ``nms_thresh`` (a YOLO setting) is refused when given."""
    from norcal.export.families.ultralytics.rtdetr import (DEFAULT_SCORE_THRESH, DEFAULT_TOPK,
                                                           RtdetrDetector)

    if nms_thresh is not None:
        raise NorcalError(f"{path}: an RT-DETR has no NMS: nms_thresh does not apply", param="nms_thresh")
    if imgsz % 32:
        raise NorcalError(f"{path}: trained at imgsz {imgsz}, not a multiple of 32 (RT-DETR's stride)")
    names = model_names(model, path)
    pairs = int(model.model[-1].num_queries) * len(names)  # the top K is taken over queries x classes
    if detections_per_image is not None and not 1 <= int(detections_per_image) <= pairs:
        raise NorcalError(f"{path}: detections_per_image must be in 1..{pairs} (queries x classes), got "
                          f"{detections_per_image}", param="detections_per_image")
    return RtdetrDetector(model, names, imgsz, path=path,
                          # Ultralytics: its decoder's top num_queries, then the predictor's max_det (300)
                          topk=min(DEFAULT_TOPK, int(model.model[-1].num_queries)) if detections_per_image is None
                          else int(detections_per_image),
                          score_thresh=DEFAULT_SCORE_THRESH if score_thresh is None else float(score_thresh),
                          decoding=decoding)


