"""lm-eval's environment report is collected once per environment (process and cache file), is
collected again when the environment changes or the cached one is a day old, and is recorded
unchanged."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from workloads.eval import env_info
from workloads.eval.env_info import MAX_AGE_S, env_info_once


@pytest.fixture
def collected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """torch's report replaced by a counter (the real one is a second of CPU and a dozen
    subprocesses); a fresh cache folder; this process's reports forgotten."""
    from torch.utils import collect_env

    calls: list[int] = []

    def collect() -> str:
        calls.append(1)
        return f"report {len(calls)}"

    monkeypatch.setattr(collect_env, "get_pretty_env_info", collect)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(env_info, "_REPORTS", {})
    return calls


def _recorded() -> str:
    from lm_eval.loggers.utils import add_env_info

    storage: dict = {}
    with env_info_once():
        add_env_info(storage)  # what simple_evaluate calls
    return storage["pretty_env_info"]


def test_the_report_is_collected_once_per_environment_and_recorded_as_lm_eval_records_it(
        collected: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import collect_env

    original = collect_env.get_pretty_env_info
    assert _recorded() == _recorded() == "report 1"
    monkeypatch.setattr(env_info, "_REPORTS", {})  # the next trial: a new process, same environment
    assert _recorded() == "report 1"
    assert collected == [1]
    assert collect_env.get_pretty_env_info is original  # put back after each block


def test_a_changed_environment_or_a_day_old_report_is_collected_again(collected: list[int],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert _recorded() == "report 1"
    monkeypatch.setattr(env_info, "_REPORTS", {})
    monkeypatch.setattr(env_info, "environment_key", lambda: "another")  # a package installed, say
    assert _recorded() == "report 2"
    monkeypatch.setattr(env_info, "_REPORTS", {})
    cached = env_info._cache_file("another")
    old = time.time() - MAX_AGE_S - 1
    os.utime(cached, (old, old))
    assert _recorded() == "report 3"
    assert collected == [1, 1, 1]


def test_installing_a_package_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packages = tmp_path / "site-packages"
    packages.mkdir()
    monkeypatch.setattr("sys.path", [*__import__("sys").path, str(packages)])
    before = env_info.environment_key()
    time.sleep(0.01)
    (packages / "newpkg-1.0.dist-info").mkdir()
    assert env_info.environment_key() != before


def test_an_unwritable_cache_only_costs_the_time(collected: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file where the folder should be
    assert _recorded() == "report 1"
