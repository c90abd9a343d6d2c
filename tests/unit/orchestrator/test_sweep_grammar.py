"""Hydra's multirun grammar on `fp8lab sweep`, through the CLI's parsing layer (no Ray, no MLflow):
comma lists, choice(), range() and glob() become sweep axes; a plain value of an axis key
narrows that axis; `fp8lab trial` refuses a sweep with one line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import build_parser, main
from orchestrator.config_loader import compose_config, to_container
from orchestrator.errors import UserInputError
from orchestrator.matrix import expand_sweep
from orchestrator.sweep_grammar import rewrite_sweep_overrides


def _cells(*argv: str) -> list[tuple]:
    """(policy, seed, extra axes) of every trial `fp8lab sweep <argv>` would plan."""
    args = build_parser().parse_args(["sweep", *argv])
    overrides = rewrite_sweep_overrides(args.overrides, args.config_dir).overrides
    specs = expand_sweep(overrides, to_container(compose_config(overrides)))
    return [(s.policy, s.seed, s.extra_axes) for s in specs]


def test_multirun_comma_lists_are_the_sweep_axes() -> None:
    cells = _cells("-m", "precision=bf16,fp8_protected", "seed=0,1", "train.lr=1e-4,3e-4")
    assert len(cells) == 8
    assert {c[0] for c in cells} == {"bf16", "fp8_protected"} and {c[1] for c in cells} == {0, 1}
    assert {c[2]["train.lr"] for c in cells} == {1e-4, 3e-4}
    args = build_parser().parse_args(["sweep", "--multirun", "seed=0,1"])
    assert args.multirun and rewrite_sweep_overrides(args.overrides).overrides == ["sweep.axes.seed=[0,1]"]


def test_range_choice_and_glob() -> None:
    cells = _cells("-m", "seed=range(2,5)", "precision=choice(bf16,fp8_naive)")
    assert sorted({c[1] for c in cells}) == [2, 3, 4] and len(cells) == 6
    ablations = _cells("precision=glob(fp8_*-*_scaling)", "seed=0")
    assert [c[0] for c in ablations] == ["fp8_naive-activation_scaling", "fp8_protected-dgrad_scaling"]


def test_plain_value_of_an_axis_narrows_it() -> None:
    assert _cells("precision=fp8_protected") == [("fp8_protected", 0, {}), ("fp8_protected", 1, {})]
    assert _cells("seed=5") == [("bf16", 5, {}), ("fp8_naive", 5, {}), ("fp8_protected", 5, {})]
    # an experiment's own axes narrow the same way; a key that is no axis stays a plain override
    assert _cells("experiment=ablations", "precision=bf16", "lora.r=4") == [("bf16", 0, {}), ("bf16", 1, {})]
    assert _cells("sweep.axes.seed=[0,1,2]", "seed=7") == [("bf16", 7, {}), ("fp8_naive", 7, {}), ("fp8_protected", 7, {})]


def test_sweeps_that_are_not_a_grid_are_refused_with_one_line() -> None:
    with pytest.raises(UserInputError) as info:
        rewrite_sweep_overrides(["train.lr=interval(1e-4,1e-3)", "sweep.axes.seed=0,1", "precision=glob(nothing_*)"])
    assert [p.split(":")[0] for p in info.value.problems] == ["train.lr", "sweep.axes.seed", "precision"]


def test_trial_refuses_a_sweep_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trial", "seed=0,1"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "seed" in errors[0] and "fp8lab sweep -m seed=0,1" in errors[0]


@pytest.mark.integration
def test_dry_run_shows_the_narrowed_multirun_matrix(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", "--dry-run", "-m", "precision=bf16,fp8_protected",
                           "seed=3", "train.lr=1e-4,3e-4"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 trials" in proc.stdout
    assert "seed=[3] (from seed=3)" in proc.stdout and "train.lr=[0.0001, 0.0003]" in proc.stdout
    assert "fp8_naive" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # a dry run writes nothing
