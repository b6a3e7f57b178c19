"""Which layers ONNX Runtime fuses in each form of our export (no timing: op counts).

Exports tests/fixtures/d2_lvis_tiny four ways (dynamic batch with padding masks behind the
padding switch, the default; the same with the masks always on; batch 1 at a dynamic size, no
padding masks; batch 1 at a fixed size, no padding masks), lets ONNX Runtime optimize each
(ORT_ENABLE_ALL, CPU) and prints the op counts of the optimized graph; for the default, the
path one image that fills the input runs: the main graph and the switch's unmasked branch. Convolutions fuse their activation in every form ("Conv -> Relu unfused" counts the
rest); a Relu left standing is a ResNet block's residual Add + Relu that stayed outside the
fused convolution.

    python bench/graph_fusion.py
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

from norcal.export.rcnn.padding_switch import IF_NODE

ROOT = Path(__file__).resolve().parents[1]
from fixture_files import fixture_dir  # noqa: E402
FIXTURE = fixture_dir("d2_lvis_tiny")
FORMS = {
    "dynamic batch, padding masks always (default)": {},
    "dynamic batch, padding masks behind the switch (opt-in), unmasked path": {"padding_switch": True},
    "batch 1, dynamic size, no padding masks": {"batch": 1},
    "batch 1, fixed 320x512, no padding masks": {"batch": 1, "height": 320, "width": 512,
                                                 "padding_masks": False},
}


def optimized_counts(proto: onnx.ModelProto, tmp: Path) -> tuple[collections.Counter, int]:
    src, dst = tmp / "model.onnx", tmp / "optimized.onnx"
    onnx.save(proto, src)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    graph = onnx.load(dst).graph
    nodes = []
    for n in graph.node:
        if n.op_type == "If" and n.name == IF_NODE:  # the branch run when no image has padding
            nodes.extend(next(a.g for a in n.attribute if a.name == "then_branch").node)
        else:
            nodes.append(n)
    readers = collections.defaultdict(list)
    for n in nodes:
        for i in n.input:
            readers[i].append(n.op_type)
    unfused = sum(1 for n in nodes if n.op_type == "Conv" and "Relu" in readers[n.output[0]])
    return collections.Counter(n.op_type for n in nodes), unfused


def main() -> int:
    from norcal.export.families.detectron2.loader import load_model
    from norcal.export.rcnn.onnx_export import export_onnx

    spec, model = load_model(FIXTURE / "model_final.pth", FIXTURE / "config.yaml")
    with tempfile.TemporaryDirectory() as d:
        for label, kw in FORMS.items():
            counts, unfused = optimized_counts(export_onnx(model, spec, **kw), Path(d))
            shown = ", ".join(f"{k} {counts[k]}" for k in ("Conv", "Relu", "Mul", "Where", "Reshape"))
            print(f"{label}: {shown}; Conv -> Relu unfused: {unfused}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
