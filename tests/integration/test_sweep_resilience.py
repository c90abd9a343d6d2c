"""A sweep keeps its promises: a dead worker is retried into the same run (resuming from its
checkpoint). Ctrl-C and SIGTERM (unfinished runs KILLED, a rerun finishes only what is missing)
are in test_sweep_interrupt.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import EAGER_CASTS, TINY, client_for, run_cli, trial_runs

pytestmark = pytest.mark.integration


def test_killed_worker_is_retried_without_an_orphan_run(workdir: Path) -> None:
    marker = workdir / "killed-once"
    run_cli(["sweep", *TINY, "sweep.report=false", "cluster.num_cpus=2", "sweep.name=t-kill",
             "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]", "sweep.max_retries=1",
             "fault.kind=kill", "fault.step=3", f"fault.once_file={marker}"], workdir)
    assert marker.exists()  # the first attempt really was killed
    runs = trial_runs(workdir, "t-kill")
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED" and runs[0].data.tags["fp8lab.status"] == "FINISHED"
    assert "eval/accuracy" in runs[0].data.metrics


def test_killed_worker_resumes_from_its_checkpoint_with_a_complete_history(workdir: Path) -> None:
    marker = workdir / "killed-once"
    run_cli(["sweep", *TINY, "train.steps=12", "train.checkpoint_every=4", "sweep.report=false", "cluster.num_cpus=2",
             "sweep.name=t-resume", "sweep.axes.precision=[fp8_protected]", "sweep.axes.seed=[0,1]",
             "fault.kind=kill", "fault.step=7", f"fault.once_file={marker}"], workdir, env=EAGER_CASTS)
    assert marker.exists()
    runs = trial_runs(workdir, "t-resume")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    resumed = [r for r in runs if r.data.tags.get("fp8lab.resumed_from_step")]
    assert len(resumed) == 1 and resumed[0].data.tags["fp8lab.resumed_from_step"] == "4"
    client = client_for(workdir)
    for run in runs:  # every logged step exactly once, killed or not
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps == [2, 4, 6, 8, 10, 12], (run.info.run_name, steps)
    assert not any((workdir / "fp8lab-checkpoints").glob("*/checkpoint.pt"))  # cleaned up after success
