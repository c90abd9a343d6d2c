"""Discoverability (issue 28, item 6): `fp8lab policies` lists the policy registry, `--help` the
config groups, `--info` every group's options and the search path; Hydra's app flags that have no
meaning here are refused with one line naming the alternative."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.discover import config_groups, policy_rows


def test_policies_come_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.precision.policy import available_policies, get_policy

    rows = {r["name"]: r for r in policy_rows()}
    assert list(rows) == available_policies()
    for name, row in rows.items():
        policy = get_policy(name)
        assert row["version"] == policy.version and row["ladder_base"] == policy.ladder_base
        assert row["description"] and "\n" not in row["description"]
    assert cli.main(["policies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    naive = next(line for line in lines if line.startswith("fp8_naive "))
    assert naive.split()[1] == str(get_policy("fp8_naive").version)
    rung = next(line for line in lines if line.startswith("fp8_protected-calibration "))
    assert rung.split()[2] == "fp8_protected"


def test_help_lists_the_config_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "config groups" in out and "policies" in out
    model_line = next(line for line in out.splitlines() if line.strip().startswith("model "))
    assert "embedded" in model_line and "smollm2-135m" in model_line


def test_info_lists_every_option_and_the_users_config_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("name_or_path: /models/mine\n")
    assert cli.main(["trial", "--info", "--config-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out
    assert "model: embedded*, smollm2-135m, mine" in out
    assert all(f"{group}:" in out for group in config_groups())
    precision = next(line for line in out.splitlines() if line.strip().startswith("precision:"))
    assert "fp8_protected-calibration" in precision and "bf16*" in precision


@pytest.mark.parametrize("argv,alternative", [
    (["trial", "--cfg", "hydra"], "--cfg job"),
    (["sweep", "--shell-completion", "install=bash"], "fp8lab --help"),
    (["trial", "-sc", "install=bash"], "fp8lab --help"),
    (["trial", "--hydra-help"], "--info"),
])
def test_hydra_app_flags_are_refused_with_the_alternative(argv: list[str], alternative: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fp8lab: error: ") and alternative in err[0]
