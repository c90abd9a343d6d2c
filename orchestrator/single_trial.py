"""`fp8lab trial`: one trial in this process, as its own MLflow run, result JSON on disk.

Same checks as a sweep (config, files, store) before the run is created; the run gets the same
name, tags and params a sweep's child run would (without a parent).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from fp8lab_conf.contracts import METRIC_ACCURACY, METRIC_ACCURACY_STDERR, METRIC_TOKENS_PER_S, RESULT_JSON, TAG_STATUS, TrialLaunch
from fp8lab_conf.garbage_collection import collection_paused
from orchestrator import runs
from orchestrator.errors import UserInputError
from orchestrator.interrupts import interrupts_raise
from orchestrator.matrix import TrialSpec, policy_label
from orchestrator.params import trial_params
from orchestrator.trial_claim import TrialClaim
from orchestrator.trial_id import compute_trial_id


def run_single_trial(config: dict[str, Any], overrides: list[str], force: bool = False) -> dict[str, Any]:
    from workloads.preflight import check_config, resolve_config  # lighter than workloads.entry: bad input fails sooner

    uri = runs.absolute_uri(config["tracking"]["uri"])
    problems = check_config(config)
    try:
        runs.check_store(uri)
    except UserInputError as exc:
        problems += exc.problems
    if problems:
        raise UserInputError(problems)
    config = resolve_config(config)  # the `train` keys the data decides, as a sweep's cell gets them
    with collection_paused():  # the rest of the training stack's imports
        from workloads.entry import run  # the trial runs here: the training stack is needed anyway

    spec = TrialSpec(tuple(overrides), {}, config, compute_trial_id(config))
    from orchestrator.lease import ready_store

    ready_store(uri)  # a sweep may be creating the same store right now: never migrate it twice
    client = MlflowClient(uri)
    experiment_id = runs.ensure_experiment(client, config["sweep"]["name"], config["tracking"]["artifact_location"])
    done = None if force else runs.finished_trials(client, experiment_id).get(spec.trial_id)
    if done is not None:
        return _reuse_finished(client, done, spec, config)
    claim = TrialClaim(uri, spec.trial_id)
    if not claim.acquire(client, experiment_id):
        raise UserInputError(f"trial {spec.trial_id}: already being trained by {claim.holder()} (fix: wait for it to "
                             "finish; its run then holds the result)")
    try:
        return _run_claimed(config, spec, uri, client, experiment_id, run)
    finally:
        claim.release()


def _run_claimed(config: dict[str, Any], spec: TrialSpec, uri: str, client: MlflowClient, experiment_id: str,
                 run: Any) -> dict[str, Any]:
    """The trial, while this process holds its claim (so `fp8lab report` can tell it is alive)."""
    run_id = runs.create_trial_run(client, experiment_id, spec, None, None, trial_params(config))
    print(f"trial {spec.run_name} ({spec.trial_id}) -> MLflow run {run_id} in {uri}", file=sys.stderr)
    try:
        with interrupts_raise():  # `kill` is handled like Ctrl-C
            result = run(TrialLaunch(config, spec.trial_id, run_id, uri, policy_label(config)), _printer(config["train"]["steps"]))
    except KeyboardInterrupt:
        # KILLED even if the trial, unwinding, already closed its run as FINISHED: an interrupted
        # trial is not a result (a sweep would otherwise skip it as done).
        runs.mark_killed(client, run_id, "interrupted")
        return {"status": "KILLED"}
    if config["trial"]["output"]:
        write_json_atomic(Path(config["trial"]["output"]), result)
    _print_result(result)
    return result


def _reuse_finished(client: MlflowClient, run_id: str, spec: TrialSpec, config: dict[str, Any]) -> dict[str, Any]:
    """An identical trial (same trial id) already has a complete result: say so and hand back its
    result.json (to trial.output too), as a sweep skips it; --force runs it again."""
    try:
        with tempfile.TemporaryDirectory(prefix="fp8lab-result-") as tmp:
            result = json.loads(Path(client.download_artifacts(run_id, RESULT_JSON, tmp)).read_text())
    except Exception:  # noqa: BLE001 - a run without result.json (older fp8lab): its tag says the outcome
        result = {"status": client.get_run(run_id).data.tags.get(TAG_STATUS, "FINISHED"), "policy": policy_label(config),
                  "seed": config["seed"], "metrics": {}, "reason": "", "mlflow_run_id": run_id}
    print(f"trial {spec.run_name} ({spec.trial_id}) already {result['status']} as MLflow run {run_id} in experiment "
          f"'{config['sweep']['name']}': not rerun (use --force to rerun it)", file=sys.stderr)
    if config["trial"]["output"]:
        write_json_atomic(Path(config["trial"]["output"]), result)
    _print_result(result)
    return result


def _printer(total: int):
    def progress(step: int, metrics: dict[str, float]) -> None:
        print(f"  step {step}/{total}  loss {metrics['train/loss']:.4f}  {metrics.get('train/tokens_per_s_window', 0.0):.0f} tok/s",
              file=sys.stderr, flush=True)
    return progress


def _print_result(result: dict[str, Any]) -> None:
    metrics = result.get("metrics", {})
    acc = metrics.get(METRIC_ACCURACY)
    line = f"{result['status']}: {result['policy']} seed {result['seed']}"
    if acc is not None:
        line += f"  accuracy {acc:.3f} ± {metrics.get(METRIC_ACCURACY_STDERR, float('nan')):.3f}"
    if METRIC_TOKENS_PER_S in metrics:
        line += f"  {metrics[METRIC_TOKENS_PER_S]:.0f} tokens/s"
    if result.get("reason"):
        line += f"  ({result['reason']})"
    print(line)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temp file in the same folder, then rename: readers never see half a file."""
    path = path.expanduser()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, default=str)
    os.replace(tmp, path)
