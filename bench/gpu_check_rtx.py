"""The GPU check's RTX-engine step (bench/gpu_check.py runs it last; this file runs it alone).

TensorRT for RTX builds ahead of time on any machine (``norcal build --target rtx``), but its
engines run only on RTX-class GPUs: compute capability 7.5, 8.0, 8.6, 8.9, 12.x (Turing to
Blackwell GeForce / RTX PRO), not Hopper (H100, H200: 9.0) nor Volta (7.0). The step:

1. build: where TensorRT for RTX's Python package is installed, norcal builds an engine of each
   RTX graph (the tests' tiny detector; the tests' tiny RT-DETR where Ultralytics is installed)
   for this GPU's compute capability when TensorRT for RTX runs on it, else for its defaults.
   Where the package is missing it builds nothing and says so (one line).
2. run: on a GPU TensorRT for RTX runs on, each engine runs through norcal's TensorRTRunner and
   is compared with ONNX Runtime on the CPU (the tf32 preset, TensorRT's fp32 default); on any
   other GPU (or none) one line says why nothing ran, and where an engine was built the runner
   must refuse it in one line too (a runner that opens it is a failure).

Nothing is reported that did not run. Returns (prints) the number of failed rows.

    python bench/gpu_check_rtx.py [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1] / "tests"
RTX_RUNS_ON = "TensorRT for RTX engines run on SM 7.5/8.0/8.6/8.9/12.x only"


def _gpu(device: str) -> tuple[str | None, str]:
    """(compute capability "9.0", GPU name) of the torch device; (None, why) without a CUDA GPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None, f"no CUDA GPU (device {device})"
    major, minor = torch.cuda.get_device_capability(dev)
    return f"{major}.{minor}", torch.cuda.get_device_name(dev)


def _tiny_detector(folder: Path):
    """The tests' tiny detector: (name, onnx, build ranges, feeds)."""
    import onnx

    sys.path.insert(0, str(TESTS / "runtime"))
    from test_tensorrt import tiny_detector

    path = folder / "tiny.onnx"
    onnx.save(tiny_detector({"norcal.gamma": "0.3"}), path)
    rng = np.random.default_rng(0)
    feeds = {"images": rng.normal(size=(3, 3, 64, 96)).astype(np.float32),
             "image_sizes": np.array([[64, 96], [60, 90], [32, 40]], np.int64)}
    return "tiny detector", path, dict(batch=(1, 2, 4), hw=((32, 32), (64, 96), (128, 128))), feeds


def _tiny_rtdetr(folder: Path):
    """The tests' tiny RT-DETR exported with a NorCal node (gamma 0.5), one synthetic image."""
    sys.path.insert(0, str(TESTS))
    from yolo_models import make_rtdetr_checkpoint, write_table

    from norcal.core.contract import input_spec
    from norcal.core.files.onnx_io import load_onnx
    from norcal.runtime.inference import prepared_batches
    from norcal.workflows.export_job import NorCal, export_checkpoint
    from norcal.workflows.parity import synthetic_images

    table, _ = write_table(folder / "table.json")
    path = folder / "rtdetr.onnx"
    export_checkpoint(make_rtdetr_checkpoint(folder / "rtdetr.pt"), path, NorCal(gamma=0.5, table=str(table)))
    meta = {p.key: p.value for p in load_onnx(path).metadata_props}
    batch = next(prepared_batches(synthetic_images(2), input_spec(meta), 2))
    return "tiny RT-DETR", path, dict(batch=(1, 2, 2)), batch.feeds()


def _graphs(folder: Path, say) -> list:
    import importlib.util

    graphs = [_tiny_detector(folder)]
    if importlib.util.find_spec("ultralytics") is None:
        say("RTX engine: tiny RT-DETR left out: Ultralytics is not installed here (its checkpoint is made with it)")
    else:
        graphs.append(_tiny_rtdetr(folder))
    return graphs


def _build(name, path, ranges, capability, say) -> tuple[Path | None, int]:
    """The engine norcal builds for RTX (and 0), or (None, 1) after saying why it failed."""
    from norcal import BuildOptions, build_engine
    from norcal.core.errors import NorcalError
    from norcal.core.tensorrt_targets import RTX_CAPABILITIES

    engine = path.with_suffix(".engine")
    caps = (capability,) if capability in RTX_CAPABILITIES else None  # None: the library's defaults
    t0 = time.perf_counter()
    try:
        side = build_engine(BuildOptions(path, engine, target="rtx", capabilities=caps, **ranges))
    except NorcalError as e:
        say(f"RTX engine: {name}: build FAILED: {e}")
        return None, 1
    say(f"RTX engine: {name}: built ahead of time in {time.perf_counter() - t0:.2f} s for compute capability "
        f"{' '.join(side['compute_capabilities'])} ({engine.stat().st_size} bytes, {side['library']} "
        f"{side['tensorrt_version']})")
    return engine, 0


def _run(name, path, engine, feeds, say) -> int:
    """One engine through TensorRTRunner against ONNX Runtime on the CPU; 1 if it fails."""
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner
    from norcal.workflows.parity.compare import compare
    from norcal.workflows.parity.run import model_score_thresh

    runner = TensorRTRunner(engine)
    ort = OnnxRuntimeRunner(path, provider="cpu")
    t0 = time.perf_counter()
    got = runner.infer(feeds)
    seconds = time.perf_counter() - t0
    rep = compare(ort.infer(feeds), got, "tf32", reference_name=ort.name, candidate_name=runner.name,
                  score_thresh=model_score_thresh(runner.metadata))
    det = rep.detections
    figures = (f"{det.images} images, detections {det.reference_count}/{det.candidate_count}, paired "
               f"{100 * det.matched_fraction:.1f}%, max |d score| {det.max_score_diff:.1e}, max |d box| "
               f"{det.max_box_diff:.1e} px" if det is not None else "")
    say(f"RTX engine: {name}: {runner.name} vs {ort.name} (tf32 preset): {figures}; first run {seconds:.2f} s "
        f"(compiles for the GPU) -> {'PASS' if rep.passed else 'FAIL'}")
    for f in rep.failures[:3]:
        say(f"  {name}: {f}")
    return 0 if rep.passed else 1


def _refused(name, engine, say) -> int:
    """On a GPU TensorRT for RTX does not run on, the runner must refuse the engine in one line."""
    from norcal.core.errors import NorcalError
    from norcal.runtime.backends.tensorrt.runner import TensorRTRunner

    try:
        TensorRTRunner(engine)
    except NorcalError as e:
        say(f"RTX engine: {name}: the runner refuses it: {e}")
        return 0
    say(f"RTX engine: {name}: FAIL: the runner opened an RTX engine on a GPU TensorRT for RTX does not run on")
    return 1


def rtx_step(device: str = "cuda", say=print) -> int:
    """Build the RTX graphs' engines where TensorRT for RTX is installed and run them where the GPU
    is RTX-class; the number of failures (a GPU it cannot run on is none: it is said)."""
    from norcal.core.errors import NorcalError
    from norcal.core.tensorrt_targets import LIBRARIES, RTX_CAPABILITIES

    capability, gpu = _gpu(device)
    runs = capability in RTX_CAPABILITIES
    why_not = (gpu if capability is None else
               f"{gpu} is compute capability {capability}; {RTX_RUNS_ON}")
    try:
        LIBRARIES["rtx"].load()
    except NorcalError as e:
        say(f"RTX engine: built nothing: {e}")
        say(f"RTX engine: not run: {why_not}" if not runs else
            f"RTX engine: not run on {gpu} (compute capability {capability}, which TensorRT for RTX runs on): "
            "its runtime is that package, which is not installed here")
        return 0
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, ranges, feeds in _graphs(Path(tmp), say):
            engine, bad = _build(name, path, ranges, capability, say)
            failed += bad
            if engine is None:
                continue
            if not runs:
                say(f"RTX engine: {name}: not run: {why_not}")
                failed += _refused(name, engine, say) if capability is not None else 0
                continue
            try:
                failed += _run(name, path, engine, feeds, say)
            except NorcalError as e:
                say(f"RTX engine: {name}: run FAILED: {e}")
                failed += 1
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="torch device whose GPU runs the engines (default cuda)")
    args = ap.parse_args()
    failed = rtx_step(args.device)
    print(f"RTX engine step: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
