"""Errors the report raises for user mistakes.

`ReportError` is a `ValueError` so callers (the CLI) can catch one type and print its one-line
message, which always names the fix (which flag to pass, which store to point at).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ReportError(ValueError):
    """A report cannot be produced because of what the user asked for (not a bug)."""


def did_you_mean(name: str, choices: Iterable[str], limit: int = 8) -> str:
    """Return ' (did you mean X?) available: a, b, ...' for error messages.

    Registries that list the alternatives save the user a round trip to the docs.
    """
    options = sorted({str(c) for c in choices})
    close = difflib.get_close_matches(name, options, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    shown = ", ".join(options[:limit]) + (", ..." if len(options) > limit else "")
    return f"{hint}; available: {shown or '(none)'}"
