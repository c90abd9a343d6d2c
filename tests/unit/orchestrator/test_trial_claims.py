"""Reliability round 3, cases 5 and 10 at unit level: a per-trial claim (one trial id trains at
most once at a time in a store), `fp8lab report` closing single trials whose process is gone,
the stale `driver lost` reason cleared from a parent a rerun completed, and a lost driver's
checkpointed run reopened by the rerun instead of a new run that throws the checkpoint away."""
from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from fp8lab_conf.contracts import (
    CHECKPOINT_OWNER_FILE, ROLE_TRIAL, TAG_DRIVER_LOST, TAG_REASON, TAG_ROLE, TAG_STATUS, TAG_SWEEP_ID, TAG_TRIAL_ID,
)
from orchestrator import lease, runs, trial_claim
from tests.support.synthetic import artifacts_beside


def _store(tmp_path: Path) -> tuple[str, MlflowClient, str]:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    lease.ready_store(uri)
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("e", artifact_location=artifacts_beside(uri))


def _trial_run(client: MlflowClient, experiment_id: str, trial_id: str, **tags: str) -> str:
    return client.create_run(experiment_id, tags={TAG_ROLE: ROLE_TRIAL, TAG_TRIAL_ID: trial_id, **tags}).info.run_id


def test_a_claimed_trial_cannot_be_claimed_again_until_released(tmp_path: Path) -> None:
    uri, _, _ = _store(tmp_path)
    first, second = trial_claim.TrialClaim(uri, "t1"), trial_claim.TrialClaim(uri, "t1")
    assert first.acquire() and trial_claim.claim_alive(uri, "t1")
    assert not second.acquire()
    assert "pid " in second.holder()
    assert trial_claim.TrialClaim(uri, "t2").acquire()  # another trial id is not blocked
    first.release()
    assert not trial_claim.claim_alive(uri, "t1") and second.acquire()
    second.release()


def test_report_closes_a_single_trial_whose_process_is_gone(tmp_path: Path) -> None:
    uri, client, experiment_id = _store(tmp_path)
    lost = _trial_run(client, experiment_id, "gone")  # RUNNING, nobody holds its claim
    alive = _trial_run(client, experiment_id, "alive")
    in_sweep = _trial_run(client, experiment_id, "swept", **{TAG_SWEEP_ID: "s1"})  # the sweep lease's business
    claim = trial_claim.TrialClaim(uri, "alive")
    assert claim.acquire()
    try:
        lines = runs.close_lost_in_store(uri)
    finally:
        claim.release()
    gone = [line for line in lines if "its process is gone" in line]
    assert len(gone) == 1 and lost in gone[0], lines
    closed = client.get_run(lost)
    assert closed.info.status == "KILLED" and closed.data.tags[TAG_REASON] == runs.PROCESS_LOST
    assert client.get_run(alive).info.status == "RUNNING"
    assert client.get_run(in_sweep).data.tags[TAG_REASON] == lease.DRIVER_LOST  # closed by the sweep rule, not this one


def test_a_completed_rerun_clears_the_parents_driver_lost_reason(tmp_path: Path) -> None:
    _, client, experiment_id = _store(tmp_path)
    parent = client.create_run(experiment_id, tags={TAG_REASON: lease.DRIVER_LOST, TAG_DRIVER_LOST: "pid 1 on h"}).info.run_id
    runs.finish_parent(client, parent, "FINISHED")
    tags = client.get_run(parent).data.tags
    assert TAG_REASON not in tags and TAG_DRIVER_LOST not in tags
    killed = client.create_run(experiment_id, tags={TAG_REASON: "sweep interrupted"}).info.run_id
    runs.finish_parent(client, killed, "KILLED")  # an interrupted sweep keeps its reason
    assert client.get_run(killed).data.tags[TAG_REASON] == "sweep interrupted"


def test_the_rerun_of_a_lost_driver_reopens_its_checkpointed_run(tmp_path: Path) -> None:
    _, client, experiment_id = _store(tmp_path)
    run_id = _trial_run(client, experiment_id, "t1", **{TAG_REASON: lease.DRIVER_LOST, TAG_DRIVER_LOST: "pid 1 on h"})
    client.set_terminated(run_id, "KILLED")
    checkpoints = tmp_path / "ckpt"
    assert runs.reopen_lost_run(client, experiment_id, "t1", checkpoints) is None  # no checkpoint: a new run
    (checkpoints / "t1").mkdir(parents=True)
    (checkpoints / "t1" / "checkpoint.pt").write_bytes(b"x")
    (checkpoints / "t1" / CHECKPOINT_OWNER_FILE).write_text(run_id)
    assert runs.reopen_lost_run(client, experiment_id, "t1", checkpoints) == run_id
    run = client.get_run(run_id)
    assert run.info.status == "SCHEDULED" and run.data.tags[TAG_STATUS] == "SCHEDULED"
    assert TAG_DRIVER_LOST not in run.data.tags
    assert runs.reopen_lost_run(client, experiment_id, "t1", checkpoints) is None  # not KILLED any more


def test_a_trial_finished_elsewhere_after_the_plan_is_reused_not_trained_again(tmp_path: Path) -> None:
    """Another sweep claimed, trained and released trial t1 between this sweep's plan and its
    claim, so this sweep never saw the claim held: the free claim must still not train it twice."""
    from types import SimpleNamespace
    uri, client, experiment_id = _store(tmp_path)
    done = _trial_run(client, experiment_id, "t1", **{TAG_STATUS: "FINISHED"})
    plan = SimpleNamespace(tracking_uri=uri, force=False, skipped={})
    printed: list[str] = []
    claims = trial_claim.SweepClaims(plan, client, experiment_id, SimpleNamespace(print=lambda line, **_: printed.append(line)),
                                     runs.finished_trials)
    assert not claims.take(0, SimpleNamespace(trial_id="t1", run_name="bf16-s0"))
    assert plan.skipped == {"t1": done} and "finished by another sweep" in printed[0]
    assert not trial_claim.claim_alive(uri, "t1")  # the claim taken for the check is given back
    assert claims.take(1, SimpleNamespace(trial_id="t2", run_name="bf16-s1"))  # an unfinished trial is trained here
    claims.held["t2"].release()


def test_two_drivers_creating_one_new_experiment_both_get_its_id(tmp_path: Path) -> None:
    """The loser of the create race (it saw no experiment, then the other driver made it) reads
    the winner's id instead of failing with RESOURCE_ALREADY_EXISTS."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    winner = client.create_experiment("sweep")

    class LateClient:  # the lookup ran before the winner's create
        def __init__(self) -> None:
            self.lookups = 0

        def get_experiment_by_name(self, name: str):
            self.lookups += 1
            return None if self.lookups == 1 else client.get_experiment_by_name(name)

        def __getattr__(self, attribute: str):
            return getattr(client, attribute)

    assert runs.ensure_experiment(LateClient(), "sweep", None) == winner
