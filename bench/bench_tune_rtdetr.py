"""RT-DETR: tune's network pass (the family's ``head_outputs``, PyTorch eager) against
``norcal infer``'s (ONNX Runtime on the exported graph), in one process, same batch.

    YOLO_OFFLINE=1 python bench/bench_tune_rtdetr.py [--yaml rtdetr-l.yaml] [--size 320] [--repeat 5]

Builds the model from Ultralytics' packaged yaml (random weights: speed does not depend on
them), exports it once, then times per image, median of ``--repeat`` after one warm-up each:
  tune:   RtdetrDetector.head_outputs (what RtdetrDetector.cache runs per batch);
  fused:  the same head on a copy with Ultralytics' ``fuse()`` (BatchNorm folded, RepConv merged);
  infer:  ONNX Runtime's CPU session on the exported graph (what norcal infer runs);
and prints the ratios to infer. Both sides get the same intra-op threads (torch's default
and ONNX Runtime's default are the machine's cores).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")


def _median_seconds(fn, repeat: int) -> float:
    fn()  # warm-up: first-call allocations and kernel selection
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--yaml", default="rtdetr-l.yaml")
    p.add_argument("--size", type=int, default=320)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()

    import numpy as np
    import torch
    from ultralytics import RTDETR

    from norcal.core.onnx_io import save_onnx
    from norcal.export.families import load_detector
    from norcal.runtime.backends import ONNXRUNTIME

    d = Path(tempfile.mkdtemp(prefix="bench_rtdetr_"))
    rt = RTDETR(args.yaml)
    rt.model.names = {i: f"class{i}" for i in range(rt.model.yaml.get("nc", 80))}
    rt.model.args = {"imgsz": args.size}
    rt.save(str(d / "model.pt"))
    det = load_detector(d / "model.pt")
    save_onnx(det.export(None), d / "model.onnx")
    ort = ONNXRUNTIME.open(d / "model.onnx", "cpu")
    images = (np.random.default_rng(0).random((1, 3, args.size, args.size)) * 255).astype(np.float32)
    feeds = {"images": images, "image_sizes": np.array([[args.size, args.size]], np.int64)}
    fused = det.graph_module()
    fused.model = copy.deepcopy(fused.model).fuse(verbose=False)

    def run_fused():
        with torch.no_grad():
            fused.head(torch.as_tensor(images))

    times = {"tune": _median_seconds(lambda: det.head_outputs(images), args.repeat),
             "fused": _median_seconds(run_fused, args.repeat),
             "infer": _median_seconds(lambda: ort.infer(feeds), args.repeat)}
    print(f"{args.yaml} at {args.size} px, torch threads {torch.get_num_threads()}, per image:")
    for name, s in times.items():
        print(f"  {name:6s} {s:7.3f} s   {s / times['infer']:5.2f} x infer")


if __name__ == "__main__":
    main()
