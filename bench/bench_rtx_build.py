"""Benchmark: ``norcal build --target rtx`` (the library function ``norcal.build_engine``, in this
process) on an Ultralytics RT-DETR, the plain export against the export with the NorCal node.

The checkpoint is Ultralytics' own RT-DETR-L (its packaged ``rtdetr-l.yaml``: HGNetv2 backbone,
AIFI, RepC3, a 6-layer RTDETRDecoder with 300 queries; ~32 M parameters) built with random
weights (no download, YOLO_OFFLINE=1) and saved by Ultralytics' ``model.save``, then exported by
norcal at its 640x640 input with a NorCal node (gamma 0.5) and the same graph stripped of it
again (``strip_norcal``), so the two graphs differ only by the node. Each is built for TensorRT
for RTX ahead of time (no GPU needed; the default compute capabilities 8.0 8.6 8.9 12.0 12.1,
batch 1:1:2), after one untimed warm-up build, interleaved A B B A over ``--rounds`` pairs, and the median seconds of each, their
ratio (what the node costs the build) and the engine sizes are printed. ``--tiny`` uses the
tests' tiny RT-DETR (tests/yolo_models.py) at 128x128 instead: a quick run of the same path.

    .venv/bin/python bench/bench_rtx_build.py                 # RT-DETR-L, 80 classes, 1 round
    .venv/bin/python bench/bench_rtx_build.py --classes 1203  # LVIS's class count
    .venv/bin/python bench/bench_rtx_build.py --tiny --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))


def rtdetr_l_checkpoint(path: Path, nc: int, imgsz: int = 640) -> Path:
    """Ultralytics' RT-DETR-L from its packaged yaml with ``nc`` classes, random weights, saved
    as a trainer would save it (``model.save``), recording ``imgsz`` as its trained size."""
    import torch
    import ultralytics
    from ultralytics import RTDETR

    yaml = Path(ultralytics.__file__).parent / "cfg" / "models" / "rt-detr" / "rtdetr-l.yaml"
    own = path.with_name(f"rtdetr-l-{nc}.yaml")
    own.write_text(yaml.read_text().replace("nc: 80 ", f"nc: {nc} ", 1))
    torch.manual_seed(0)
    rt = RTDETR(str(own))
    model = rt.model.eval()
    model.names = {i: f"class{i}" for i in range(nc)}
    model.args = {"imgsz": int(imgsz)}
    rt.save(str(path))
    return path


def export_pair(folder: Path, tiny: bool, nc: int) -> dict[str, Path]:
    """The NorCal export of the checkpoint ("node") and the same graph without the node ("plain")."""
    import onnx

    from norcal.export.graph.surgery import strip_norcal
    from norcal.workflows.export_job import NorCal, export_checkpoint

    from yolo_models import make_rtdetr_checkpoint, write_table

    ckpt = (make_rtdetr_checkpoint(folder / "rtdetr.pt", nc=nc) if tiny
            else rtdetr_l_checkpoint(folder / "rtdetr.pt", nc))
    table, _ = write_table(folder / "table.json", nc)
    node = folder / "node.onnx"
    t0 = time.perf_counter()
    export_checkpoint(ckpt, node, NorCal(gamma=0.5, table=str(table)))
    print(f"exported {ckpt.name} ({nc} classes) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    plain = folder / "plain.onnx"
    onnx.save(strip_norcal(onnx.load(node)), plain)
    return {"plain": plain, "node": node}


def build(onnx_path: Path, engine: Path) -> float:
    """Seconds ``norcal.build_engine`` takes for the rtx target (the check included, as the CLI runs it)."""
    from norcal import BuildOptions, build_engine

    t0 = time.perf_counter()
    side = build_engine(BuildOptions(onnx_path, engine, target="rtx", batch=(1, 1, 2)))
    seconds = time.perf_counter() - t0
    assert side["library"] == "TensorRT for RTX" and engine.stat().st_size > 0
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny RT-DETR at 128x128 (quick)")
    ap.add_argument("--classes", type=int, default=80, help="class count (default 80; 1203 is LVIS's)")
    ap.add_argument("--rounds", type=int, default=1, help="A B B A pairs of builds (default 1)")
    args = ap.parse_args()

    import tensorrt_rtx_bindings as trt
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = export_pair(folder, args.tiny, args.classes)
        times: dict[str, list[float]] = {"plain": [], "node": []}
        sizes: dict[str, int] = {}
        warm = build(models["plain"], folder / "warm.engine")  # the library's first build loads its kernels
        print(f"warm-up (untimed): plain {warm:.1f} s", file=sys.stderr)
        for r in range(args.rounds):
            for tag in ("plain", "node", "node", "plain"):
                engine = folder / f"{tag}.engine"
                times[tag].append(build(models[tag], engine))
                sizes[tag] = engine.stat().st_size
                print(f"round {r + 1}: {tag} {times[tag][-1]:.1f} s", file=sys.stderr)
        onnx_mb = {t: p.stat().st_size / 2 ** 20 for t, p in models.items()}
    med = {t: statistics.median(v) for t, v in times.items()}
    print(f"TensorRT for RTX {trt.__version__}, torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs; "
          f"{'tiny RT-DETR 128x128' if args.tiny else 'RT-DETR-L 640x640'}, {args.classes} classes, "
          f"{2 * args.rounds} builds each")
    for tag in ("plain", "node"):
        runs = " ".join(f"{s:.1f}" for s in times[tag])
        print(f"  {tag:5s}: median {med[tag]:.1f} s (runs {runs}); ONNX {onnx_mb[tag]:.1f} MiB, "
              f"engine {sizes[tag] / 2 ** 20:.1f} MiB")
    print(f"  node / plain build time: {med['node'] / med['plain']:.3f}; engine size "
          f"{sizes['node'] / sizes['plain']:.4f} ({sizes['node'] - sizes['plain']:+d} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
