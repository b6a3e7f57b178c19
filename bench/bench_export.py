"""Benchmark the export of a full-size LVIS Mask R-CNN and ONNX Runtime vs PyTorch eager.

Model: detectron2's LVIS v1 R-50-FPN Mask R-CNN: the config of tests/fixtures/d2_lvis_tiny
with detectron2's full widths (64-channel stem, 256 res2 / FPN / mask head, 1024 fc, 1203
classes, 800/1333 test sizes) and random, well-conditioned weights saved as a detectron2
checkpoint. Export time is that of the export job as ``norcal export MODEL --gamma 0.5``
runs it (load, export, NorCal node, ONNX check + write + TensorRT-parser check), with the
time of each step and of the library calls inside them; then ``--process-runs`` times the
same command as a whole process (``norcal export``, median; what a user waits for, imports
included: measured against detectron2's own TracingAdapter export of the same checkpoint,
28.6 s, ours must stay below it). The default export traces the backbone three times (the
main graph's placeholder, then with and without padding masks for the padding switch,
``norcal.export.rcnn.padding_switch``). ``--latency`` also times, at 800x1333, ONNX Runtime latency /
eager latency for each batch size (target <= 1.0). ``uptime`` is printed before and after.

    python bench/bench_export.py [--threads 2] [--process-runs 3] [--latency] [--repeats 3]
        [--batches 1 2]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import yaml
from rich.console import Console
from rich.table import Table

import norcal.export.trt_check as trt_check
import torch.onnx._internal.torchscript_exporter.utils as torch_onnx_utils
from norcal.export.families.detectron2.loader import load_model
from norcal.export.rcnn.modeling.build import random_state_dict
from norcal.workflows.export_job import NorCal, export_checkpoint

from full_size_model import full_size_config, full_size_spec  # noqa: E402



def full_size_checkpoint(folder: Path) -> tuple[Path, Path]:
    """(model_final.pth with random weights, config.yaml) of the full-size model in ``folder``
    (bench/full_size_model.py's topology; random weights: the export's time does not depend
    on their values)."""
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(full_size_config()))
    weights = folder / "model_final.pth"
    torch.save({"model": random_state_dict(full_size_spec(), seed=0)}, weights)
    return weights, config


class Timings:
    """Seconds spent in named calls, by monkeypatching the module attributes they are looked up by."""

    def __init__(self):
        self.seconds: collections.Counter = collections.Counter()

    def wrap(self, module, attr: str, label: str) -> None:
        fn = getattr(module, attr)

        @functools.wraps(fn)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[label] += time.perf_counter() - t

        setattr(module, attr, timed)


def time_export(src: Path, config: Path, out: Path) -> tuple[float, dict[str, float], collections.Counter]:
    calls = Timings()
    calls.wrap(torch_onnx_utils, "_create_jit_graph", "torch.onnx.export: tracing")
    calls.wrap(torch_onnx_utils, "_optimize_graph", "torch.onnx.export: graph passes")
    calls.wrap(onnx.checker, "check_model", "onnx.checker.check_model")
    calls.wrap(onnx.shape_inference, "infer_shapes", "onnx shape inference (surgery, TensorRT check)")
    calls.wrap(trt_check, "check_model", "TensorRT-parser check")
    steps: dict[str, float] = {}
    state = {"name": None, "t": 0.0}

    def step(name: str) -> None:
        now = time.perf_counter()
        if state["name"]:
            steps[state["name"]] = now - state["t"]
        state.update(name=name, t=now)

    from norcal.workflows.export_job import CheckpointExport

    t0 = time.perf_counter()
    export_checkpoint(src, out, NorCal(gamma=0.5), CheckpointExport(config=config), progress=step)
    total = time.perf_counter() - t0
    step("")
    return total, steps, calls.seconds


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _process_export(src: Path, config: Path, out: Path, threads: int) -> float:
    """Wall seconds of ``norcal export SRC --config CONFIG --gamma 0.5 -o OUT`` in a fresh
    interpreter (imports, load, trace, NorCal node, checks, write)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-c", "import sys; from norcal.cli import main; sys.exit(main())", "export", str(src), "--config", str(config),
           "--gamma", "0.5", "-o", str(out)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t


def _batch(b: int, h: int = 800, w: int = 1333, div: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    hp, wp = -(-h // div) * div, -(-w // div) * div
    images = np.zeros((b, 3, hp, wp), np.float32)
    images[:, :, :h, :w] = rng.uniform(0, 255, (b, 3, h, w))
    return images, np.array([[h, w]] * b, np.int64)


def _time(fn, repeats: int) -> float:
    fn()  # warm-up: allocations, oneDNN / ORT kernel selection
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both backends")
    p.add_argument("--process-runs", type=int, default=3,
                   help="whole-process `norcal export` runs (median; 0: none)")
    p.add_argument("--compare-switch", action="store_true",
                   help="also time the job in this process with the padding switch on")
    p.add_argument("--latency", action="store_true", help="also time ONNX Runtime against eager")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2], help="batch sizes")
    args = p.parse_args(argv)
    console = Console()
    console.print(f"start: {_uptime()}")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        with console.status("writing the full-size checkpoint"):
            src, config = full_size_checkpoint(Path(tmp))
        with console.status("exporting (norcal export ... --gamma 0.5)"):
            total, steps, calls = time_export(src, config, Path(tmp) / "model.norcal.onnx")
        table = Table(title="export job, full-size LVIS R-50-FPN Mask R-CNN")
        table.add_column("step / call")
        table.add_column("s", justify="right")
        for name, s in steps.items():
            table.add_row(name, f"{s:.2f}")
        for name, s in calls.items():
            table.add_row(f"  in it: {name}", f"{s:.2f}")
        table.add_row("total", f"{total:.2f}")
        console.print(table)
        console.print(f"export time in this process: {total:.1f} s")
        if args.compare_switch:
            import norcal.export.rcnn.onnx_export as onnx_export
            plain = onnx_export.export_onnx
            onnx_export.export_onnx = functools.partial(plain, padding_switch=True)
            try:
                with console.status("exporting again, padding switch on"):
                    total2 = time_export(src, config, Path(tmp) / "plain.onnx")[0]
            finally:
                onnx_export.export_onnx = plain
            console.print(f"the same job with the padding switch on: {total2:.1f} s "
                          f"(switch on / off: {total2 / total:.2f})")
        if args.process_runs > 0:
            walls = []
            for i in range(args.process_runs):
                with console.status(f"norcal export as a process, run {i + 1}"):
                    walls.append(_process_export(src, config, Path(tmp) / f"p{i}.onnx", args.threads))
            med = statistics.median(walls)
            console.print(f"norcal export as a whole process: median {med:.1f} s of "
                          f"{', '.join(f'{w:.1f}' for w in walls)} (detectron2's TracingAdapter "
                          f"export of the same checkpoint: 28.6 s, measured elsewhere; "
                          f"{'below' if med < 28.6 else 'NOT below'} it)")
        console.print(f"end: {_uptime()}")
        if not args.latency:
            return 0
        spec, model = load_model(src, config)
        proto = onnx.load(str(Path(tmp) / "model.norcal.onnx"))
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    lat = Table(title=f"R-50-FPN Mask R-CNN, 1203 classes, 800x1333, {args.threads} threads")
    for col in ("batch", "ONNX Runtime s", "PyTorch eager s", "ratio ORT/eager", "target"):
        lat.add_column(col, justify="right")
    for b in args.batches:
        images, sizes = _batch(b)
        ti, ts = torch.from_numpy(images), torch.from_numpy(sizes)
        with console.status(f"timing batch {b}"):
            ort_s = _time(lambda: sess.run(None, {"images": images, "image_sizes": sizes}), args.repeats)
            with torch.no_grad():
                eager_s = _time(lambda: model(ti, ts), args.repeats)
        ratio = ort_s / eager_s
        lat.add_row(str(b), f"{ort_s:.2f}", f"{eager_s:.2f}", f"{ratio:.2f}",
                    "ok (<= 1.0)" if ratio <= 1.0 else "MISSED (<= 1.0)")
    console.print(lat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
