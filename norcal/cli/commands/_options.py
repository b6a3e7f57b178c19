"""Options several subcommands share, spelled and explained once."""


def add_calibration_options(p) -> None:
    """--factor and --mechanism: which NorCal variant (see norcal.core.calibration)."""
    p.add_argument("--factor", choices=("cdt", "ens"), default="cdt",
                   help="a_c = N_c^gamma (cdt, default) or the effective number (ens, gamma < 1)")
    p.add_argument("--mechanism", choices=("exp", "prob", "logit"), default="exp",
                   help="scale the exponentials (default), the probabilities, or the logits")
    p.add_argument("--min-count", type=float, metavar="K",
                   help="raise training counts below K to K (default: a zero count is an error)")


def min_count_line(min_count: float, clamped: int, num_classes: int | None = None) -> str:
    """What --min-count did, for the user."""
    of = f" of {num_classes}" if num_classes else ""
    return (f"--min-count {min_count:g}: {clamped}{of} classes had a training count "
            f"below {min_count:g} and were counted as {min_count:g}")
