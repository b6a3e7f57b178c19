"""Tolerance presets per precision, and which preset judges a runner."""

from __future__ import annotations

from dataclasses import dataclass, replace

from norcal.core.contract import PRECISION
from norcal.core.errors import NorcalError
from norcal.core.runner import Runner
from norcal.runtime import backends


@dataclass(frozen=True)
class Tolerances:
    """What counts as the same output for one precision.

    atol: per-output absolute tolerance on matched detections (boxes in input pixels);
    rtol: relative tolerance added to atol (|d| <= atol + rtol * |ref|), as numpy.isclose;
    elementwise: whether those per-output checks decide the verdict (else they are shown only);
    match_iou: the least box IoU for two same-class detections to be one detection;
    score_atol: the most a matched pair's scores may differ, and the boundary slack;
    min_matched: the least fraction of detections (either side) matched or excused;
    ap_atol: the most AP (0-1 scale, each LVIS stat) may differ when annotations are given;
    score_quantiles: where set ({quantile: bound}), the detection-level score check: those
    quantiles of the matched pairs' |score difference| within their bounds, instead of the max
    within ``score_atol`` (a few saturated scores do not decide an int8 verdict);
    floor_factor: where set, the score and box tolerances become max(preset, floor_factor x the
    reference's measured float noise) (:mod:`norcal.workflows.parity.floor`).
    """

    precision: str
    atol: dict[str, float]
    rtol: float
    elementwise: bool
    match_iou: float
    score_atol: float
    min_matched: float
    ap_atol: float
    default_atol: float = 1e-4
    floor_factor: float | None = None
    score_quantiles: dict[float, float] | None = None


# max(preset, FLOOR_FACTOR x floor): |cand - ref32| <= |cand - ref64| + |ref32 - ref64| = its own
# rounding error + the floor, and a candidate's kernels (ONNX Runtime's fused convs and GEMMs)
# round differently from PyTorch's. Measured (ONNX Runtime vs PyTorch fp32, max over 2-3 images,
# divided by the floor, scores / boxes): YOLO11n at 160 px 1.4 / 1.3, at 320 px 3.3 / 3.2, at 640 px
# 2.3 / 0.3; RT-DETR 0.9 / 1.5; detectron2 Cascade 1.3 / 1.5, RetinaNet 1.5 / 0.8; torchvision
# Faster R-CNN 1.1 / 1.3. 6 leaves nearly 2x over the worst; a graph error past it still fails.
FLOOR_FACTOR = 6.0

# int8 paired score differences, measured on the bundled model against PyTorch (8 validation
# images): median 3.2e-4, 99th percentile 0.037 (max 0.102); with one res4 conv's weight scale
# doubled (a broken quantization): median 9.7e-4, 99th percentile 0.075 (max 0.32). The bounds
# sit between: median within 0.01, 99th percentile within 0.06.
INT8_SCORE_QUANTILES = {0.5: 0.01, 0.99: 0.06}

# fp32 numbers: two fp32 implementations of the same graph agree to ~1e-6 relative per op;
# boxes are decoded with exp() and scaled by up to ~1000 px, masks go through 5 convs.
# min_matched < 1 even for fp32: discrete choices inside the graph flip on near-ties. Measured
# on d2_lvis_tiny img3: RPN level p2's 1000th and 1001st objectness logits differ by 1.2e-7,
# so ONNX Runtime keeps the other anchor, and one of 300 detections (score 0.91) differs from
# PyTorch (which equals detectron2 there). Paired detections must still agree tightly.
PRESETS: dict[str, Tolerances] = {
    "fp32": Tolerances("fp32", atol={"boxes": 1e-2, "scores": 1e-4, "masks": 1e-3}, rtol=1e-4,
                       elementwise=True, match_iou=0.99, score_atol=1e-4, min_matched=0.99,
                       ap_atol=1e-3, floor_factor=FLOOR_FACTOR),
    "tf32": Tolerances("tf32", atol={"boxes": 1.0, "scores": 1e-2, "masks": 5e-2}, rtol=1e-2,
                       elementwise=False, match_iou=0.9, score_atol=1e-2, min_matched=0.95,
                       ap_atol=5e-3),
    "fp16": Tolerances("fp16", atol={"boxes": 2.0, "scores": 2e-2, "masks": 1e-1}, rtol=2e-2,
                       elementwise=False, match_iou=0.8, score_atol=2e-2, min_matched=0.9,
                       ap_atol=1e-2),
    # int8 (explicit Q/DQ, `norcal quantize`): activations rounded to 256 levels per tensor move
    # boxes by pixels and scores by a few hundredths; measured on the bundled trained model
    # (8 validation images, 16 calibration images): 98.7% of fp32 detections scoring >= 0.05
    # have a same-class partner at IoU >= 0.5; against PyTorch all 2241 detections pair up, the
    # scores of a pair differing by up to 0.102. Judged on detections, not element by element,
    # and on what a user sees: the paired share, and the median and 99th percentile of the paired
    # scores' differences, not their max: where a few scores saturate (a YOLO11 int8 graph, 99.6%
    # paired, a handful of scores clipped at the int8 range's end) the max says nothing of the rest.
    "int8": Tolerances("int8", atol={"boxes": 8.0, "scores": 0.15, "masks": 0.25}, rtol=5e-2,
                       elementwise=False, match_iou=0.5, score_atol=0.15, min_matched=0.8,
                       ap_atol=3e-2, score_quantiles=INT8_SCORE_QUANTILES),
}


def tolerances_for(precision: str, **overrides) -> Tolerances:
    """The preset for ``precision`` ('fp32', 'tf32', 'fp16', 'int8'), with fields overridden."""
    if precision not in PRESETS:
        raise NorcalError(f"unknown precision {precision!r}; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[precision], **{k: v for k, v in overrides.items() if v is not None})


def runner_precision(runner: Runner) -> str:
    """The preset a runner's outputs are judged with: its ``precision`` attribute, else what its
    model's metadata says `norcal quantize` made of it (int8, fp16), else from its name
    ('...fp16' -> fp16), else its backend's preset (a runner name containing a backend's
    name; TensorRT -> tf32, its default for fp32 on Ampere+), else fp32."""
    explicit = getattr(runner, "precision", None)
    if explicit in PRESETS:
        return explicit
    quantized = (getattr(runner, "metadata", None) or {}).get(PRECISION)
    if quantized in PRESETS:
        return quantized
    name = getattr(runner, "name", "")
    if "int8" in name:
        return "int8"
    if "fp16" in name:
        return "fp16"
    return next((b.parity_precision for b in backends.BACKENDS if b.parity_precision and b.name in name), "fp32")

