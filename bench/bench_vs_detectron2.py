"""Our deployed graph against detectron2's own ONNX export of the same weights, side by side.

Two models, one image (img0 of tests/fixtures/d2_lvis_tiny resized to 800x1216), batch 1, ONNX
Runtime on the CPU, every graph in one process, runs interleaved, the median of ``--repeats``:

- default: the fixture d2_lvis_tiny (LVIS v1 R50-FPN Mask R-CNN topology, reduced width) and
  ``detectron2_export_800x1216.onnx``, detectron2's TracingAdapter export of it. Its random
  weights score every class ~1e-3, so the config's 1e-4 threshold would pass 1.2M (box, class)
  pairs (detectron2's one NMS over them takes minutes): ``--many-thresh`` (0.02: 300 detections)
  and ``--few-thresh`` (0.4: a handful) are written into both graphs.
- ``--full-size``: detectron2's full-width LVIS R50-FPN (64-channel stem, 256 FPN, 1024 fc,
  1203 classes) built with our modeling code, weights conditioned like a trained model
  (bench/full_size_model.py: the RPN gives 1000 proposals, a peaked classifier; 300 detections
  at the config's 1e-4; the few regime raises the background bias, ``--background-bias``).
  detectron2's graphs of the same weights: where given, its own exports (``--detectron2-onnx
  MANY FEW``: write the checkpoints with ``python bench/full_size_model.py DIR`` and export
  DIR/many, DIR/few with detectron2's TracingAdapter at 800x1216); otherwise detectron2's
  traced graph of the fixture widened to these weights (bench/widen_detectron2_graph.py: the
  same graph, full-width initializers, FrozenBN folded, pooler widths rewritten).

Our graphs: the default export (dynamic batch and size, padding masks always on), the same
with the padding switch (``padding_switch=True``: the backbone without masks where no image
needs them), and the ``--batch 1`` export (no padding masks). Each row prints the proposals the RPN kept (read from the graph itself) and the
detections, and how many of detectron2's detections it matches (same class, IoU >= 0.99,
score within 1e-3; unpaired ones are listed). Target: our default / detectron2 <= 0.8 in both regimes. ``--profile`` adds each
graph's time per op type (ONNX Runtime profiling).

    python bench/bench_vs_detectron2.py [--full-size] [--detectron2-onnx MANY FEW]
        [--threads 2] [--repeats 7] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from rich.console import Console
from rich.table import Table

from norcal.export.rcnn.export import export_detector
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import model_from_state

from widen_detectron2_graph import compare_detections, widen  # noqa: E402
from full_size_model import FIXTURE, H, W, full_size_spec, image_800x1216, trained_like  # noqa: E402

D2_ONNX = FIXTURE / "detectron2_export_800x1216.onnx"
TARGET = 0.8
DEFAULT = "ours default"
FORMS = {DEFAULT: {}, "ours, padding switch (opt-in)": {"padding_switch": True},
         "ours --batch 1": {"batch": 1}}


def d2_with_threshold(model: onnx.ModelProto, thresh: float | None) -> onnx.ModelProto:
    """detectron2's graph with its box score threshold (the ROI heads' one Greater against
    SCORE_THRESH_TEST) set to ``thresh`` (None: as exported)."""
    if thresh is None:
        return model
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    hits = [consts[n.input[1]] for n in model.graph.node
            if n.op_type == "Greater" and n.name.startswith("/roi_heads/") and n.input[1] in consts]
    if len(hits) != 1:
        raise SystemExit(f"expected one score threshold in detectron2's ROI heads, found {len(hits)}")
    hits[0].attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(thresh, np.float32)))
    return model


def session(model: onnx.ModelProto, threads: int, profile_dir: str | None = None, arena: bool = True):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_cpu_mem_arena = arena
    if profile_dir:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "ort")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def proposals(model: onnx.ModelProto, feeds: dict, threads: int) -> int:
    """Proposals the RPN hands to the ROI heads, read from the graph (:func:`proposal_outputs`)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    cross = proposal_outputs(probe)
    return count_proposals(session(probe, threads).run(cross, feeds))


def proposal_outputs(model: onnx.ModelProto) -> list[str]:
    """Makes the tensors made under /proposal_generator/ and read under /roi_heads/ outputs of
    ``model`` (in place) and returns their names; :func:`count_proposals` reads them."""
    made = {o: n.name for n in model.graph.node for o in n.output}
    cross = sorted({i for n in model.graph.node if n.name.startswith("/roi_heads/")
                    for i in n.input if made.get(i, "").startswith("/proposal_generator/")})
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(c) for c in cross)
    return cross


def count_proposals(values: list) -> int:
    """The proposals in :func:`proposal_outputs`' values: ours has a validity mask [B, P]
    (counted), detectron2's the boxes [N, 4] (N)."""
    flags = [v for v in values if v.dtype == bool]
    if flags:
        return int(flags[0].sum())
    boxes = [v for v in values if v.ndim == 2 and v.shape[-1] == 4]
    return int(boxes[0].shape[0]) if boxes else -1


def time_all(runs: dict, repeats: int, warm_up: bool = True) -> dict[str, float]:
    """Median seconds of each callable, runs interleaved so load on the machine hits all."""
    for run in runs.values() if warm_up else ():
        run()
    times = {k: [] for k in runs}
    for _ in range(repeats):
        for k, run in runs.items():
            start = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(t) for k, t in times.items()}


def op_profile(model: onnx.ModelProto, feeds: dict, threads: int, runs: int = 3) -> collections.Counter:
    """Seconds per op type per run, from ONNX Runtime's profiler, after two warm-up runs (a
    session's first runs allocate: detectron2's took 2-6x its steady time)."""
    warm = 2
    with tempfile.TemporaryDirectory() as tmp:
        sess = session(model, threads, tmp)
        for _ in range(warm + runs):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    model_runs = sorted((e["ts"], e["dur"]) for e in events
                        if e.get("cat") == "Session" and e.get("name") == "model_run")
    counted_from = model_runs[warm - 1][0] + model_runs[warm - 1][1]
    per_op: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= counted_from:
            per_op[e["args"]["op_name"]] += e["dur"] / 1e6 / runs
    return per_op


@dataclasses.dataclass
class Regime:
    name: str
    model: torch.nn.Module  # ours, in PyTorch
    spec: object
    d2: onnx.ModelProto | None
    note: str


def tiny_regimes(args) -> list[Regime]:
    spec, state = load_detector_spec(FIXTURE / "model_final.pth", FIXTURE / "config.yaml")
    d2 = onnx.load(D2_ONNX)
    out = []
    for name, thresh in (("many", args.many_thresh), ("few", args.few_thresh)):
        s = dataclasses.replace(spec, score_thresh_test=thresh)
        m2 = onnx.ModelProto()
        m2.CopyFrom(d2)
        out.append(Regime(name, model_from_state(s, state).eval(), s, d2_with_threshold(m2, thresh),
                          f"d2_lvis_tiny, threshold {thresh}"))
    return out


def full_size_regimes(args, console) -> list[Regime]:
    spec = full_size_spec()
    with console.status("conditioning the full-size weights on the image (PyTorch)"):
        cond = trained_like(spec, image_800x1216(), background_bias=args.background_bias)
    console.print(f"full-size weights: PyTorch RPN proposals {cond.proposals}; (box, class) pairs "
                  f"above {spec.score_thresh_test}: {cond.candidates_many} (many), "
                  f"{cond.candidates_few} (few, background bias {cond.background_bias:.2f})")
    if args.detectron2_onnx:
        d2 = [onnx.load(p) for p in args.detectron2_onnx]
        console.print(f"detectron2's graphs: {', '.join(map(str, args.detectron2_onnx))}")
    else:
        tiny = onnx.load(D2_ONNX)
        d2 = [widen(tiny, getattr(cond, name)) for name in ("many", "few")]
        console.print("detectron2's graphs: none given, so detectron2's traced graph of d2_lvis_tiny "
                      "widened to these weights (bench/widen_detectron2_graph.py)")
    return [Regime(name, model_from_state(spec, getattr(cond, name)).eval(), spec, g,
                   f"full-size, threshold {spec.score_thresh_test}")
            for name, g in zip(("many", "few"), d2)]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full-size", action="store_true", help="the full-width LVIS R50-FPN")
    p.add_argument("--detectron2-onnx", nargs=2, metavar=("MANY", "FEW"), type=Path,
                   help="full size: detectron2's export of each regime's checkpoint")
    p.add_argument("--background-bias", type=float, help="full size, few regime (default: searched)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for every graph")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per graph (the median counts)")
    p.add_argument("--many-thresh", type=float, default=0.02, help="fixture model only")
    p.add_argument("--few-thresh", type=float, default=0.4, help="fixture model only")
    p.add_argument("--profile", action="store_true", help="print time per op type")
    p.add_argument("--regimes", nargs="+", choices=("many", "few"), default=["many", "few"])
    p.add_argument("--forms", nargs="+", choices=tuple(FORMS), default=list(FORMS),
                   help=f"our graphs to time ({DEFAULT!r} and 'ours --batch 1' are always in)")
    args = p.parse_args(argv)
    args.forms = [f for f in FORMS if f in args.forms or f in (DEFAULT, "ours --batch 1")]
    if args.detectron2_onnx and not args.full_size:
        p.error("--detectron2-onnx goes with --full-size (the fixture's graph is built in)")
    console = Console(width=160)  # the table's columns, also when written to a log
    torch.set_num_threads(args.threads)
    console.print(f"start: {uptime()}")
    img = image_800x1216()
    our_feeds = {"images": img[None], "image_sizes": np.array([[H, W]], np.int64)}
    regimes = full_size_regimes(args, console) if args.full_size else tiny_regimes(args)
    title = "full-size LVIS R50-FPN" if args.full_size else "d2_lvis_tiny"
    table = Table(title=f"{title}, 1 image 800x1216, batch 1, {args.threads} threads, ORT CPU, "
                        f"median of {args.repeats}")
    for col in ("regime", "graph", "proposals", "detections", "= detectron2's", "median s",
                "/ detectron2", "/ ours --batch 1", "load (1 min)"):
        table.add_column(col, justify="right")
    profiles = []
    for r in regimes:
        if r.name not in args.regimes:
            continue
        graphs = {}
        with console.status(f"{r.name}: exporting our graphs"):
            for label in args.forms:
                graphs[label] = export_detector(r.model, r.spec, **FORMS[label])
        if r.d2 is not None:
            graphs["detectron2"] = r.d2
        with console.status(f"{r.name}: sessions, proposals, detections"):
            sessions = {k: session(g, args.threads) for k, g in graphs.items()}
            d2_feeds = ({r.d2.graph.input[0].name: img} if r.d2 is not None else None)
            feeds = {k: d2_feeds if k == "detectron2" else our_feeds for k in graphs}
            props = {k: proposals(g, feeds[k], args.threads) for k, g in graphs.items()}
            outs = {k: s.run(None, feeds[k]) for k, s in sessions.items()}
            dets = {k: int(o[0].shape[0]) if k == "detectron2" else int(o[0][0]) for k, o in outs.items()}
            same = {k: compare_detections(outs["detectron2"], o) for k, o in outs.items()
                    if k != "detectron2" and "detectron2" in outs}
            outs = None
        with console.status(f"{r.name}: timing"):
            med = time_all({k: (lambda s=s, f=feeds[k]: s.run(None, f)) for k, s in sessions.items()},
                           args.repeats)
        load = os.getloadavg()[0]
        if not args.profile:  # the sessions hold what they need: the full-size protos are large
            graphs = {k: None for k in graphs}
            gc.collect()
        for k in graphs:
            vs_d2 = f"{med[k] / med['detectron2']:.2f}" if "detectron2" in med else "-"
            if k == DEFAULT and "detectron2" in med:
                vs_d2 += " ok" if med[k] / med["detectron2"] <= TARGET else f" MISSED (<= {TARGET})"
            match = f"{same[k]['matched']}/{same[k]['detectron2']}" if k in same else "-"
            table.add_row(r.name, k, str(props[k]), str(dets[k]), match, f"{med[k]:.3f}", vs_d2,
                          f"{med[k] / med['ours --batch 1']:.2f}", f"{load:.2f}")
        for k, c in same.items():
            if c["unpaired"]:
                console.print(f"{r.name}, {k}: detectron2's detections not paired (score, best "
                              f"same-class IoU with ours): {c['unpaired']}")
        if args.profile:
            with console.status(f"{r.name}: profiling"):
                profiles.append((r.name, {k: op_profile(g, feeds[k], args.threads)
                                          for k, g in graphs.items()}))
    console.print(table)
    for regime, per_graph in profiles:
        prof = Table(title=f"{regime} detections: seconds per run by op type (ORT profiler)")
        prof.add_column("op type", justify="right")
        for k in per_graph:
            prof.add_column(k, justify="right")
        ops = set().union(*per_graph.values())
        for op in sorted(ops, key=lambda o: -max(p[o] for p in per_graph.values()))[:16]:
            prof.add_row(op, *(f"{p[op]:.4f}" for p in per_graph.values()))
        prof.add_row("total", *(f"{sum(p.values()):.4f}" for p in per_graph.values()))
        console.print(prof)
    console.print(f"end: {uptime()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
