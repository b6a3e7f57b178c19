"""norcal table: build and inspect calibration tables."""

from __future__ import annotations

from norcal.core.calibration.tables import GROUPS, build_table, builtin_names, load_table

HELP = "build or show a calibration table (per-class training counts)"
DESCRIPTION = """Calibration tables hold N_c, the per-class training counts NorCal divides by.

  norcal table show lvis_v1                 a built-in (lvis_v1, lvis_v0_5) or a JSON path
  norcal table build train.json -o t.json   count classes in a COCO/LVIS annotation file
  norcal table build data.yaml -o t.json    count classes in an Ultralytics dataset (its YOLO
                                            label files; category id = class index + 1)

A class with no training labels is written with count 0 and named in a note: NorCal divides by
N_c, so export and tune with such a table need --min-count K (counts below K taken as K).
  norcal table list                         the built-in tables
"""


def add_arguments(p):
    sub = p.add_subparsers(dest="table_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="make a table from a COCO/LVIS annotation file or an Ultralytics "
                                     "data.yaml")
    b.add_argument("annotations", help="COCO- or LVIS-format annotation JSON, or an Ultralytics data.yaml "
                                       "(.yaml/.yml)")
    b.add_argument("--split", default="train",
                   help="data.yaml: the split whose labels are counted (default train)")
    b.add_argument("--count", choices=("image", "instance"), default="image",
                   help="N_c = images containing the class (default, the paper's) or instances")
    b.add_argument("--name", help="table name (default: the file's stem)")
    b.add_argument("-o", "--output", required=True, help="where to write the table JSON")
    s = sub.add_parser("show", help="print a table's classes, groups and sha256")
    s.add_argument("table", help="built-in name or path")
    s.add_argument("--limit", type=int, default=20, help="classes to list (0: all; default 20)")
    sub.add_parser("list", help="list the built-in tables")


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    if args.table_command == "list":
        for name in builtin_names():
            t = load_table(name)
            console.print(f"{name}\t{t.num_classes} classes\t{t.source}")
        return 0
    if args.table_command == "build":
        from norcal.cli.options import check_outputs

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from norcal.cli.options import progress_bars
        from norcal.core.calibration.tables import table_from_dataset
        from norcal.core.datasets.ultralytics_dataset import is_dataset_description

        check_outputs([args.annotations], files={"-o": args.output})
        if is_dataset_description(args.annotations):
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console, transient=True) as progress:
                table = table_from_dataset(args.annotations, args.count, args.name, args.split,
                                           progress=progress_bars(progress))
        else:
            table = build_table(args.annotations, args.count, args.name)
        table.save(args.output)
        g = table.group_counts()
        console.print(f"wrote {args.output}: {table.num_classes} classes "
                      f"({g['r']} rare, {g['c']} common, {g['f']} frequent), sha256 {table.sha256}")
        unseen = [(i, c["name"]) for i, c in enumerate(table.categories) if not c[f"{table.count_type}_count"]]
        if unseen:  # the counts are facts; NorCal divides by them, so using the table needs a floor
            console.print(f"note: {len(unseen)} class(es) have no training labels (first: class {unseen[0][0]} "
                          f"{unseen[0][1]!r}); NorCal needs every N_c > 0: give --min-count K (e.g. 1) to "
                          "norcal export / tune with this table")
        return 0
    table = load_table(args.table)
    counts = table.counts()
    g = table.group_counts()
    console.print(f"[bold]{table.name}[/bold]  ({table.source})")
    console.print(f"classes: {table.num_classes}  count type: {table.count_type}  "
                  f"sha256: {table.sha256}")
    summary = Table("group", "classes", "min N_c", "max N_c")
    for key, label in GROUPS.items():
        sel = [c for c, f in zip(counts, table.frequencies) if f == key]
        summary.add_row(label, str(g.get(key, 0)),
                        f"{min(sel):g}" if sel else "-", f"{max(sel):g}" if sel else "-")
    console.print(summary)
    rows = table.categories if args.limit == 0 else table.categories[: args.limit]
    listing = Table("index", "id", "name", "image_count", "instance_count", "group")
    for i, c in enumerate(rows):
        listing.add_row(str(i), str(c["id"]), c["name"], str(c.get("image_count")),
                        str(c.get("instance_count")), c["frequency"])
    console.print(listing)
    if len(rows) < table.num_classes:
        console.print(f"... {table.num_classes - len(rows)} more (--limit 0 lists all)")
    return 0
