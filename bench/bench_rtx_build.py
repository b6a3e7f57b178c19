"""Benchmark: ``norcal build --target rtx`` (the library function ``norcal.build_engine``, in this
process) on an Ultralytics detector, the plain export against the export with the NorCal node.

``--model`` picks the checkpoint, each built from Ultralytics' packaged yaml with random weights
(no download, YOLO_OFFLINE=1) and ``--classes`` classes, saved by Ultralytics' ``model.save``:

- ``rtdetr-l`` (default): RT-DETR-L (``rtdetr-l.yaml``: HGNetv2 backbone, AIFI, RepC3, a 6-layer
  RTDETRDecoder with 300 queries; ~32 M parameters), exported with its own decoding (fixed-K
  outputs);
- ``yolo11n`` / ``yolo11n-seg``: ``YOLO("yolo11n.yaml")`` / ``YOLO("yolo11n-seg.yaml")`` (another
  class count: the yaml read by ``yaml_model_load`` with its nc set, the model built from that
  dict), exported as ``norcal-export --nms host`` does (``Decoding(nms="host")``: the graph ends
  at the candidates, no NonMaxSuppression).

norcal loads the checkpoint (``load_detector``) and exports it at its 640x640 input ("plain"), and
``calibrate_onnx`` adds a NorCal node (gamma 0.5, a counts table for the class count) to that graph
("node"), so the two differ only by the node. A line shows the plain and node graphs behave as
detectors (ONNX Runtime on one random image: the outputs' shapes, the scores above the detector's
threshold and the highest; the node counts). A random-init YOLO scores ~1e-4 at most (Ultralytics'
``bias_init`` starts the class logits at log(5 / nc / (640 / stride)^2)), below its 0.001
threshold: there the candidates' shapes show the head. Each graph is built for TensorRT for RTX
ahead of time (no GPU needed; the default compute capabilities 8.0 8.6 8.9 12.0 12.1, batch 1:1:2),
after one untimed warm-up build, interleaved A B B A over ``--rounds`` pairs, and the median
seconds of each, their ratio (what the node costs the build) and the engine sizes are printed.
``--tiny`` uses the tests' tiny RT-DETR (tests/yolo_models.py) at 128x128 instead: a quick run of
the same path (rtdetr-l only).

    .venv/bin/python bench/bench_rtx_build.py                 # RT-DETR-L, 80 classes, 1 round
    .venv/bin/python bench/bench_rtx_build.py --classes 1203  # LVIS's class count
    .venv/bin/python bench/bench_rtx_build.py --model yolo11n-seg --rounds 3
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


MODELS = {"rtdetr-l": "RT-DETR-L", "yolo11n": "YOLO11n", "yolo11n-seg": "YOLO11n-seg"}  # --model: its name
IMGSZ = 640
GAMMA = 0.5


def _as_trained(model, nc: int, imgsz: int):
    """``model`` named and sized as a trainer leaves it: class names, ``imgsz`` as its trained size."""
    model.names = {i: f"class{i}" for i in range(nc)}
    model.args = {"imgsz": int(imgsz)}
    return model


def rtdetr_l_checkpoint(path: Path, nc: int, imgsz: int = IMGSZ) -> Path:
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
    _as_trained(rt.model.eval(), nc, imgsz)
    rt.save(str(path))
    return path


def yolo_checkpoint(path: Path, name: str, nc: int, imgsz: int = IMGSZ) -> Path:
    """``YOLO(f"{name}.yaml")`` with random weights; for another class count than the yaml's, its
    network rebuilt (the same class: DetectionModel, SegmentationModel) from the yaml's dict with
    ``nc`` set. Saved by ``model.save``, recording ``imgsz`` as its trained size."""
    import torch
    from ultralytics import YOLO
    from ultralytics.nn.tasks import yaml_model_load

    torch.manual_seed(0)
    yolo = YOLO(f"{name}.yaml")
    if yolo.model.yaml["nc"] != nc:
        cfg = {**yaml_model_load(f"{name}.yaml"), "nc": nc}
        torch.manual_seed(0)
        rebuilt = type(yolo.model)(cfg, verbose=False)
        rebuilt.task = yolo.model.task
        yolo.model = rebuilt
    _as_trained(yolo.model.eval(), nc, imgsz)
    yolo.save(str(path))
    return path


def checkpoint(folder: Path, model: str, tiny: bool, nc: int) -> Path:
    """The ``--model`` checkpoint with ``nc`` classes, saved in ``folder``."""
    from yolo_models import make_rtdetr_checkpoint

    path = folder / f"{'tiny-rtdetr' if tiny else model}.pt"
    if tiny:
        return make_rtdetr_checkpoint(path, nc=nc)
    if model == "rtdetr-l":
        return rtdetr_l_checkpoint(path, nc)
    return yolo_checkpoint(path, model, nc)


def decoding(model: str):
    """How the export decodes: YOLO as ``norcal-export --nms host``, RT-DETR its own (None)."""
    from norcal.core.decoding import Decoding

    return Decoding(nms="host") if model.startswith("yolo") else None


def input_side(graph) -> int:
    """The side of the graph's square ``images`` input."""
    (images,) = [i for i in graph.graph.input if i.name == "images"]
    return images.type.tensor_type.shape.dim[-1].dim_value


def random_run(graph) -> dict:
    """ONNX Runtime's outputs of ``graph`` on one seeded random image of its input size."""
    import numpy as np
    import onnxruntime as ort

    size = input_side(graph)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(0).uniform(0, 255, (1, 3, size, size)).astype(np.float32)
    feed = {"images": image, "image_sizes": np.array([[size, size]], np.int64)}
    outs = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})
    return {o.name: v for o, v in zip(session.get_outputs(), outs)}


def detector_line(det, graphs: dict) -> str:
    """What shows each graph is a detector's: its outputs' shapes on a random image, the scores
    above the detector's threshold (and the highest), and its node count."""
    thresh = det.settings()["score_thresh_test"]
    parts, shapes = [], ""
    for tag, graph in graphs.items():
        outs = random_run(graph)
        scores = next(v for n, v in outs.items() if n.endswith("scores"))
        shapes = ", ".join(f"{n} {list(v.shape)}" for n, v in outs.items())
        parts.append(f"{tag} {int((scores > thresh).sum())} above conf {thresh:g} (max {scores.max():.3g}), "
                     f"{len(graph.graph.node)} nodes")
    return f"  random image: {shapes}; " + "; ".join(parts)


def export_pair(folder: Path, model: str, tiny: bool, nc: int) -> tuple[dict[str, Path], str, str]:
    """The checkpoint's plain export ("plain") and the same graph with the NorCal node ("node"),
    written in ``folder``; a title and the :func:`detector_line` for the printout."""
    import onnx

    from norcal.export.families import load_detector
    from norcal.workflows.export_job import CheckpointExport, NorCal, calibrate_onnx

    from yolo_models import write_table

    ckpt = checkpoint(folder, model, tiny, nc)
    table, _ = write_table(folder / "table.json", nc)
    t0 = time.perf_counter()
    rule = decoding(model)
    det = load_detector(ckpt, decoding=rule)
    graphs = {"plain": det.export(det.export_options(CheckpointExport(decoding=rule)))}
    graphs["node"] = calibrate_onnx(graphs["plain"], NorCal(gamma=GAMMA, table=str(table)))
    print(f"exported {ckpt.name} ({nc} classes) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    paths = {tag: folder / f"{tag}.onnx" for tag in graphs}
    for tag, graph in graphs.items():
        onnx.save(graph, paths[tag])
    label = "tiny RT-DETR" if tiny else MODELS[model]
    host = ", host NMS (candidates out)" if rule else ""
    side = input_side(graphs["plain"])
    return paths, f"{label} {side}x{side}{host}", detector_line(det, graphs)


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
    ap.add_argument("--model", choices=MODELS, default="rtdetr-l", help="the checkpoint (default rtdetr-l)")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny RT-DETR at 128x128 (quick; rtdetr-l only)")
    ap.add_argument("--classes", type=int, default=80, help="class count (default 80; 1203 is LVIS's)")
    ap.add_argument("--rounds", type=int, default=1, help="A B B A pairs of builds (default 1)")
    args = ap.parse_args()
    if args.tiny and args.model != "rtdetr-l":
        ap.error("--tiny is the tests' tiny RT-DETR: it takes --model rtdetr-l")

    import tensorrt_rtx_bindings as trt
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models, title, detector = export_pair(folder, args.model, args.tiny, args.classes)
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
          f"{title}, {args.classes} classes, {2 * args.rounds} builds each")
    print(detector)
    for tag in ("plain", "node"):
        runs = " ".join(f"{s:.1f}" for s in times[tag])
        print(f"  {tag:5s}: median {med[tag]:.1f} s (runs {runs}); ONNX {onnx_mb[tag]:.1f} MiB, "
              f"engine {sizes[tag] / 2 ** 20:.1f} MiB")
    print(f"  node / plain build time: {med['node'] / med['plain']:.3f}; engine size "
          f"{sizes['node'] / sizes['plain']:.4f} ({sizes['node'] - sizes['plain']:+d} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
