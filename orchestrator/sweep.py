"""`fp8lab sweep`: run a plan (`orchestrator.plan`) on Ray, tracked in MLflow.

Order matters: everything that can be wrong with the input is found (config, files, tracking
store, cluster resources) before a single MLflow run is created, so bad input leaves nothing
behind. An interrupt (Ctrl-C / SIGTERM) cancels the trials and marks their runs KILLED.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from rich.live import Live

from orchestrator import progress as progress_mod
from orchestrator import lease as lease_mod
from orchestrator import ray_runner, sweep_summary, runs, trial_claim
from orchestrator.interrupts import interrupts_raise, signals_deferred
from orchestrator.matrix import policy_label, resolved_yaml
from orchestrator.params import trial_params
from orchestrator.plan import SweepPlan


@dataclass
class SweepOutcome:
    plan: SweepPlan
    results: dict[str, dict[str, Any]]
    parent_run_id: str | None
    makespan_s: float
    slots: int
    interrupted: bool = False


def run_sweep(plan: SweepPlan, console: Any) -> SweepOutcome:
    """Schedule the plan's trials on Ray, show live progress, return every result.

    The sweep's lease is taken first (`orchestrator.lease`): a second driver of the same sweep is
    refused before it starts Ray. On a local Ray the MLflow store and experiment are set up in a
    thread while Ray starts (a fresh SQLite store takes seconds to create): the plan has already
    checked everything that could refuse a local sweep (`ray_runner.check_local_resources`), so
    nothing is written for a sweep that then does not run. Against a cluster, the cluster is
    checked first.
    """
    cluster = plan.config["cluster"]
    with lease_mod.SweepLease(plan.tracking_uri, plan.sweep_id) as lease, ThreadPoolExecutor(max_workers=1) as pool:
        early = None if cluster["address"] else pool.submit(_experiment_for, plan)
        ray_runner.init_ray(cluster)
        try:
            ray_runner.check_resources(cluster)
            runs.check_store_for_cluster(ray_runner.node_count(), cluster, plan.tracking_uri, plan.config["tracking"]["artifact_location"])
            experiment_id = early.result() if early else _experiment_for(plan)
            return _execute(plan, console, cluster, experiment_id, lease)
        finally:
            import ray

            ray.shutdown()


def _experiment_for(plan: SweepPlan) -> str:
    lease_mod.ready_store(plan.tracking_uri)
    client = MlflowClient(plan.tracking_uri)
    return runs.ensure_experiment(client, plan.config["sweep"]["name"], plan.config["tracking"]["artifact_location"])


def _take_over(plan: SweepPlan, client: MlflowClient, experiment_id: str, lease: lease_mod.SweepLease, console: Any) -> None:
    """With the lease held: refuse a live driver of a server store, close what a lost driver left
    RUNNING, and recount what is finished (a driver that held the lease until a moment ago may
    have finished trials this plan still meant to run)."""
    parent = runs.find_parent(client, experiment_id, plan.sweep_id)
    if parent:
        lease.check_parent(client.get_run(parent).data.tags)
    for line in runs.close_lost_runs(client, plan.tracking_uri, experiment_id, plan.sweep_id, own=True):
        console.print(line)
    if not plan.force:
        finished = runs.finished_trials(client, experiment_id)
        plan.skipped = {s.trial_id: finished[s.trial_id] for s in plan.specs if s.trial_id in finished}


def _execute(plan: SweepPlan, console: Any, cluster: dict[str, Any], experiment_id: str,
             lease: lease_mod.SweepLease) -> SweepOutcome:
    client = MlflowClient(plan.tracking_uri)
    runs.check_artifact_root(ray_runner.node_count(), client.get_experiment(experiment_id).artifact_location, plan.config["sweep"]["name"])
    _take_over(plan, client, experiment_id, lease, console)
    parent = runs.open_parent_run(client, experiment_id, plan.sweep_id, plan.config["sweep"]["name"],
                                      resolved_yaml(plan.config), [s.trial_id for s in plan.specs])
    lease.start_heartbeat(client, parent)
    sweep_summary.log_sweep_params(client, parent, plan.config, len(plan.specs))
    board = progress_mod.ProgressBoard.remote()
    results: dict[str, dict[str, Any]] = {}
    run_ids: dict[str, str] = {}
    started = time.time()
    interrupted = False
    refs: dict = {}
    queue = list(enumerate(plan.to_run))
    claims = trial_claim.SweepClaims(plan, client, experiment_id, console, runs.finished_trials)
    slots = ray_runner.parallel_slots(cluster)

    def launch() -> list:
        """Fill the free slots: claim each next trial (`orchestrator.trial_claim`), create its run
        and submit it. Runs are created when a slot is free, so a child run's MLflow start time
        (and Duration) is its trial's, not the sweep's. A trial another process is training waits."""
        claims.release_done(results)
        queue[:0] = claims.ready_again()
        new = []
        while queue and len(refs) - len(results) < slots:
            index, spec = queue.pop(0)
            if not claims.take(index, spec):
                continue
            config = _for_workers(spec.config)
            with signals_deferred():  # a run created is a run recorded (and so closed if interrupted)
                run_ids[spec.trial_id] = (runs.reopen_lost_run(client, experiment_id, spec.trial_id, Path(config["train"]["checkpoint_dir"]))
                                          or runs.create_trial_run(client, experiment_id, spec, plan.sweep_id, parent, trial_params(spec.config)))
                trial = ray_runner.TrialLaunch(config, spec.trial_id, run_ids[spec.trial_id],
                                               plan.tracking_uri, policy_label(spec.config))
                ref = ray_runner.submit(trial, board, cluster, plan.config["sweep"]["max_retries"], index)
                refs[ref] = spec.trial_id
                new.append(ref)
        return new

    try:
        with interrupts_raise():
            launch()
            _wait_with_table(plan, refs, board, results, console, launch, claims.waiting)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM as Interrupted
        interrupted = True
        _cancel(refs)
    finally:
        claims.release_all()
    makespan = time.time() - started
    if plan.config["sweep"].get("speed_probe") and not interrupted:
        _speed_probe(plan, client, parent, console)
    unfinished = runs.with_retries(client, experiment_id, [run_ids[t] for t in run_ids if t not in results])
    _record_failures(client, run_ids, results)
    sweep_summary.log_policy_summary(client, parent, results, plan.skipped)
    runs.close_unfinished(client, unfinished, "KILLED", "sweep interrupted" if interrupted else "no result")
    runs.finish_parent(client, parent, "KILLED" if interrupted else "FINISHED")
    return SweepOutcome(plan, results, parent, makespan, ray_runner.parallel_slots(cluster), interrupted)


def _speed_probe(plan: SweepPlan, client: MlflowClient, parent: str, console: Any) -> None:
    """The paired speed probe, once, after the trials: a failure is printed, never fails the sweep."""
    from orchestrator import speed_probe_run

    try:
        console.print(speed_probe_run.run_and_log(client, parent, plan.config, _probe_overrides(plan)), markup=False, highlight=False)
    except Exception as exc:  # noqa: BLE001 - the trials' results stand without it
        console.print(f"speed probe failed: {type(exc).__name__}: {exc}", markup=False)


def _probe_overrides(plan: SweepPlan) -> list[str]:
    """The overrides of the sweep's first cell without its axis values: the probe's base config."""
    first = plan.specs[0] if plan.specs else None
    axes = {f"{k}=" for k in (first.axis_values if first else {})}
    return [o for o in (first.overrides if first else ()) if not any(o.startswith(a) for a in axes)]


def _for_workers(config: dict[str, Any]) -> dict[str, Any]:
    """Paths a worker must agree on with the driver, made absolute (workers may run elsewhere)."""
    train = dict(config["train"])
    train["checkpoint_dir"] = str(Path(train["checkpoint_dir"] or "fp8lab-checkpoints").expanduser().resolve())
    return {**config, "train": train}


def _wait_with_table(plan: SweepPlan, refs: dict, board: Any, results: dict, console: Any,
                     refill: Any = None, waiting: Any = None) -> None:
    """A live table on a terminal; in a log (no terminal) one line per trial state change."""
    import ray

    title = f"sweep {plan.sweep_id} — {len(plan.to_run)} trials ({len(plan.skipped)} already finished)"
    names = {s.trial_id: s.run_name for s in plan.to_run}
    last_state: dict[str, str] = {}

    def rows_now() -> dict:
        rows = ray.get(board.snapshot.remote())
        for trial_id, result in results.items():
            rows.setdefault(trial_id, {}).update(state=result["status"])
        return rows

    def log_changes(rows: dict) -> None:
        for trial_id, row in rows.items():
            state = row.get("state", "PENDING")
            if last_state.get(trial_id) != state:
                last_state[trial_id] = state
                console.print(f"[{time.strftime('%H:%M:%S')}] {names.get(trial_id, trial_id)}: {state}")
            if row.get("health") and last_state.get(trial_id + "/health") != row["health"]:
                last_state[trial_id + "/health"] = row["health"]
                console.print(f"[{time.strftime('%H:%M:%S')}] {names.get(trial_id, trial_id)}: health {row['health']}",
                              markup=False)

    def on_result(trial_id: str, result: dict[str, Any]) -> None:
        results[trial_id] = result

    if not console.is_terminal:
        console.print(title)
        ray_runner.wait_all(refs, lambda: log_changes(rows_now()), on_result, refill=refill, waiting=waiting)
        return
    with Live(progress_mod.render_table(plan.to_run, {}, 0, title), console=console, refresh_per_second=2) as live:
        ray_runner.wait_all(refs, lambda: live.update(progress_mod.render_table(plan.to_run, rows_now(), 0, title)), on_result,
                            refill=refill, waiting=waiting)


def _cancel(refs: dict) -> None:
    import ray

    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - already finished or gone
            pass


def _record_failures(client: MlflowClient, run_ids: dict[str, str], results: dict[str, dict[str, Any]]) -> None:
    """A worker that died past its retries could not close its run: do it here with the reason."""
    for trial_id, result in results.items():
        if result["status"] == "FAILED":  # the worker's own run: a retry may have moved to a fresh attempt run
            attempt = result.get("mlflow_run_id") or run_ids[trial_id]
            runs.close_unfinished(client, list(dict.fromkeys([run_ids[trial_id], attempt])), "FAILED", result.get("reason", ""))
