"""norcal eval: LVIS AP (federated rules) and AP^Fixed of a result file."""

from __future__ import annotations

from norcal.cli.options import add_split_argument

HELP = "LVIS evaluation: AP, AP_r/c/f, AR and AP^Fixed of a detection result file"
DESCRIPTION = """Evaluate LVIS-format detections against LVIS-format ground truth, with LVIS's
federated rules (neg_category_ids, not_exhaustive_category_ids). The numbers equal the
official lvis-api 0.5.3 (within 1e-4; tested), computed much faster with numpy.

  norcal eval --gt lvis_v1_val.json --results segm.json --iou-type segm \\
              --json metrics.json --per-class-csv ap.csv --plots plots/

--iou-type: bbox (box IoU), segm (mask IoU) or boundary (Boundary IoU, Cheng et al. 2021, as
in LVIS Challenge 2021: min of the mask IoU and the IoU of the masks' boundary bands, the
pixels within 2% of the image diagonal of each mask's contour); segm and boundary need RLE
masks in the results.

Metrics (printed in %, written as fractions in [0, 1]; -1 where undefined):
  AP AP50 AP75        LVIS AP over IoU 0.50:0.95, at 0.50, at 0.75 (top --max-dets per image)
  APs APm APl         small / medium / large GTs
  APr APc APf         rare / common / frequent categories (the GT's `frequency` field, or
                      --table's groups when the GT lacks it)
  AR ARs ARm ARl      recall at --max-dets (lvis-api's AR@300 ...); ARr ARc ARf per group
  fixed.*             AP^Fixed (Dave et al. 2021): no per-image cap, the top --fixed-per-class
                      (10,000) detections per category over the whole set

--json FILE writes {"iou_type", "max_dets", "per_class_cap", "num_detections",
"stats": {AP, AP50, AP75, APs, APm, APl, APr, APc, APf, AR, ARs, ARm, ARl, ARr, ARc, ARf},
"per_class": [{category_id, name, frequency, image_count, num_gt, AP}],
"fixed": {"per_class_cap", "num_detections", "stats": {...same keys}, "per_class_AP": [...]}}.
--per-class-csv: category_id,name,frequency,image_count (N_c),num_gt,AP[,AP_fixed].
--plots DIR: ap_by_frequency.png (bars) and ap_vs_count.png (per-class AP against N_c, log x).
"""


def _cap(text: str) -> int:
    """--max-dets: a whole number of either sign (negative: no cap), unlike other counts."""
    import argparse

    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def add_arguments(p):
    p.add_argument("--gt", required=True, metavar="ANNOTATIONS.json|data.yaml",
                   help="LVIS/COCO-format ground truth, or an Ultralytics data.yaml (see --split)")
    add_split_argument(p, "--gt")
    p.add_argument("--results", required=True, metavar="RESULTS.json",
                   help="LVIS/COCO result list: image_id, category_id, score, bbox [x,y,w,h] "
                        "and/or segmentation (RLE)")
    p.add_argument("--iou-type", choices=("bbox", "segm", "boundary"), default="bbox",
                   help="box, mask or Boundary IoU (default bbox)")
    p.add_argument("--max-dets", type=_cap, default=300, help="detections kept per image by score (default 300; negative: no cap)")
    p.add_argument("--table", metavar="NAME|PATH",
                   help="calibration table (lvis_v1, lvis_v0_5 or a JSON path) giving frequency groups "
                        "and N_c when the GT's categories lack them")
    p.add_argument("--no-fixed", action="store_true", help="skip AP^Fixed")
    p.add_argument("--fixed-per-class", type=int, default=10000,
                   help="AP^Fixed's detections kept per category (default 10000)")
    p.add_argument("--json", metavar="FILE", help="write every reported number as JSON (keys above)")
    p.add_argument("--per-class-csv", metavar="FILE", help="write per-category AP as CSV")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")


def run(args) -> int:
    from rich.console import Console

    from norcal.core.errors import NorcalError
    from norcal.evaluation import evaluate, evaluate_fixed, from_results, prepare_gt
    from norcal.evaluation import report

    from norcal.cli.options import check_outputs

    if args.max_dets == 0:
        raise NorcalError("--max-dets must be positive (or negative for no cap)")
    if not args.no_fixed and args.fixed_per_class < 1:
        raise NorcalError(f"--fixed-per-class must be >= 1, got {args.fixed_per_class}")
    check_outputs([args.gt, args.results, args.table],
                  files={"--json": args.json, "--per-class-csv": args.per_class_csv},
                  folders={"--plots": args.plots})
    console = Console(soft_wrap=True)
    table = None
    if args.table:
        from norcal.core.tables import load_table

        table = load_table(args.table)
    with console.status("loading ground truth and results"):
        gt = prepare_gt(args.gt, table, split=args.split)
        if table is not None:
            from norcal.evaluation.ground_truth import check_table_matches

            check_table_matches(table, gt)
        dets = from_results(args.results)
    with console.status(f"evaluating {len(dets)} detections ({args.iou_type})"):
        result = evaluate(gt, dets, args.iou_type, args.max_dets)
        fixed = None if args.no_fixed else evaluate_fixed(gt, dets, args.iou_type, args.fixed_per_class)
    covered = len(set(dets.image_ids.tolist()))
    if covered < len(gt.img_ids):
        console.print(f"[yellow]note:[/yellow] the results cover {covered} of the GT's {len(gt.img_ids)} "
                      "images; the objects of the others count as missed (as in lvis-api)")
    if not gt.has_frequency:
        console.print("[yellow]note:[/yellow] the GT's categories carry no frequency group; "
                      "APr/APc/APf are -1 (pass --table to group them)")
    columns = {"LVIS": result}
    if fixed is not None:
        columns["AP^Fixed"] = fixed
    console.print(stats_table(columns, f"{args.iou_type} evaluation of {args.results}"))
    if args.json:
        report.write_metrics(args.json, result, fixed)
        console.print(f"wrote {args.json}")
    if args.per_class_csv:
        report.write_per_class_csv(args.per_class_csv, result, fixed)
        console.print(f"wrote {args.per_class_csv}")
    if args.plots:
        for path in report.write_plots(args.plots, result, fixed):
            console.print(f"wrote {path}")
    return 0


def stats_table(results, title: str = "LVIS evaluation"):
    """A rich Table: one row per metric, one column per named
    :class:`norcal.evaluation.EvalResult` (values in %)."""
    from rich.table import Table

    from norcal.evaluation import STAT_KEYS
    from norcal.evaluation.report import percent

    table = Table(title=title)
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    first = next(iter(results.values()))
    for key in STAT_KEYS:
        label = key
        if key.startswith("AR"):
            cap = first.max_dets if first.max_dets >= 0 else "all"
            label = f"{key}@{cap}"
        table.add_row(label, *(percent(r.stats[key]) for r in results.values()))
    return table
