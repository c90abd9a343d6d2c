"""`fp8lab report` options (issue 28, item 5): `--no-log` leaves the store byte-for-byte as it was;
several `--sweep` / `--experiment` values combine into one report whose comparisons stay within the
same model (the old parser kept the last `--sweep` only)."""
from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import pytest

from orchestrator import cli
from tests.support.synthetic import SynthTrial, write_sweep


def _trials(bf16: float, fp8: float, sweep: str) -> list[SynthTrial]:
    """Three seeds per policy; trial ids differ between sweeps (they hash the config, model included)."""
    return [SynthTrial(policy, seed, accuracy=acc + 0.01 * seed, trial_id=f"{sweep}-{policy}-{seed}")
            for policy, acc in (("bf16", bf16), ("fp8_naive", fp8)) for seed in range(3)]


@pytest.fixture()
def store(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Two sweeps on different models: fp8 loses 2 points on the small one, 20 on the large one.
    write_sweep(uri, "exp-a", "sw-small", _trials(0.50, 0.48, "sw-small"), params={"model.name_or_path": "embedded"},
                telemetry=False, base_time_ms=1_700_000_000_000)
    write_sweep(uri, "exp-b", "sw-large", _trials(0.90, 0.70, "sw-large"), params={"model.name_or_path": "smollm2-135m"},
                telemetry=False, base_time_ms=1_700_001_000_000)
    return uri


def _store_digest(uri: str) -> dict[str, str]:
    root = Path(uri.removeprefix("sqlite:///")).parent
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "rep" not in p.parts}


def _summary(out: Path) -> list[dict[str, str]]:
    with (out / "summary.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_no_log_leaves_the_store_untouched(store: str, tmp_path: Path) -> None:
    before = _store_digest(store)
    assert cli.main(["report", "--sweep", "sw-small", "--no-log", "--out", str(tmp_path / "rep"), f"tracking.uri={store}"]) == 0
    assert (tmp_path / "rep" / "report.md").exists()
    assert _store_digest(store) == before
    assert cli.main(["report", "--sweep", "sw-small", "--out", str(tmp_path / "rep2"), f"tracking.uri={store}"]) == 0
    assert _store_digest(store) != before  # without --no-log the report is logged to the parent run


def test_two_sweeps_combine_and_compare_within_the_same_model(store: str, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    assert cli.main(["report", "--sweep", "sw-small", "--sweep", "sw-large", "--no-log", "--out", str(out),
                     f"tracking.uri={store}"]) == 0
    rows = _summary(out)
    deltas = {(r["policy"], r["axis.model.name_or_path"]): float(r["delta_pts"]) for r in rows if r["policy"] != "bf16"}
    assert deltas == {("fp8_naive", "embedded"): pytest.approx(-2.0), ("fp8_naive", "smollm2-135m"): pytest.approx(-20.0)}
    assert "sw-small, sw-large" in (out / "report.md").read_text()


def test_two_experiments_combine(store: str, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    assert cli.main(["report", "--experiment", "exp-a", "--experiment", "exp-b", "--no-log", "--out", str(out),
                     f"tracking.uri={store}"]) == 0
    assert {r["axis.model.name_or_path"] for r in _summary(out)} == {"embedded", "smollm2-135m"}
