"""Ultralytics RT-DETR / YOLO: tune's network pass (the detector's ``cache``, PyTorch eager)
against ``norcal infer``'s (ONNX Runtime on the exported graph), in one process, same batch.

    YOLO_OFFLINE=1 python bench/bench_tune_pass.py [--yaml rtdetr-l.yaml|yolo11s.yaml] [--size 320] [--repeat 5]

Builds the model from Ultralytics' packaged yaml (random weights: speed does not depend on
them), saves it as a checkpoint, loads it as ``norcal tune`` does (``load_detector``), exports
it once, then times per image, median of ``--repeat`` after one warm-up each:
  tune:   the detector's ``cache`` over one prepared batch at gamma 0 (what tune runs per batch;
          RT-DETR's builds its ONNX Runtime session in the warm-up);
  infer:  ONNX Runtime's CPU session on the exported graph (what norcal infer runs);
and prints the ratio to infer. Both sides get the same intra-op threads (torch's default and
ONNX Runtime's default are the machine's cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

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
    from ultralytics import RTDETR, YOLO

    from norcal.core.files.onnx_io import save_onnx
    from norcal.export.families import load_detector
    from norcal.runtime.backends import ONNXRUNTIME

    d = Path(tempfile.mkdtemp(prefix="bench_tune_"))
    ul = (RTDETR if "rtdetr" in Path(args.yaml).name else YOLO)(args.yaml)
    ul.model.names = {i: f"class{i}" for i in range(ul.model.yaml.get("nc", 80))}
    ul.model.args = {"imgsz": args.size}
    ul.save(str(d / "model.pt"))
    det = load_detector(d / "model.pt")
    save_onnx(det.export(None), d / "model.onnx")
    ort = ONNXRUNTIME.open(d / "model.onnx", "cpu")
    images = (np.random.default_rng(0).random((1, 3, args.size, args.size)) * 255).astype(np.float32)
    sizes = np.array([[args.size, args.size]], np.int64)
    batch = SimpleNamespace(images=images, image_sizes=sizes, original_sizes=sizes)
    feeds = {"images": images, "image_sizes": sizes}

    times = {"tune": _median_seconds(lambda: det.cache([([0], batch)], [None], "exp"), args.repeat),
             "infer": _median_seconds(lambda: ort.infer(feeds), args.repeat)}
    print(f"{args.yaml} at {args.size} px, torch threads {torch.get_num_threads()}, per image:")
    for name, s in times.items():
        print(f"  {name:6s} {s:7.3f} s   {s / times['infer']:5.2f} x infer")


if __name__ == "__main__":
    main()
