"""detectron2's own ONNX graph of d2_lvis_tiny carried to other weights of the same topology,
e.g. the full-width LVIS R50-FPN Mask R-CNN, where detectron2 itself cannot be run.

detectron2's TracingAdapter export of the fixture (tests/fixtures/d2_lvis_tiny/
detectron2_export_800x1216.onnx) is the exact LVIS R50-FPN graph at reduced width. Its
weights are initializers: the FPN, RPN and ROI-head ones named after the state dict
(``model.<key>``), the ResNet convs anonymous (``onnx::Conv_N``) with their FrozenBN folded in
by the exporter; the consuming Conv's scope names the module (``/backbone/bottom_up/res2/
res2.0/conv1/Conv`` -> ``backbone.bottom_up.res2.0.conv1``). ``widen`` replaces each
initializer by the state dict's tensor (folding FrozenBN the same way, eps 1e-5) and rewrites
the one width the trace baked into constants: the channel count of the box and mask poolers'
zero-filled output ([N, C, R, R], C = the FPN's width). Everything else in the graph reads
widths from the tensors it runs on.

    python bench/widen_detectron2_graph.py CHECKPOINT_DIR OUT.onnx

(CHECKPOINT_DIR holds model_final.pth and config.yaml, e.g. as written by
``python bench/full_size_model.py DIR``: DIR/many, DIR/few.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

FROZEN_BN_EPS = 1e-5
POOLERS = ("/roi_heads/box_pooler/", "/roi_heads/mask_pooler/")


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def fold_frozen_bn(state: dict, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of conv ``prefix`` with its FrozenBN (``prefix.norm.*``) folded in, float32."""
    n = {k: _np(state[f"{prefix}.norm.{k}"]).astype(np.float32)
         for k in ("weight", "bias", "running_mean", "running_var")}
    scale = n["weight"] / np.sqrt(n["running_var"] + np.float32(FROZEN_BN_EPS))
    w = _np(state[f"{prefix}.weight"]).astype(np.float32) * scale.reshape(-1, 1, 1, 1)
    return w, n["bias"] - n["running_mean"] * scale


def module_of(node_name: str) -> str:
    """The state-dict prefix of the module a traced node belongs to: its scope, where a
    segment that extends the one before it (``res2`` then ``res2.0``) replaces it."""
    parts: list[str] = []
    for seg in node_name.strip("/").split("/")[:-1]:
        if parts and seg.startswith(parts[-1] + "."):
            parts[-1] = seg
        else:
            parts.append(seg)
    return ".".join(parts)


def initializer_sources(model: onnx.ModelProto, state: dict) -> dict[str, tuple[str, str]]:
    """Each initializer's source: ("checkpoint", key) or ("fold", conv prefix) plus "weight"/"bias"
    as the key's last part for folded ones (("fold", "backbone...conv1.weight"))."""
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for name in inits:
        if name.startswith("model.") and name[len("model."):] in state:
            out[name] = ("checkpoint", name[len("model."):])
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        prefix = module_of(node.name)
        for name, part in zip(node.input[1:], ("weight", "bias")):
            if name in inits and name not in out:
                if f"{prefix}.norm.running_var" not in state:
                    raise SystemExit(f"initializer {name} of {node.name}: no FrozenBN {prefix}.norm.* "
                                     "in the state dict")
                out[name] = ("fold", f"{prefix}.{part}")
    missing = inits - set(out)
    if missing:
        raise SystemExit(f"no state-dict tensor for initializers {sorted(missing)[:5]}")
    return out


def _pooler_channel_constants(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Constant nodes holding C in the poolers' zeros shape Concat([N], [C], [R], [R]) ->
    ConstantOfShape -> used under /roi_heads/*_pooler/."""
    made = {o: n for n in model.graph.node for o in n.output}
    users: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    hits = []
    for n in model.graph.node:
        if n.op_type != "ConstantOfShape" or not any(
                u.name.startswith(POOLERS) for u in users.get(n.output[0], [])):
            continue
        concat = made.get(n.input[0])
        if concat is None or concat.op_type != "Concat" or len(concat.input) != 4:
            raise SystemExit(f"{n.name}: the pooler's output shape is not Concat([N], [C], [R], [R])")
        c = made.get(concat.input[1])
        if c is None or c.op_type != "Constant":
            raise SystemExit(f"{concat.name}: the pooler's channel count is not a constant")
        hits.append(c)
    if len(hits) != 2:
        raise SystemExit(f"expected the box and mask poolers' channel constants, found {len(hits)}")
    return hits


def widen(model: onnx.ModelProto, state: dict) -> onnx.ModelProto:
    """A copy of detectron2's traced graph ``model`` with the weights of ``state`` (a detectron2
    state dict of the same topology, any widths) and the pooler widths they imply."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    sources = initializer_sources(out, state)
    for t in out.graph.initializer:
        src, key = sources[t.name]
        if src == "checkpoint":
            value = _np(state[key]).astype(np.float32)
        else:
            prefix, part = key.rsplit(".", 1)
            value = fold_frozen_bn(state, prefix)[0 if part == "weight" else 1]
        t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value), t.name))
    fpn = int(_np(state["backbone.fpn_output2.weight"]).shape[0])
    for c in _pooler_channel_constants(out):
        c.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([fpn], np.int64)))
    # value_info recorded at the traced widths would contradict the new ones
    del out.graph.value_info[:]
    return out


def compare_detections(d2_outputs, our_outputs, *, min_iou: float = 0.99,
                       max_score_diff: float = 1e-3) -> dict:
    """detectron2's graph's outputs (boxes, classes, masks, scores, size) against ours (num,
    boxes, scores, classes, masks; image 0), paired as sets (same class, IoU >= ``min_iou``,
    scores within ``max_score_diff``). Returns the counts, the pairs' worst IoU, score and
    mask differences, and detectron2's detections left unpaired as (score, the highest IoU
    with one of ours of its class): a pair with IoU at the NMS threshold is a near tie that
    detectron2's class-offset NMS (float32 coordinates shifted by class * image size) can
    decide either way."""
    from norcal.core.boxes import box_iou
    from norcal.workflows.parity.matching import match_detections

    boxes, classes, masks, scores = d2_outputs[:4]
    num, o_boxes, o_scores, o_classes, o_masks = our_outputs[:5]
    n = int(num[0])
    o_boxes, o_scores, o_classes = o_boxes[0, :n], o_scores[0, :n], o_classes[0, :n]
    gi, oi, iou = match_detections(boxes, scores, classes, o_boxes, o_scores, o_classes,
                                   min_iou, max_score_diff)
    pairs = len(gi)
    unpaired = []
    for i in np.setdiff1d(np.arange(len(scores)), gi):
        same = o_classes == classes[i]
        best = float(box_iou(boxes[i:i + 1], o_boxes[same]).max()) if same.any() else 0.0
        unpaired.append((float(scores[i]), best))
    return {"detectron2": len(scores), "ours": n, "matched": pairs, "unpaired": unpaired,
            "min_iou": float(iou.min()) if pairs else None,
            "max_score_diff": float(np.abs(scores[gi] - o_scores[oi]).max()) if pairs else None,
            "max_mask_diff": float(np.abs(masks[gi, 0] - o_masks[0, oi]).max()) if pairs else None}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[-2])
    from fixture_files import fixture_dir
    from norcal.export.families.detectron2.loader import load_detector_spec

    folder, target = Path(argv[0]), Path(argv[1])
    _, state = load_detector_spec(folder / "model_final.pth", folder / "config.yaml")
    tiny = onnx.load(fixture_dir("d2_lvis_tiny") / "detectron2_export_800x1216.onnx")
    onnx.save(widen(tiny, state), target)
    print(f"wrote {target}: detectron2's graph with the weights of {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
