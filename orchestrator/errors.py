"""User-facing errors. Each carries lines that are printed as-is, one problem per line,
and the CLI turns any of them into exit code 2 (bad input) before any work starts."""
from __future__ import annotations


class UserInputError(Exception):
    """Bad input from the user: config, paths, addresses. Exit code 2, nothing written."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))
