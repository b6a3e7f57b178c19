"""Parity: do two backends give the same detections? A comparator in Polygraphy's spirit.

``compare(reference, candidate, tolerances)`` judges one runner's outputs against another's,
both as returned by ``Runner.infer`` (the ONNX contract: ``num_detections [B]``, ``boxes
[B,K,4]``, ``scores [B,K]``, ``classes [B,K]``, optional ``masks [B,K,M,M]``).

Element by element in output order is the wrong test for detections: scores of different
detections can tie to 1e-6, so two correct backends list them in different orders, and the
top-K cut or the score threshold can take or leave a detection whose score sits on the
boundary. So detections are matched as sets per image (same class, box IoU >= a threshold,
greedily by reference score) and the per-output differences are measured on matched pairs.
A detection without a partner is excused only when its score lies within the score tolerance
of the other side's boundary (its lowest kept score when full, else the score threshold).
Outputs outside the contract are compared element-wise, as Polygraphy does.

Tolerances come per precision: ``fp32`` is tight and element-level (every matched pair's
box, score and mask within atol; at most 1% of detections unpaired, since a near-tie inside
the graph, e.g. at the RPN's per-level top-k, swaps a proposal and so a detection); ``tf32``
(TensorRT's default for fp32 engines on Ampere and later) and ``fp16`` are judged at the
detection level only: matched fraction, box IoU, score difference, and AP on given annotations.

Modules: ``tolerances`` (presets per precision), ``matching`` (pairing detections; the tests
match detectron2's goldens with it too), ``compare`` (one candidate against the reference),
``run`` (runners side by side on the same batches, AP), ``runners`` (which runners a request
names: ONNX Runtime, PyTorch from a checkpoint, a TensorRT engine or any model file a runtime
backend opens, with their presets), ``report``
(verdict lines, JSON),
``inputs`` (synthetic images). Everything returns data; the CLI draws the tables
(``norcal.cli.parity_tables``).
"""

from norcal.workflows.parity.compare import (DETECTION_KEYS, DetectionDiff, ParityReport, TensorDiff,
                                             compare)
from norcal.workflows.parity.inputs import synthetic_images
from norcal.workflows.parity.matching import box_iou, match_detections
from norcal.workflows.parity.report import report_json, verdict_lines
from norcal.workflows.parity.run import ParityRun, fixed_input_shape, model_score_thresh, run_parity
from norcal.workflows.parity.runners import Candidate, ParityRequest, ParityRunners, build_runners
from norcal.workflows.parity.tolerances import PRESETS, Tolerances, runner_precision, tolerances_for

__all__ = ["Candidate", "DETECTION_KEYS", "DetectionDiff", "PRESETS", "ParityReport", "ParityRequest", "ParityRun",
           "ParityRunners", "TensorDiff", "Tolerances", "box_iou", "build_runners", "compare",
           "fixed_input_shape", "match_detections",
           "model_score_thresh", "report_json", "run_parity", "runner_precision", "synthetic_images",
           "tolerances_for", "verdict_lines"]
