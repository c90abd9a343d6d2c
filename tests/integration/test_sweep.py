"""`fp8lab sweep` end to end on a local Ray (CPU): MLflow layout, dedupe, failures, GPU assignment."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import EAGER_CASTS, TINY, client_for, run_cli

pytestmark = pytest.mark.integration

NO_REPORT = ["sweep.report=false", "cluster.num_cpus=2"]


def _runs(workdir: Path, experiment: str) -> tuple[list, list]:
    client = client_for(workdir)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("fp8lab.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("fp8lab.role") == "trial"]
    return parents, children


def test_sweep_layout_failures_and_rerun(tmp_path: Path) -> None:
    workdir = tmp_path  # bare, no seeded store: this sweep creates its store as a first sweep does
    args = ["sweep", *TINY, *NO_REPORT, "sweep.name=t-sweep", "sweep.axes.precision=[bf16,fp8_protected]",
            "sweep.axes.seed=[0]", "sweep.axes={fault.kind:[null,raise]}", "fault.step=2"]
    first = run_cli(args, workdir, check=False, env=EAGER_CASTS)
    assert first.returncode == 1, first.stdout + first.stderr  # a FAILED trial -> exit 1, sweep finished
    parents, children = _runs(workdir, "t-sweep")
    assert len(parents) == 1 and len(children) == 4
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    # the collapsed runs list shows the matrix and the comparison: params and per-policy means
    assert parent.data.params["sweep.axes.precision"] == "['bf16', 'fp8_protected']"
    assert parent.data.params["sweep.n_trials"] == "4" and "lora.r" in parent.data.params
    for policy in ("bf16", "fp8_protected"):  # the FAILED cell of each policy does not count
        assert parent.data.metrics[f"summary/{policy}/n"] == 1
        assert 0 <= parent.data.metrics[f"summary/{policy}/accuracy"] <= 1
    sweep_id = parent.data.tags["fp8lab.sweep_id"]
    by_status: dict[str, list] = {}
    for run in children:
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id and tags["fp8lab.sweep_id"] == sweep_id
        assert tags["fp8lab.policy"] in ("bf16", "fp8_protected") and tags["fp8lab.seed"] == "0"
        assert tags["fp8lab.axis.fault.kind"] in ("None", "raise")
        by_status.setdefault(tags["fp8lab.status"], []).append(run)
    assert len(by_status["FINISHED"]) == 2 and len(by_status["FAILED"]) == 2
    for run in by_status["FINISHED"]:
        assert run.info.status == "FINISHED"
        assert "eval/accuracy" in run.data.metrics and "train/tokens_per_s" in run.data.metrics
    for run in by_status["FAILED"]:
        assert run.info.status == "FAILED" and "injected fault at step 2" in run.data.tags["fp8lab.reason"]
    assert "run_name" in first.stdout or "bf16-s0" in first.stdout
    # a child run starts when its trial gets a slot (2 slots, 4 trials): MLflow's Duration is the trial's own
    ordered = sorted(children, key=lambda r: r.info.start_time)
    first_done = min(r.info.end_time for r in ordered[:2])
    assert all(r.info.start_time >= first_done for r in ordered[2:]), [(r.info.start_time, r.info.end_time) for r in ordered]
    for run in by_status["FINISHED"]:
        assert {"trial/queue_s", "train/step_s", "train/tokens_per_s_mean", "sys/loadavg_start"} <= set(run.data.metrics)

    dry = run_cli([*args, "--dry-run"], workdir, env=EAGER_CASTS)
    assert dry.stdout.count("skip (FINISHED)") == 2

    second = run_cli(args, workdir, check=False, env=EAGER_CASTS)
    assert "2 trials (2 already finished)" in second.stdout
    parents, children = _runs(workdir, "t-sweep")
    assert len(parents) == 1 and len(children) == 6  # only the two FAILED cells ran again
    assert parents[0].data.metrics["summary/bf16/n"] == 1  # the trial finished by the first run still counts


def test_each_concurrent_trial_sees_its_own_gpu(workdir: Path) -> None:
    """Two logical GPUs declared on a CPU Ray: the two parallel trials get different device ids."""
    run_cli(["sweep", *TINY, *NO_REPORT, "sweep.name=t-gpu", "cluster.num_gpus=2", "cluster.gpus_per_trial=1",
             "train.device=cpu", "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0,1]"], workdir)
    _, children = _runs(workdir, "t-gpu")
    devices = sorted(r.data.tags["fp8lab.cuda_visible_devices"] for r in children)
    assert devices == ["0", "1"]
