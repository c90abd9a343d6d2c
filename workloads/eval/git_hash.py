"""lm-eval's `git_hash` without git's complaint outside a repository.

`simple_evaluate` records `git describe --always` of the working folder and lets git write
"fatal: not a git repository" to the terminal when there is none: every `fp8lab trial` run from
a plain folder printed it. Inside `quiet_git_hash()` the same command runs with its stderr
captured; the value lm-eval records is unchanged (the hash, or None outside a repository).
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


def git_hash_quietly() -> str | None:
    """`git describe --always` of the working folder, or None (no repository, no git)."""
    try:
        proc = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


@contextmanager
def quiet_git_hash() -> Iterator[None]:
    """lm-eval's evaluator asks `git_hash_quietly` instead of its own noisy helper, for the call."""
    from lm_eval import evaluator

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = git_hash_quietly
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original
