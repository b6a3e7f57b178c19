"""norcal simulate: NorCal's gamma sweep on an LVIS-scale simulated detector."""

from __future__ import annotations

HELP = "simulated LVIS-scale benchmark: baseline vs NorCal over a gamma sweep"
DESCRIPTION = """A simulated LVIS v1 benchmark (1203 classes with their real training image
counts N_c from the calibration table). It draws an LVIS-format validation GT with
federated fields (frequent classes annotated more often, neg_category_ids,
not_exhaustive_category_ids) and a detector whose proposal logits [R, C+1] carry a
long-tail bias (--bias * log N_c), like a real LVIS model. For each gamma it applies NorCal
(CDT, a_c = N_c^gamma; gamma 0 = the plain softmax baseline), keeps scores > 1e-4 and the
top 300 per image, and evaluates LVIS box AP. Gamma is picked by AP on a separate "train"
split (other images and seed) and checked against the best gamma on val.

  norcal simulate                                 2000 val + 1000 train images (~1 min)
  norcal simulate --images 500 --gammas 0,0.5,1 --json sim.json --plot sim.png

--json FILE: {"gammas": [...], "val": [stats per gamma], "train": [stats per gamma],
"gamma_picked_on_train", "gamma_best_on_val", "picked_is_best_on_val", "config"}, stats
with the keys of `norcal eval` (AP, AP50, ..., APr, APc, APf, AR, ...) as fractions.
"""

# parameters of norcal.evaluation.simulate named in its errors -> the flags here
FLAGS = {"images": "--images", "train_images": "--train-images", "gammas": "--gammas", "proposals": "--proposals",
         "bias": "--bias"}


def add_arguments(p):
    p.add_argument("--images", type=int, default=2000, help="validation images (default 2000)")
    p.add_argument("--train-images", type=int, default=1000,
                   help="images of the split gamma is picked on (default 1000)")
    p.add_argument("--gammas", default="0,0.25,0.5,0.75,1.0,1.25",
                   help="CDT gammas, a comma list or start:stop:step; 0 is the baseline "
                        "(default 0,0.25,...,1.25)")
    p.add_argument("--seed", type=int, default=0, help="random seed (the train split uses seed+1000)")
    from norcal.cli.options import table_help

    p.add_argument("--table", default="lvis_v1", help=table_help("the classes and N_c; default lvis_v1"))
    p.add_argument("--proposals", type=int, default=64, help="proposals per image (default 64)")
    p.add_argument("--bias", type=float, default=1.0, help="long-tail logit bias per unit log N_c (default 1.0)")
    p.add_argument("--json", metavar="FILE", help="write the sweep as JSON")
    p.add_argument("--plot", metavar="PNG", help="plot AP, APr, APc, APf on val against gamma")


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console
    from rich.progress import Progress
    from rich.table import Table

    from norcal.core.errors import NorcalError
    from norcal.evaluation.simulate import SimConfig, plot_sweep, run_benchmark
    from norcal.core.files.fileio import write_json
    from norcal.cli.options import check_outputs, parse_valid_gammas
    from norcal.core.calibration.tables import load_table

    gammas = parse_valid_gammas(args.gammas)
    if args.images < 1 or args.train_images < 1:
        raise NorcalError("--images and --train-images must be >= 1")
    if args.proposals < 8:
        raise NorcalError(f"--proposals must be >= 8, got {args.proposals}")
    check_outputs([args.table], files={"--json": args.json, "--plot": args.plot})
    table = load_table(args.table)
    config = SimConfig(images=args.images, train_images=args.train_images, seed=args.seed,
                       proposals=args.proposals, bias=args.bias)
    console = Console(soft_wrap=True)
    with Progress(console=console, transient=True) as progress:
        tasks = {name: progress.add_task(f"{name}: detect + calibrate", total=n)
                 for name, n in (("train", args.train_images), ("val", args.images))}
        report = run_benchmark(table, gammas, config,
                               lambda name, n, _total: progress.advance(tasks[name], n))
    t = Table(title=f"simulated {table.name}: {args.images} val images, box AP (%)")
    for col in ("gamma", "AP", "AP50", "APr", "APc", "APf", "AR", "train AP"):
        t.add_column(col, justify="right")
    for g, v, tr in zip(report.gammas, report.val, report.train):
        name = f"{g:g}" + (" (baseline)" if g == 0 else "") + (" *" if g == report.gamma_train else "")
        t.add_row(name, *(f"{100 * v[k]:.2f}" for k in ("AP", "AP50", "APr", "APc", "APf", "AR")),
                  f"{100 * tr['AP']:.2f}")
    console.print(t)
    best = report.gammas.index(report.gamma_val)
    picked = report.gammas.index(report.gamma_train)
    verdict = "is also the best on val" if picked == best else (
        f"is not the best on val (best {report.gamma_val:g}: AP {100 * report.val[best]['AP']:.2f} "
        f"vs {100 * report.val[picked]['AP']:.2f})")
    console.print(f"* gamma picked on train: {report.gamma_train:g}, {verdict}")
    if args.json:
        write_json(args.json, report.to_json())
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_sweep(args.plot, report)
        console.print(f"wrote {args.plot}")
    return 0
