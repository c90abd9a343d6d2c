"""lm-eval's git hash lookup is silent outside a git repository (issue 28: every `fp8lab trial`
run from a plain folder printed "fatal: not a git repository")."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from workloads.eval.git_hash import quiet_git_hash

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git on PATH")


def test_outside_a_repository_nothing_is_printed_and_the_hash_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    from lm_eval import evaluator

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # never find a repository above
    evaluator.get_git_commit_hash()
    assert "not a git repository" in capfd.readouterr().err  # lm-eval's own helper: the noise
    with quiet_git_hash():
        assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""


def test_inside_a_repository_the_hash_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval import evaluator

    monkeypatch.chdir(tmp_path)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    with quiet_git_hash():
        assert evaluator.get_git_commit_hash() == head
