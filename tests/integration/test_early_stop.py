"""Early stop end to end (docs/health.md): a doomed trial (FP8-stored adapters never move) is
stopped at its verdict step, keeps its metrics and telemetry, is not evaluated, and the report
lists it; its healthy bf16 sibling runs to the end."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import EAGER_CASTS, TINY, client_for, run_cli

pytestmark = pytest.mark.integration


def test_doomed_trial_is_stopped_early_recorded_and_reported(workdir: Path) -> None:
    out = workdir / "report"
    proc = run_cli(["sweep", *TINY, "cluster.num_cpus=2", "sweep.name=t-early", "sweep.early_stop=true",
                    "health.at=2", "sweep.axes.precision=[bf16,fp8_unscaled_fp8_adapters]", "sweep.axes.seed=[0]",
                    f"report.out={out}"], workdir, env=EAGER_CASTS)
    client = client_for(workdir)
    exp = client.get_experiment_by_name("t-early")
    runs = {r.data.tags["fp8lab.policy"]: r for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("fp8lab.role") == "trial"}
    stopped, healthy = runs["fp8_unscaled_fp8_adapters"], runs["bf16"]
    tags, metrics = stopped.data.tags, stopped.data.metrics
    assert stopped.info.status == "FINISHED" and tags["fp8lab.status"] == "STOPPED_EARLY"
    assert tags["fp8lab.health.verdict"] == "doomed" and tags["fp8lab.health.step"] == "2"
    assert "adapters frozen" in tags["fp8lab.stopped_early"] and "adapters frozen" in tags["fp8lab.reason"]
    assert metrics["train/steps_done"] == 2 and metrics["health/adapter_movement_min"] == 0
    assert "eval/accuracy" not in metrics  # not evaluated: the compute early stop saves
    assert "telemetry/lora_weight/underflow_pct" in metrics
    assert [f.path for f in client.list_artifacts(stopped.info.run_id, "telemetry")] == ["telemetry/telemetry.parquet"]
    assert healthy.data.tags["fp8lab.status"] == "FINISHED" and "eval/accuracy" in healthy.data.metrics
    assert healthy.data.tags["fp8lab.health.verdict"] in ("healthy", "at_risk")
    assert "STOPPED_EARLY" in proc.stdout

    report = next(out.glob("*/report.md")) if not (out / "report.md").exists() else out / "report.md"
    text = report.read_text()
    section = text[text.index("Early warning"):]
    assert "1 stopped early" in text and "fp8_unscaled_fp8_adapters-s0" in section
    assert "2/6" in section and "doomed: adapters frozen" in section
