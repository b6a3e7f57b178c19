"""The CLI's rich console: every string it renders (table cells, titles, printed lines) has the
characters a terminal would act on written as escapes, as errors are (``norcal.core.errors
.printable``): class names, node names, paths and config values come from files."""

from __future__ import annotations

from rich.console import Console


class SafeConsole(Console):
    """A rich Console whose text cannot drive the terminal; line breaks stay line breaks."""

    def render_str(self, text: str, **options):
        from norcal.core.errors import printable

        return super().render_str("\n".join(printable(line) for line in text.split("\n")), **options)
