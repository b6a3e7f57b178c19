"""The one exception type the CLI turns into a single line on stderr and exit status 2."""


class NorcalError(Exception):
    """A user-facing error: bad input, a mismatch, a missing optional dependency."""
