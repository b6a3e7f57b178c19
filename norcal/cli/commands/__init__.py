"""One module per ``norcal`` subcommand (see :mod:`norcal.cli`)."""
