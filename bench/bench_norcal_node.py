"""Benchmark: the NorCal node's share of ONNX Runtime latency (target <= 1%).

One detector is exported once; NorCal is inserted (graph.calibrate.calibrate_graph) and the same graph
is stripped of it again (export.surgery.strip_norcal), so the two models differ only by the
node (Sub + Softmax in place of Softmax). Both run on the same inputs, interleaved A B B A in
one process, on this machine; the ratio of median latencies and the median of per-round ratios
are printed, plus the node's own time from ONNX Runtime's profiler (the most direct number:
end-to-end differences of 1% sit inside a shared machine's noise).

Two settings:
  gamma 0    -- log prior all zero: the scores, and so everything after the classifier (NMS,
                top-K, masks), are identical with and without the node: the node's cost alone;
  gamma 0.5  -- the product setting: NorCal re-ranks scores, which also changes how many
                candidates pass the 1e-4 threshold into NMS (a downstream effect, not the node).

Models: the d2_lvis_tiny checkpoint at its own size (320/512), and with --full a randomly
initialised full-size LVIS Mask R-CNN R50-FPN (1203 classes) at 800x1333.

  /work/venv/bin/python bench/bench_norcal_node.py                  # tiny, 20 rounds
  /work/venv/bin/python bench/bench_norcal_node.py --full --rounds 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from norcal.core.contract import Preprocessing
from norcal.core import contract

ROOT = Path(__file__).resolve().parents[1]
from fixture_files import fixture_dir  # noqa: E402
FIXTURE = fixture_dir("d2_lvis_tiny")


def export_models(out: Path, full: bool, gammas: list[float]) -> tuple[dict[str, Path], object]:
    """Export once; write '<gamma>/with' and '<gamma>/without' model files. Returns (paths, spec)."""
    import onnx

    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model
    from norcal.export.graph.surgery import strip_norcal

    if full:
        from norcal.export.rcnn.modeling.build import model_from_state, random_state_dict
        from norcal.export.rcnn.spec import ModelSpec

        spec = ModelSpec()  # detectron2's LVIS Mask R-CNN R50-FPN: 1203 classes, 800/1333
        model = model_from_state(spec, random_state_dict(spec, seed=0)).eval()
    else:
        spec, model = load_model(FIXTURE / "model_final.pth", FIXTURE / "config.yaml")
    t0 = time.perf_counter()
    graph = export_detector(model, spec)
    print(f"exported in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    paths = {}
    for g in gammas:
        with_node = calibrate_graph(graph, g)
        without = strip_norcal(with_node)  # the same graph, node removed
        for tag, m in (("with", with_node), ("without", without)):
            p = out / f"g{g}_{tag}.onnx"
            onnx.save(m, str(p))
            paths[f"{g}/{tag}"] = p
    return paths, spec


def inputs(spec, full: bool):
    """One image batch at the model's own test size (fixture image, or a synthetic 800x1333)."""
    from norcal.runtime.images import read_rgb
    from norcal.workflows.parity import synthetic_images
    from norcal.runtime.preprocess import prepare_batch

    if full:
        img = synthetic_images(5)[4]  # 427x640 -> 800x1199, padded 800x1216
        img = np.asarray(img)
    else:
        img = read_rgb(FIXTURE / "images" / "img1.png")  # 333x500 -> 320x480
    return prepare_batch([img], Preprocessing(spec.min_size_test, spec.max_size_test)).feeds()


def session(path: Path, threads: int, profile: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(path.with_suffix(""))
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def interleaved(a, b, feeds, rounds: int) -> tuple[list[float], list[float]]:
    """Latencies (s) of sessions a and b, run A B B A each round so drift hits both alike."""
    ta, tb = [], []
    for r in range(rounds):
        order = (a, b, b, a) if r % 2 == 0 else (b, a, a, b)
        for s in order:
            t0 = time.perf_counter()
            s.run(None, feeds)
            (ta if s is a else tb).append(time.perf_counter() - t0)
    return ta, tb


def profile(path: Path, feeds, threads: int, runs: int = 3) -> dict[str, float]:
    """Kernel time per node (microseconds per run) from ONNX Runtime's profiler."""
    s = session(path, threads, profile=True)
    s.run(None, feeds)  # warm-up, not counted
    Path(s.end_profiling()).unlink(missing_ok=True)
    s = session(path, threads, profile=True)
    for _ in range(runs):
        s.run(None, feeds)
    prof = Path(s.end_profiling())
    events = json.loads(prof.read_text())
    prof.unlink(missing_ok=True)
    times: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            times[name] = times.get(name, 0.0) + e["dur"] / runs
    return times


def node_cost(with_path: Path, without_path: Path, feeds, threads: int):
    """(node us, plain Softmax us, total us of the model with the node, the node's names, the
    node whose time grew most otherwise, its growth us) from the profiler.

    ONNX Runtime inlines the model-local function: its nodes are named '_inlfunc_NorCal_*'
    (inline mode: 'norcal/*'). The stripped model's classifier Softmax keeps the name the
    metadata recorded (norcal.node)."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(with_path), load_external_data=False).metadata_props}
    softmax_name = meta.get(contract.NODE, "")
    w = profile(with_path, feeds, threads)
    wo = profile(without_path, feeds, threads)
    names = sorted(n for n in w if "norcal" in n.lower())
    node = sum(w[n] for n in names)
    plain = wo.get(softmax_name, 0.0)
    others = [(w[n] - wo[n], n) for n in w if n in wo and n != softmax_name]
    grew, grew_name = max(others) if others else (0.0, "-")
    return node, plain, sum(w.values()), names, grew_name, grew


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="full-size random LVIS R50-FPN at 800x1333")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds (4 runs each)")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    ap.add_argument("--gammas", default="0,0.5", help="NorCal gammas to measure (default 0,0.5)")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    gammas = [float(g) for g in args.gammas.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        paths, spec = export_models(Path(tmp), args.full, gammas)
        feeds = inputs(spec, args.full)
        shape = "x".join(map(str, feeds["images"].shape))
        title = (f"NorCal node share of ONNX Runtime CPU latency: "
                 f"{'full-size random LVIS R50-FPN' if args.full else 'd2_lvis_tiny'}, input {shape}, "
                 f"{args.threads} thread(s), {args.rounds} interleaved rounds")
        t = Table(title=title)
        for col in ("gamma", "without ms", "with ms", "ratio of medians", "median paired ratio",
                    "node ms", "node share", "added share"):
            t.add_column(col, justify="right")
        notes = []
        for g in gammas:
            a, b = session(paths[f"{g}/with"], args.threads), session(paths[f"{g}/without"], args.threads)
            for s in (a, b):
                s.run(None, feeds)  # warm-up
            print(f"gamma {g:g}: {args.rounds} rounds of 4 runs ...", file=sys.stderr)
            ta, tb = interleaved(a, b, feeds, args.rounds)
            ma, mb = statistics.median(ta), statistics.median(tb)
            pairs = [x / y for x, y in zip(ta, tb)]
            node, plain, total, names, grew_name, grew = node_cost(paths[f"{g}/with"], paths[f"{g}/without"],
                                                                   feeds, args.threads)
            t.add_row(f"{g:g}", f"{mb * 1e3:.1f}", f"{ma * 1e3:.1f}", f"{ma / mb:.4f}",
                      f"{statistics.median(pairs):.4f}", f"{node / 1e3:.3f}",
                      f"{node / total:.3%}" if total else "-", f"{(node - plain) / total:.3%}" if total else "-")
            notes.append(f"gamma {g:g}: the node is {', '.join(names) or 'not found by the profiler'}; "
                         f"largest other change: {grew_name} {grew / 1e3:+.1f} ms")
        Console().print(t)
        for n in notes:
            print(n)
    print("ratio = with / without latency (1.01: the node costs 1%); node share = the NorCal node's kernel "
          "time (Sub + Softmax) / all kernel time; added share = the same minus the plain Softmax it "
          "replaces (ONNX Runtime profiler, same session settings).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
