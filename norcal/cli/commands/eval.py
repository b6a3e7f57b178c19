"""norcal eval: AP (LVIS federated or COCO rules), AP^Fixed and deployment metrics of a result file."""

from __future__ import annotations

from norcal.cli.options import add_split_argument, table_help

HELP = "LVIS/COCO evaluation: AP, AP_r/c/f, AR and AP^Fixed of a detection result file"
DESCRIPTION = """Evaluate LVIS/COCO-format detections against LVIS- or COCO-format ground truth.

  norcal eval --gt lvis_v1_val.json --results segm.json --iou-type segm \\
              --json metrics.json --per-class-csv ap.csv --plots plots/
  norcal eval --gt instances_val.json --results bbox.json --score-thresh 0.25

--rules (the first output line says which applies and why):
  auto   lvis when some image of --gt carries neg_category_ids or not_exhaustive_category_ids
         (LVIS's image-level federated lists), else coco (default)
  lvis   LVIS federated rules, the numbers of lvis-api 0.5.3 (tested): a detection counts
         only on images where its class is annotated or listed in neg_category_ids; an
         unmatched one of a not_exhaustive class is ignored; GTs with ignore: 1 are ignored;
         GTs and detections of area 0 are dropped. Refused on a GT without the lists.
  coco   exhaustive labels, the numbers of pycocotools' COCOeval (tested): every detection
         counts; iscrowd GTs are ignored, match any number of detections, and their IoU is
         over the detection's area; the top 100 detections per image and class count
         (COCOeval's maxDets=100, so AR is AR@100; AR1 and AR10 are AR@1 and AR@10)
Both take area ranges from the GT's `area` field (small < 32^2 < medium < 96^2 < large).

--iou-type: bbox (box IoU), segm (mask IoU) or boundary (Boundary IoU, Cheng et al. 2021, as
in LVIS Challenge 2021: min of the mask IoU and the IoU of the masks' boundary bands, the
pixels within 2% of the image diagonal of each mask's contour); segm and boundary need RLE
masks in the results.

Metrics (printed in %, written as fractions in [0, 1]; -1 where undefined):
  AP AP50 AP75        AP over IoU 0.50:0.95, at 0.50, at 0.75 (top --max-dets per image)
  APs APm APl         small / medium / large GTs
  APr APc APf         rare / common / frequent categories (the GT's `frequency` field, or
                      --table's groups when the GT lacks it, or a data.yaml --gt's own
                      train split's counts; under coco rules only then)
  AR ARs ARm ARl      recall at --max-dets (lvis-api's AR@300 ...; coco: AR@100 ...);
                      ARr ARc ARf per group
  fixed.*             AP^Fixed (Dave et al. 2021): no per-image cap, the top --fixed-per-class
                      (10,000) detections per category over the whole set

--score-thresh T: deployment metrics after AP: precision and recall, overall and per
frequency group, of the detections with score >= T, matched one-to-one greedily by score to
GTs at IoU >= 0.5 (all areas), under the rules above (what AP ignores is neither a true nor
a false positive).

--json FILE writes {"rules", "rules_reason", "iou_type", "max_dets", "per_class_cap",
"num_detections", "stats": {AP, AP50, AP75, APs, APm, APl, APr, APc, APf, AR, ARs, ARm, ARl,
ARr, ARc, ARf; coco: AR1, AR10 too, the groups only where present},
"per_class": [{category_id, name, frequency, image_count, num_gt, AP}],
"fixed": {"per_class_cap", "num_detections", "stats": {...same keys}, "per_class_AP": [...]},
"deployment": {"score_thresh", "iou": 0.5, "groups": {all, r, c, f: {tp, fp, num_gt,
precision, recall}}} (with --score-thresh)}.
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


FLAGS = {"rules": "--rules", "score_thresh": "--score-thresh"}


def add_arguments(p):
    p.add_argument("--gt", required=True, metavar="ANNOTATIONS.json|data.yaml",
                   help="LVIS- or COCO-format ground truth, or an Ultralytics data.yaml (see --split)")
    add_split_argument(p, "--gt")
    p.set_defaults(split=None)  # None: not given (val); refused with a JSON --gt, which has no splits
    p.add_argument("--results", required=True, metavar="RESULTS.json",
                   help="LVIS/COCO result list: image_id, category_id, score, bbox [x,y,w,h] "
                        "and/or segmentation (RLE)")
    p.add_argument("--iou-type", choices=("bbox", "segm", "boundary"), default="bbox",
                   help="box, mask or Boundary IoU (default bbox)")
    p.add_argument("--rules", choices=("auto", "lvis", "coco"), default="auto",
                   help="LVIS federated or COCO (exhaustive) rules; auto: lvis when the GT's images "
                        "carry neg_category_ids / not_exhaustive_category_ids, else coco (see above)")
    p.add_argument("--max-dets", type=_cap, default=None,
                   help="detections kept per image by score (default: 300 under lvis rules, no cap "
                        "under coco rules, which keep 100 per image and class; negative: no cap)")
    p.add_argument("--score-thresh", type=float, metavar="T",
                   help="also report precision / recall of the detections with score >= T "
                        "(matched at IoU >= 0.5), overall and per frequency group")
    p.add_argument("--table", metavar="NAME|PATH",
                   help=table_help("the frequency groups and N_c when the GT's categories lack them"))
    p.add_argument("--no-fixed", action="store_true", help="skip AP^Fixed")
    p.add_argument("--fixed-per-class", type=int, default=10000,
                   help="AP^Fixed's detections kept per category (default 10000)")
    p.add_argument("--json", metavar="FILE", help="write every reported number as JSON (keys above)")
    p.add_argument("--per-class-csv", metavar="FILE", help="write per-category AP as CSV")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console

    from norcal.evaluation import evaluate, evaluate_fixed, from_results, prepare_gt
    from norcal.evaluation.deployment import deployment_metrics
    from norcal.evaluation.rules import choose_rules

    split = _check_flags(args)
    console = Console(soft_wrap=True)
    table, groups_from = _table(args, console)
    with console.status("loading ground truth and results"):
        gt = prepare_gt(args.gt, table, split=split)
        if table is not None:
            from norcal.evaluation.ground_truth import check_table_matches

            check_table_matches(table, gt)
        choice = choose_rules(gt, args.rules)
    console.print(choice.line, highlight=False, markup=False)
    if groups_from is not None:
        console.print(groups_from, highlight=False, markup=False)
    with console.status("loading results"):
        dets = from_results(args.results)
    with console.status(f"evaluating {len(dets)} detections ({args.iou_type})"):
        result = evaluate(gt, dets, args.iou_type, args.max_dets, rules=choice)
        fixed = None if args.no_fixed else evaluate_fixed(gt, dets, args.iou_type, args.fixed_per_class,
                                                          rules=choice)
    deployment = None if args.score_thresh is None else deployment_metrics(result, args.score_thresh)
    lvis = choice.name == "lvis"
    _print_notes(console, gt, dets, lvis)
    columns = {"LVIS" if lvis else "COCO": result}
    if fixed is not None:
        columns["AP^Fixed"] = fixed
    console.print(stats_table(columns, f"{args.iou_type} evaluation of {args.results}"))
    if deployment is not None:
        console.print(deployment_table(deployment))
    _write_outputs(args, console, result, fixed, deployment)
    return 0


def _check_flags(args) -> str:
    """Refuse bad flags and unwritable outputs before anything is read; the --split to use."""
    from norcal.cli.options import check_outputs
    from norcal.core.datasets.ultralytics_dataset import is_dataset_description
    from norcal.core.errors import NorcalError
    from norcal.evaluation.deployment import check_score_thresh

    if args.max_dets == 0:
        raise NorcalError("--max-dets must be positive (or negative for no cap)")
    if not args.no_fixed and args.fixed_per_class < 1:
        raise NorcalError(f"--fixed-per-class must be >= 1, got {args.fixed_per_class}")
    if args.score_thresh is not None:
        check_score_thresh(args.score_thresh)
    if args.split is not None and not is_dataset_description(args.gt):
        raise NorcalError(f"--split {args.split} applies to an Ultralytics data.yaml; {args.gt} is an "
                          "annotation file with no splits (leave --split out)")
    split = args.split or "val"
    check_outputs([args.gt, args.results, args.table],
                  files={"--json": args.json, "--per-class-csv": args.per_class_csv},
                  folders={"--plots": args.plots})
    return split


def _table(args, console):
    """The calibration table giving frequency groups and N_c (--table, else a data.yaml --gt's
    train split, else None), and the line saying it came from the split (or None)."""
    from norcal.core.datasets.ultralytics_dataset import is_dataset_description

    table = None
    if args.table:
        from norcal.core.calibration.tables import load_table

        table = load_table(args.table)
    groups_from = None
    if table is None and is_dataset_description(args.gt):
        # a data.yaml's own training split gives N_c, as `norcal-export --table data.yaml` counts it
        from norcal.core.calibration.tables import table_from_dataset

        with console.status("counting the training split's labels"):
            table = table_from_dataset(args.gt)
        groups_from = f"frequency groups (APr/APc/APf) and N_c from {args.gt}'s train split"
    return table, groups_from


def _print_notes(console, gt, dets, lvis: bool) -> None:
    """Notes on what the numbers leave out: GT images without results, missing frequency groups."""
    covered = len(set(dets.image_ids.tolist()))
    if covered < len(gt.img_ids):
        console.print(f"[yellow]note:[/yellow] the results cover {covered} of the GT's {len(gt.img_ids)} "
                      f"images; the objects of the others count as missed (as in "
                      f"{'lvis-api' if lvis else 'pycocotools'})")
    if lvis and not gt.has_frequency:
        console.print("[yellow]note:[/yellow] the GT's categories carry no frequency group; "
                      "APr/APc/APf are -1 (pass --table to group them)")


def _write_outputs(args, console, result, fixed, deployment) -> None:
    """--json, --per-class-csv and --plots, each file named as it is written."""
    from norcal.evaluation import report

    if args.json:
        report.write_metrics(args.json, result, fixed, deployment)
        console.print(f"wrote {args.json}")
    if args.per_class_csv:
        report.write_per_class_csv(args.per_class_csv, result, fixed)
        console.print(f"wrote {args.per_class_csv}")
    if args.plots:
        for path in report.write_plots(args.plots, result, fixed):
            console.print(f"wrote {path}")


def stats_table(results, title: str = "LVIS evaluation"):
    """A rich Table: one row per metric, one column per named
    :class:`norcal.evaluation.EvalResult` (values in %)."""
    from rich.table import Table

    from norcal.evaluation.report import percent

    table = Table(title=title)
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    first = next(iter(results.values()))
    for key in first.stat_keys():
        label = key
        if key in ("AR1", "AR10"):
            label = f"AR@{key[2:]}"
        elif key.startswith("AR"):
            cap = 100 if first.rules == "coco" else first.max_dets if first.max_dets >= 0 else "all"
            label = f"{key}@{cap}"
        table.add_row(label, *(percent(r.stats[key]) for r in results.values()))
    return table


def deployment_table(metrics):
    """A rich Table of :class:`norcal.evaluation.deployment.DeploymentMetrics`: one row per group."""
    from rich.table import Table

    from norcal.evaluation.report import GROUP_LABELS, percent

    table = Table(title=f"deployment at score >= {metrics.score_thresh:g} (IoU >= 0.5)")
    for col in ("group", "precision", "recall", "TP", "FP", "GT"):
        table.add_column(col, justify="left" if col == "group" else "right")
    for name, row in metrics.rows.items():
        table.add_row(GROUP_LABELS.get(name, name), percent(row["precision"]), percent(row["recall"]),
                      str(row["tp"]), str(row["fp"]), str(row["num_gt"]))
    return table
