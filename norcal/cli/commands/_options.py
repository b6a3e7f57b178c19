"""Options several subcommands share, spelled and explained once."""


def add_calibration_options(p) -> None:
    """--factor and --mechanism: which NorCal variant (see norcal.core.calibration)."""
    p.add_argument("--factor", choices=("cdt", "ens"), default="cdt",
                   help="a_c = N_c^gamma (cdt, default) or the effective number (ens, gamma < 1)")
    p.add_argument("--mechanism", choices=("exp", "prob", "logit"), default="exp",
                   help="scale the exponentials (default), the probabilities, or the logits")
