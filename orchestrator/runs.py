"""Driver-side MLflow: experiments, the sweep's parent run, one child run per trial, dedupe.

The driver creates every run (so names, nesting and tags are uniform and a retried trial
writes into the run it was given instead of leaving an orphan) and closes any run a trial
could not close (worker died, sweep interrupted).
"""
from __future__ import annotations

import functools
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from fp8lab_conf.contracts import (
    CHECKPOINT_OWNER_FILE,
    ROLE_SWEEP, ROLE_TRIAL, TAG_AXIS_PREFIX, TAG_DRIVER, TAG_DRIVER_LOST, TAG_POLICY, TAG_REASON, TAG_ROLE, TAG_SEED,
    TAG_RETRY_OF, TAG_STATUS, TAG_SWEEP_ID, TAG_SWEEP_NAME, TAG_TRIAL_ID, TAG_VERSION,
)
from orchestrator.errors import UserInputError
from fp8lab_conf.filesystem import folder_is_writable
from orchestrator.matrix import TrialSpec

MIN_FREE_BYTES = 16 * 2**20  # a sweep's runs, params and metrics need some room; less is a full disk
COMPLETE = ("FINISHED", "DIVERGED")  # trial statuses that are a result; FAILED/KILLED are rerun


def check_store(uri: str, timeout_s: float = 5.0) -> None:
    """Refuse early, with one line, when the tracking store cannot be reached or written."""
    from orchestrator.store_checks import store_kind_problems  # noqa: PLC0415

    problems = store_kind_problems(uri)
    if problems:
        raise UserInputError(problems)
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).read()
        except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserInputError(f"tracking.uri: MLflow server {uri} is not reachable ({reason}) "
                                 "(fix: start it, or use tracking.uri=sqlite:///mlflow.db)") from None
    elif parsed.scheme == "sqlite":
        folder = Path(uri.removeprefix("sqlite:///")).expanduser().resolve().parent
        if not folder.is_dir():
            raise UserInputError(f"tracking.uri: folder {folder} does not exist (fix: create it or point tracking.uri elsewhere)")
        if not folder_is_writable(folder):
            raise UserInputError(f"tracking.uri: folder {folder} is not writable (fix: choose a writable folder)")
        free = shutil.disk_usage(folder).free
        if free < MIN_FREE_BYTES:
            raise UserInputError(f"tracking.uri: the disk holding {folder} is full ({free // 1024} KiB free) "
                                 "(fix: free space, or point tracking.uri=sqlite:///<path on another disk>/mlflow.db)")
    elif parsed.scheme not in ("file", "") and parsed.scheme.split("+")[0] not in ("postgresql", "mysql", "databricks"):
        raise UserInputError(f"tracking.uri: unsupported scheme '{parsed.scheme}' (fix: sqlite:///mlflow.db or http://host:port)")


_FILE_SCHEMES = ("", "file", "sqlite")  # a store or artifact root on the driver's own disk


def check_store_for_cluster(nodes: int, cluster: dict[str, Any], tracking_uri: str, artifact_location: str | None) -> None:
    """Trials on other nodes cannot write a file on the driver's disk: refuse a file store (SQLite,
    ./mlruns) or a local artifact folder when the cluster has several `nodes` or is reached through
    Ray Client. An autoscaling cluster that has only its head node now is not caught: use a server.
    The caller counts the nodes (the Ray module), so these rules stay free of Ray."""
    remote_client = str(cluster.get("address") or "").startswith("ray://")
    if nodes <= 1 and not remote_client:
        return
    where = f"{nodes} nodes" if nodes > 1 else "Ray Client (the driver is not on the cluster)"
    if urlparse(tracking_uri).scheme in _FILE_SCHEMES:
        raise UserInputError(f"tracking.uri: {tracking_uri} is a file on this machine, but the Ray cluster has {where} and "
                             "trials on other nodes cannot write it (fix: run an MLflow server, see infra/mlflow, and set "
                             "tracking.uri=http://HOST:5000)")
    if artifact_location and urlparse(artifact_location).scheme in _FILE_SCHEMES:
        raise UserInputError(f"tracking.artifact_location: {artifact_location} is a local folder, but the Ray cluster has "
                             f"{where}: each trial would write artifacts to its own node's disk (fix: leave it null so the "
                             "MLflow server's proxied artifact store is used, or give an s3:// URI)")


def check_artifact_root(nodes: int, artifact_uri: str, experiment: str) -> None:
    """An experiment whose artifact root is a local path makes each trial write to its own node's disk."""
    if nodes > 1 and urlparse(artifact_uri).scheme in _FILE_SCHEMES:
        raise UserInputError(f"tracking: experiment '{experiment}' stores artifacts in {artifact_uri}, a local folder, but the "
                             "Ray cluster has several nodes (fix: start the MLflow server with --serve-artifacts and "
                             "--artifacts-destination s3://..., then use a new sweep.name)")


def absolute_uri(uri: str) -> str:
    """Trials run in other processes (and maybe other folders): make sqlite paths absolute."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).expanduser().resolve())
    return uri


def ensure_experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """The experiment's id, created if new. Two drivers starting the same new sweep at once both
    see no experiment; the one that loses the create reads the winner's instead of crashing."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    return experiment.experiment_id


def find_parent(client: MlflowClient, experiment_id: str, sweep_id: str) -> str | None:
    runs = client.search_runs([experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_SWEEP}' and tags.`{TAG_SWEEP_ID}` = '{sweep_id}'",
                              max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


def open_parent_run(client: MlflowClient, experiment_id: str, sweep_id: str, sweep_name: str, config_yaml: str,
                    trial_ids: list[str] | None = None) -> str:
    """The sweep's parent run; rerunning the same sweep reopens it so all its trials stay together.

    `sweep/trials.json` lists every trial id of the sweep, including those skipped because an
    earlier sweep already finished them, so the report can pull those runs in."""
    run_id = find_parent(client, experiment_id, sweep_id)
    if run_id is None:
        tags = {MLFLOW_RUN_NAME: f"sweep-{sweep_id[:8]}", TAG_ROLE: ROLE_SWEEP,
                TAG_SWEEP_ID: sweep_id, TAG_SWEEP_NAME: sweep_name}
        run_id = client.create_run(experiment_id, tags=tags, run_name=tags[MLFLOW_RUN_NAME]).info.run_id
    else:
        client.update_run(run_id, status="RUNNING")
    client.log_text(run_id, config_yaml, "sweep/config.yaml")
    client.log_dict(run_id, sorted(trial_ids or []), "sweep/trials.json")
    return run_id


def create_trial_run(client: MlflowClient, experiment_id: str, spec: TrialSpec, sweep_id: str | None,
                     parent_run_id: str | None, params: dict[str, Any]) -> str:
    """A child run for one trial, created SCHEDULED; the trial marks it RUNNING when it starts."""
    tags = {
        MLFLOW_RUN_NAME: spec.run_name, TAG_ROLE: ROLE_TRIAL, TAG_TRIAL_ID: spec.trial_id,
        TAG_POLICY: spec.policy, TAG_SEED: str(spec.seed), TAG_STATUS: "SCHEDULED",
        **{f"{TAG_AXIS_PREFIX}{k}": str(v) for k, v in spec.extra_axes.items()},
    }
    tags.update(dict(source_tags()))
    if sweep_id:
        tags[TAG_SWEEP_ID] = sweep_id
    if parent_run_id:
        tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
    run_id = client.create_run(experiment_id, tags=tags, run_name=spec.run_name).info.run_id
    _log_params(client, run_id, params)
    client.update_run(run_id, status="SCHEDULED")
    return run_id


@functools.lru_cache(maxsize=1)
def source_tags() -> dict[str, str]:
    """fp8lab's version and, from a checkout, its git commit (the report's Environment section)."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    tags = {}
    try:
        tags[TAG_VERSION] = version("fp8lab")
    except PackageNotFoundError:
        pass
    source = Path(__file__).resolve().parent.parent
    proc = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if proc.returncode == 0 and proc.stdout.strip():
        tags["mlflow.source.git.commit"] = proc.stdout.strip()
    return tags


def _log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100])


def finished_trials(client: MlflowClient, experiment_id: str) -> dict[str, str]:
    """trial_id -> run_id of every trial with a complete result (FINISHED or DIVERGED: a rerun of a
    diverged config diverges again) in the experiment. FAILED and KILLED trials are rerun."""
    found: dict[str, str] = {}
    page_token = None
    while True:
        page = client.search_runs([experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'",  # MLflow has no IN for tags
                                  max_results=1000, page_token=page_token)
        for run in page:
            if run.data.tags.get(TAG_STATUS) in COMPLETE:
                found.setdefault(run.data.tags[TAG_TRIAL_ID], run.info.run_id)
        page_token = page.token
        if not page_token:
            return found


def with_retries(client: MlflowClient, experiment_id: str, run_ids: list[str]) -> list[str]:
    """`run_ids` and the fresh attempt runs a retried worker moved to from them (tag
    `fp8lab.retry_of`, workloads/record/attempts.py), so an interrupted sweep closes those too."""
    found, todo = list(run_ids), list(run_ids)
    while todo:
        old = todo.pop()
        for run in client.search_runs([experiment_id], f"tags.`{TAG_RETRY_OF}` = '{old}'", max_results=100):
            found.append(run.info.run_id)
            todo.append(run.info.run_id)
    return found


def close_unfinished(client: MlflowClient, run_ids: list[str], status: str, reason: str) -> None:
    """Mark runs that never reached a terminal state (interrupt, dead worker) so none stays RUNNING."""
    for run_id in run_ids:
        run = client.get_run(run_id)
        if run.info.status in ("RUNNING", "SCHEDULED"):
            client.log_batch(run_id, tags=[RunTag(TAG_STATUS, status if status != "KILLED" else "KILLED"),
                                           RunTag(TAG_REASON, reason)])
            client.set_terminated(run_id, status)


def close_lost_runs(client: MlflowClient, uri: str, experiment_id: str, sweep_id: str | None = None,
                    own: bool = False) -> list[str]:
    """Runs left RUNNING/SCHEDULED by a sweep driver that died (SIGKILL, OOM killer, lost node):
    KILLED with reason `driver lost` and the dead holder in `fp8lab.driver_lost`. A sweep whose
    driver is alive is left alone; `own=True` (the caller holds the sweep's lease) skips that
    check. Returns one line per sweep closed, for the caller to print."""
    from orchestrator import lease  # noqa: PLC0415 - fcntl-only module, kept out of import time

    where = f" and tags.`{TAG_SWEEP_ID}` = '{sweep_id}'" if sweep_id else ""
    stale: dict[str, list[Any]] = {}
    for status in ("RUNNING", "SCHEDULED"):  # MLflow's search has no IN for attributes.status
        for run in client.search_runs([experiment_id], f"attributes.status = '{status}'{where}", max_results=5000):
            if run.data.tags.get(TAG_SWEEP_ID):
                stale.setdefault(run.data.tags[TAG_SWEEP_ID], []).append(run)
    lines = []
    for sid, runs in stale.items():
        parent_id = find_parent(client, experiment_id, sid)
        parent_tags = client.get_run(parent_id).data.tags if parent_id else {}
        if not own and lease.driver_alive(uri, sid, parent_tags):
            continue
        holder = parent_tags.get(TAG_DRIVER, "unknown driver")
        tags = [RunTag(TAG_REASON, lease.DRIVER_LOST), RunTag(TAG_DRIVER_LOST, holder)]
        for run in runs:
            extra = [RunTag(TAG_STATUS, "KILLED")] if run.data.tags.get(TAG_ROLE) == ROLE_TRIAL else []
            client.log_batch(run.info.run_id, tags=tags + extra)
            client.set_terminated(run.info.run_id, "KILLED")
        trials = sum(r.data.tags.get(TAG_ROLE) == ROLE_TRIAL for r in runs)
        lines.append(f"sweep {sid}: its driver ({holder}) was lost; {trials} unfinished trial run(s) "
                     f"marked KILLED (reason: {lease.DRIVER_LOST})")
    return lines


def close_lost_in_store(uri: str, experiment_name: str | None = None) -> list[str]:
    """`close_lost_runs` over one experiment (or all), for `fp8lab report`: the report then shows
    those runs as KILLED with reason `driver lost` instead of forever RUNNING. A store that does
    not exist yet is left uncreated (the report says it is missing)."""
    from orchestrator import lease  # noqa: PLC0415

    local = lease.local_store_path(uri)
    if local is not None and not local.exists():
        return []
    lease.ready_store(uri)
    client = MlflowClient(uri)
    if experiment_name:
        found = client.get_experiment_by_name(experiment_name)
        experiments = [found] if found is not None else []
    else:
        experiments = client.search_experiments()
    return [line for e in experiments for line in (close_lost_runs(client, uri, e.experiment_id)
                                                   + close_lost_single_trials(client, uri, e.experiment_id))]


def mark_killed(client: MlflowClient, run_id: str, reason: str) -> None:
    """An interrupted trial's run is KILLED whatever state it reached on the way out."""
    client.log_batch(run_id, tags=[RunTag(TAG_STATUS, "KILLED"), RunTag(TAG_REASON, reason)])
    client.set_terminated(run_id, "KILLED")


def finish_parent(client: MlflowClient, run_id: str, status: str = "FINISHED") -> None:
    """Close the sweep's parent; a sweep a rerun completed no longer carries the `driver lost`
    reason an earlier, lost driver left on it."""
    if status == "FINISHED":
        tags = client.get_run(run_id).data.tags
        for stale in (TAG_REASON, TAG_DRIVER_LOST):
            if stale in tags:
                client.delete_tag(run_id, stale)
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.from_string(status)))


def reopen_lost_run(client: MlflowClient, experiment_id: str, trial_id: str, checkpoint_dir: Path) -> str | None:
    """The run of `trial_id` a lost driver left (KILLED, `driver lost`) when its checkpoint is still
    on disk: the rerun trains on in that run from the checkpoint instead of starting over in a new
    run (the checkpoint belongs to that run, and its metrics up to the checkpoint are there)."""
    from orchestrator import lease  # noqa: PLC0415

    owner = checkpoint_dir / trial_id / CHECKPOINT_OWNER_FILE
    if not (owner.is_file() and (owner.parent / "checkpoint.pt").is_file()):
        return None
    run_id = owner.read_text().strip()
    try:
        run = client.get_run(run_id)
    except Exception:  # noqa: BLE001 - deleted or from another store
        return None
    if run.info.status != "KILLED" or run.data.tags.get(TAG_REASON) != lease.DRIVER_LOST or run.data.tags.get(TAG_TRIAL_ID) != trial_id:
        return None
    client.log_batch(run_id, tags=[RunTag(TAG_STATUS, "SCHEDULED"), RunTag(TAG_REASON, "")])
    if TAG_DRIVER_LOST in run.data.tags:
        client.delete_tag(run_id, TAG_DRIVER_LOST)
    client.update_run(run_id, status="SCHEDULED")
    return run_id


def close_lost_single_trials(client: MlflowClient, uri: str, experiment_id: str) -> list[str]:
    """`fp8lab trial` runs (no sweep) left RUNNING/SCHEDULED by a process that is gone: KILLED with
    reason `process lost`. Local stores only: the trial's claim (`orchestrator.trial_claim`) is free
    exactly when its process died; on a server store nothing tells, and they are left alone."""
    from orchestrator import trial_claim  # noqa: PLC0415

    lines = []
    for status in ("RUNNING", "SCHEDULED"):
        for run in client.search_runs([experiment_id], f"attributes.status = '{status}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'",
                                      max_results=5000):
            if run.data.tags.get(TAG_SWEEP_ID) or trial_claim.claim_alive(uri, run.data.tags.get(TAG_TRIAL_ID, "")) is not False:
                continue
            client.log_batch(run.info.run_id, tags=[RunTag(TAG_STATUS, "KILLED"), RunTag(TAG_REASON, PROCESS_LOST)])
            client.set_terminated(run.info.run_id, "KILLED")
            lines.append(f"trial run {run.info.run_name} ({run.info.run_id}): its process is gone; marked KILLED "
                         f"(reason: {PROCESS_LOST})")
    return lines


PROCESS_LOST = "process lost"
