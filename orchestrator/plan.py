"""Plan a sweep: expand, validate and check every cell against the world, writing nothing.

The sweep's base config arrives composed and validated (the CLI does that once, before any slow
import, so a config mistake is reported at once); planning composes only the cells.

Kept apart from `orchestrator.sweep` (which runs the plan) so that planning starts the slow
preflight child process (it imports torch) *before* this process imports MLflow and Ray: the
two imports overlap and a sweep reaches its first training step seconds sooner.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UserInputError
from orchestrator.matrix import TrialSpec, expand_sweep
from orchestrator.preflight_child import start_preflight
from orchestrator.trial_id import compute_trial_id
from fp8lab_conf.filesystem import folder_is_writable


@dataclass
class SweepPlan:
    config: dict[str, Any]
    specs: list[TrialSpec]
    sweep_id: str
    tracking_uri: str
    skipped: dict[str, str] = field(default_factory=dict)  # trial_id -> FINISHED run id
    force: bool = False  # rerun finished trials too

    @property
    def to_run(self) -> list[TrialSpec]:
        return [s for s in self.specs if s.trial_id not in self.skipped]


def plan_sweep(config: dict[str, Any], overrides: list[str], config_dir: str | None, force: bool,
               check_files: bool = True) -> SweepPlan:
    """Compose + validate every cell of the validated base `config` (composed from `overrides`) and
    check the world; nothing is written."""
    specs = expand_sweep(overrides, config, config_dir)
    pending = start_preflight([s.config for s in specs]) if check_files else None
    from orchestrator import ray_runner, runs  # noqa: PLC0415 - MLflow + Ray: seconds, overlapped with preflight

    uri = runs.absolute_uri(config["tracking"]["uri"])
    checks = [lambda: runs.check_store(uri), lambda: ray_runner.check_address(config["cluster"]),
              lambda: ray_runner.check_local_resources(config["cluster"]), lambda: _check_report_folder(config)]
    resolved: list[dict[str, Any]] = []
    if pending is not None:
        checks.insert(0, lambda: resolved.extend(pending.wait()))
    problems = []
    for check in checks:  # every problem at once, none of them writes anything
        try:
            check()
        except UserInputError as exc:
            problems += exc.problems
    if problems:
        raise UserInputError(problems)
    specs = [with_data_keys(s, keys) for s, keys in zip(specs, resolved)] if resolved else specs
    plan = SweepPlan(config, specs, sweep_id_for(config["sweep"]["name"], specs), uri, force=force)
    if not force:
        plan.skipped = _already_finished(uri, config["sweep"]["name"], specs)
    return plan


def with_data_keys(spec: TrialSpec, train_keys: dict[str, Any]) -> TrialSpec:
    """The cell with the `train` keys its data decided (preflight measured the rows), and the
    trial id of what will run: `train.max_seq_len: null` that the data makes 32 is the trial an
    explicit 32 was, so results and dedupe carry over."""
    if not train_keys or all(spec.config["train"].get(k) == v for k, v in train_keys.items()):
        return spec
    config = {**spec.config, "train": {**spec.config["train"], **train_keys}}
    return dataclasses.replace(spec, config=config, trial_id=compute_trial_id(config))


def sweep_id_for(name: str, specs: list[TrialSpec]) -> str:
    """Same experiment + same set of trials = same sweep (so a rerun resumes it)."""
    digest = hashlib.sha256((name + "|" + ",".join(sorted(s.trial_id for s in specs))).encode())
    return digest.hexdigest()[:12]


def _check_report_folder(config: dict[str, Any]) -> None:
    """The report is written at the end of the sweep: refuse an unwritable folder now, not hours later."""
    if not config["sweep"]["report"]:
        return
    target = Path(config["report"]["out"] or "fp8lab-report").expanduser().resolve()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir() or not folder_is_writable(existing):
        raise UserInputError(f"report.out: cannot write the report under {existing} (fix: report.out=<a writable folder>, "
                             "or sweep.report=false)")


def _already_finished(uri: str, experiment_name: str, specs: list[TrialSpec]) -> dict[str, str]:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 - see the module docstring
    from orchestrator import runs  # noqa: PLC0415

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return {}  # no store yet: nothing finished, and don't create one before the sweep really starts
    from orchestrator.lease import ready_store  # noqa: PLC0415

    ready_store(uri)  # another driver may be creating this store right now: wait for it, never migrate twice
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return {}
    finished = runs.finished_trials(client, experiment.experiment_id)
    return {s.trial_id: finished[s.trial_id] for s in specs if s.trial_id in finished}
