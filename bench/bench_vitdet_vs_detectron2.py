"""Our export of a full-size ViTDet-B LVIS Mask R-CNN against detectron2's own ONNX export of it
(TracingAdapter), one process: export seconds, ONNX Runtime latency, ratios ours / detectron2.

The model is detectron2's ``projects/ViTDet/configs/LVIS/mask_rcnn_vitdet_b_100ep.py`` as
published (ViT-B: 768 wide, 12 blocks, 12 heads, 1024 square; SimpleFeaturePyramid; LN heads;
1203 classes, sigmoid classifier, score threshold 0.02, 300 detections), instantiated by the
real detectron2. Its random initialisation is a poor stand-in for speed (every (box, class)
pair scores ~0.5, so detectron2's one NMS takes minutes on 1.2M pairs), so the heads are
conditioned on the image through detectron2's own model, as bench/full_size_model.py does for
the R50: RPN objectness logits to std 1 and anchor deltas to std 0.05 (the RPN keeps its 1000
proposals), the classifier peaked (foreground logits std ``--sigma``, one bias putting about
``--candidates`` pairs above 0.02: 300 detections after NMS), box deltas std 0.1; the ViT's
relative positions random (std 0.02) rather than detectron2's zeros. The checkpoint and
detectron2's ``LazyConfig.save`` config.yaml go to a temporary folder.

- detectron2: ``LazyConfig.load`` of the source tree's .py config (detectron2 cannot load back
  the config.yaml it saved for this config: the federated loss's class weights, a lambda, are
  written as ``!!python/name:None.<lambda>``) + ``instantiate`` + ``DetectionCheckpointer`` +
  TracingAdapter over ``model.inference(..., do_postprocess=False)`` + ``torch.onnx.export``
  (TorchScript exporter, opset 17), traced at the one image below (its graph is fixed to it);
- ours: ``export_checkpoint`` (the CLI's library call: load, export, NorCal node at gamma 0,
  TensorRT-parser check, write) from the checkpoint and that config.yaml.

One image: img0 of tests/fixtures/d2_lvis_tiny resized by the config's ResizeShortestEdge(1024,
1024) (detectron2's transform). ONNX Runtime on the CPU, batch 1, ``--threads`` intra-op threads;
exports (``--export-repeats``) and runs (``--repeats``) interleaved, medians. Each graph prints
the proposals its RPN kept (read from the graph), its detections, and how many of detectron2's
detections ours matches (same class, IoU >= 0.99, score within 1e-3 and within 1e-4);
``--eager`` adds detectron2's PyTorch latency (``model.inference``) in the same process (also
added when detectron2's export fails: its error is printed). Sessions run without ONNX Runtime's
CPU memory arena (with it, two ViT-B sessions outgrew 12 GB).

Runs where detectron2 (with its source tree, for the config) and timm are installed besides
norcal-deploy; 10-20
minutes on 2 shared cores:

    python bench/bench_vitdet_vs_detectron2.py --detectron2-src PATH/TO/detectron2
        [--threads 2] [--repeats 3] [--export-repeats 1] [--eager]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from PIL import Image
from rich.console import Console
from rich.table import Table

from bench_vs_detectron2 import count_proposals, proposal_outputs, session, time_all, uptime  # noqa: E402
from fixture_files import TESTS, fixture_dir  # noqa: E402
from full_size_model import _bisect  # noqa: E402
from widen_detectron2_graph import compare_detections  # noqa: E402

CONFIG = "projects/ViTDet/configs/LVIS/mask_rcnn_vitdet_b_100ep.py"  # under detectron2's source tree
SQUARE = 1024


def rgb_image() -> np.ndarray:
    """img0 of d2_lvis_tiny as the config's test transform gives it: RGB uint8 [H, W, 3]."""
    import detectron2.data.transforms as T

    rgb = np.asarray(Image.open(fixture_dir("d2_lvis_tiny") / "images" / "img0.png").convert("RGB"))
    return T.ResizeShortestEdge(SQUARE, SQUARE).get_transform(rgb).apply_image(rgb)


def d2_config(src: Path):
    sys.path.insert(0, str(TESTS / "fixtures"))
    from make_backbone_keys import stand_in_pkg_resources
    from detectron2.config import LazyConfig

    stand_in_pkg_resources(src)  # the config reads its bases through model_zoo
    return LazyConfig.load(str(src / CONFIG))


@torch.no_grad()
def condition(model, image: torch.Tensor, *, sigma: float, candidates: int, seed: int = 0) -> dict:
    """``model``'s weights conditioned in place on ``image`` (RGB float [3, H, W]) as the module
    says; returns what the conditioning measured."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.backbone.named_parameters():
        if "rel_pos" in name:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    images = model.preprocess_image([{"image": image}])
    features = model.backbone(images.tensor)
    rpn = model.proposal_generator
    logits, deltas = rpn.rpn_head([features[f] for f in rpn.in_features])
    head = rpn.rpn_head
    head.objectness_logits.weight /= torch.cat([x.reshape(-1) for x in logits]).std()
    head.anchor_deltas.weight *= 0.05 / torch.cat([x.reshape(-1) for x in deltas]).std()
    head.objectness_logits.bias.zero_()
    head.anchor_deltas.bias.zero_()
    props, _ = rpn(images, features, None)
    heads = model.roi_heads
    x = heads.box_head(heads.box_pooler([features[f] for f in heads.box_in_features],
                                        [p.proposal_boxes for p in props]))
    pred = heads.box_predictor
    c = heads.num_classes
    w = torch.randn(pred.cls_score.weight.shape, generator=gen)
    fg = (x @ w[:c].T).double()
    scale = sigma / float(fg.std())
    fg = fg * scale
    thresh = pred.test_score_thresh
    above = lambda b: int((torch.sigmoid(fg + b) > thresh).sum())  # noqa: E731
    beta = _bisect(lambda b: above(b) >= candidates, -60.0, 60.0)
    w = w * scale
    w[c] = 0.0  # background: not read by the sigmoid classifier
    pred.cls_score.weight.copy_(w)
    pred.cls_score.bias.fill_(beta)
    pred.cls_score.bias[c] = 0.0
    pred.bbox_pred.weight *= 0.1 / pred.bbox_pred(x).std()
    return {"proposals": len(props[0]), "pairs": above(beta), "bias": beta}


def d2_export(src: Path, weights: Path, image: torch.Tensor, out: Path) -> None:
    """detectron2's own export of the checkpoint (its config read from the source tree: see the
    module's docstring): TracingAdapter + torch.onnx.export."""
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.config import instantiate
    from detectron2.export import TracingAdapter

    model = instantiate(d2_config(src).model).eval()
    DetectionCheckpointer(model).load(str(weights))

    def inference(model, inputs):
        return [{"instances": model.inference(inputs, do_postprocess=False)[0]}]

    with torch.no_grad():
        adapter = TracingAdapter(model, [{"image": image}], inference)
        torch.onnx.export(adapter, adapter.flattened_inputs, str(out), opset_version=17, dynamo=False)


def our_export(config: Path, weights: Path, out: Path) -> None:
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    export_checkpoint(weights, out, NorCal(gamma=0.0), CheckpointExport(config=config), force=True)


def time_exports(exports: dict, repeats: int, console) -> tuple[dict, dict]:
    """Seconds of each export, interleaved; an export that raises is left out after its first
    try, with its error (type and message) returned."""
    seconds: dict[str, list[float]] = {k: [] for k in exports}
    failed: dict[str, str] = {}
    for i in range(repeats):
        for k, run in exports.items():
            if k in failed:
                continue
            with console.status(f"export {i + 1}/{repeats}: {k}"):
                start = time.perf_counter()
                try:
                    run()
                except Exception as e:  # noqa: BLE001 -- the baseline's failure is a result
                    failed[k] = f"{type(e).__name__}: {e}"
                    seconds.pop(k)
                    console.print(f"{k} export failed after {time.perf_counter() - start:.1f} s: {failed[k]}")
                    continue
                seconds[k].append(time.perf_counter() - start)
            console.print(f"{k} export {i + 1}: {seconds[k][-1]:.1f} s")
    return {k: statistics.median(v) for k, v in seconds.items()}, failed


def inspect_graphs(files: dict, inputs: dict, threads: int) -> tuple[dict, dict, dict]:
    """Per graph: file size, nodes, proposals, detections, matches with detectron2's graph
    (at score tolerances 1e-3 and 1e-4); a session for timing each, after its first run, and its
    feeds (``inputs`` named by the graph's inputs). One session per graph, the proposals an
    extra output that timed runs do not fetch; no CPU memory arena (a ViT-B run's arena grows to
    many GB: with two sessions the process ran out of memory on 23 GB)."""
    facts, outs, feeds, sessions, names = {}, {}, {}, {}, {}
    for k, f in files.items():
        graph = onnx.load(str(f))
        feeds[k] = {i.name: a for i, a in zip(graph.graph.input, inputs[k])}
        names[k] = [o.name for o in graph.graph.output]
        cross = proposal_outputs(graph)
        sessions[k] = session(graph, threads, arena=False)
        nodes = len(graph.graph.node)
        graph = None
        values = sessions[k].run(names[k] + cross, feeds[k])
        outs[k], props = values[:len(names[k])], count_proposals(values[len(names[k]):])
        dets = int(outs[k][0].shape[0]) if k == "detectron2" else int(outs[k][0][0])
        facts[k] = {"MB": f.stat().st_size / 1e6, "nodes": nodes,
                    "proposals": props, "detections": dets}
    if len(outs) == 2:
        facts["ours"]["same"] = {tol: compare_detections(outs["detectron2"], outs["ours"], max_score_diff=tol)
                                 for tol in (1e-3, 1e-4)}
    return facts, sessions, feeds, names


def print_results(console, facts: dict, export_s: dict, med: dict, size: str, args) -> None:
    base = "detectron2" if "detectron2" in facts else "detectron2 PyTorch"
    table = Table(title=f"ViTDet-B LVIS Mask R-CNN, 1 image {size} (square {SQUARE}), batch 1, "
                        f"{args.threads} threads, ORT CPU; medians of {args.repeats} runs, "
                        f"{args.export_repeats} export(s); ratios against {base}")
    for col in ("graph", "export s", "/ detectron2", "graph MB", "nodes", "proposals", "detections",
                "= detectron2's (1e-3 / 1e-4)", "latency ms", f"/ {base}", "load (1 min)"):
        table.add_column(col, justify="right")
    load = os.getloadavg()[0]
    for k in med:
        f = facts.get(k)
        same = f.get("same") if f else None
        match = (f"{same[1e-3]['matched']} / {same[1e-4]['matched']} of {same[1e-3]['detectron2']}"
                 if same else "-")
        ex = (f"{export_s[k]:.1f}", f"{export_s[k] / export_s['detectron2']:.2f}" if "detectron2" in export_s
              else "-") if k in export_s else ("-", "-")
        table.add_row(k, *ex, *((f"{f['MB']:.0f}", str(f["nodes"]), str(f["proposals"]), str(f["detections"]))
                                if f else ("-",) * 4),
                      match, f"{med[k] * 1e3:.0f}", f"{med[k] / med[base]:.2f}", f"{load:.2f}")
    console.print(table)
    same = facts.get("ours", {}).get("same")
    if same:
        pair = same[1e-3]
        console.print(f"matched pairs (1e-3): worst IoU {pair['min_iou']}, largest score difference "
                      f"{pair['max_score_diff']}, largest mask difference {pair['max_mask_diff']}")
        if pair["unpaired"]:
            console.print(f"detectron2's detections not paired (score, best same-class IoU with ours): "
                          f"{pair['unpaired']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--detectron2-src", type=Path, required=True, help="detectron2's source tree")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (ORT and torch)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per graph (the median counts)")
    p.add_argument("--export-repeats", type=int, default=1, help="timed exports of each")
    p.add_argument("--sigma", type=float, default=2.5, help="classifier logits' std")
    p.add_argument("--candidates", type=int, default=3000, help="(box, class) pairs above 0.02")
    p.add_argument("--eager", action="store_true", help="add detectron2's PyTorch latency")
    args = p.parse_args(argv)
    console = Console(width=160)
    torch.set_num_threads(args.threads)
    console.print(f"start: {uptime()}")
    from detectron2.config import LazyConfig, instantiate

    cfg = d2_config(args.detectron2_src.resolve())
    rgb = rgb_image()
    h, w = rgb.shape[:2]
    image = torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1))).float()
    with console.status("instantiating and conditioning the full-size model (detectron2, PyTorch)"):
        torch.manual_seed(0)
        model = instantiate(cfg.model).eval()
        cond = condition(model, image, sigma=args.sigma, candidates=args.candidates)
    params = sum(t.numel() for t in model.parameters())
    console.print(f"detectron2's model: {params / 1e6:.1f}M parameters; image {h}x{w} (square {SQUARE}); "
                  f"PyTorch RPN proposals {cond['proposals']}; (box, class) pairs above "
                  f"{model.roi_heads.box_predictor.test_score_thresh}: {cond['pairs']} (bias {cond['bias']:.2f})")
    tmp = Path(tempfile.mkdtemp(prefix="vitdet_bench_"))  # removed at the end; kept where a step raised
    console.print(f"checkpoint, config.yaml and graphs in {tmp}")
    weights, config = tmp / "model_final.pth", tmp / "config.yaml"
    torch.save({"model": model.state_dict()}, weights)
    LazyConfig.save(cfg, str(config))
    files = {"detectron2": tmp / "detectron2.onnx", "ours": tmp / "ours.onnx"}
    src = args.detectron2_src.resolve()
    exports = {"detectron2": lambda: d2_export(src, weights, image, files["detectron2"]),
               "ours": lambda: our_export(config, weights, files["ours"])}
    export_s, failed = time_exports(exports, args.export_repeats, console)
    gc.collect()
    files = {k: f for k, f in files.items() if k not in failed}
    bgr = np.zeros((1, 3, SQUARE, SQUARE), np.float32)
    bgr[0, :, :h, :w] = rgb[:, :, ::-1].transpose(2, 0, 1)
    inputs = {"detectron2": [image.numpy()],  # TracingAdapter's one flattened input
              "ours": [bgr, np.array([[h, w]], np.int64)]}
    with console.status("sessions, proposals, detections"):
        facts, sessions, feeds, names = inspect_graphs(files, inputs, args.threads)
    runs = {k: (lambda s=s, n=names[k], f=feeds[k]: s.run(n, f)) for k, s in sessions.items()}
    if args.eager or "detectron2" in failed:
        runs["detectron2 PyTorch"] = lambda: model.inference([{"image": image}], do_postprocess=False)
        with torch.no_grad():  # its warm-up: the graphs ran once above
            model.inference([{"image": image}], do_postprocess=False)
    else:
        model = None
    with console.status("timing"), torch.no_grad():
        med = time_all(runs, args.repeats, warm_up=False)
    print_results(console, facts, export_s, med, f"{h}x{w}", args)
    for k, error in failed.items():
        console.print(f"{k}'s export FAILED: {error}")
    shutil.rmtree(tmp)
    console.print(f"end: {uptime()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
