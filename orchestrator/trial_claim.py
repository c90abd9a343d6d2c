"""One trial id trains at most once at a time in a store, whoever starts it (overlapping sweeps
with different axes, a sweep and `fp8lab trial`).

The sweep lease (`orchestrator.lease`) is per sweep id, so two sweeps that share a cell (same
trial id) would both train it. A claim is per trial id:
- local store (SQLite file, ./mlruns): `flock` on `.fp8lab-locks/<store>.trial-<id>.lock`
  beside it, held by the process that launched the trial (a sweep driver, `fp8lab trial`) for
  as long as the trial runs. The kernel frees it when that process dies, so a free claim on a
  RUNNING run also means its process is gone (`fp8lab report` closes such runs).
- server store: MLflow has no compare-and-swap, so the claim is the claimed run's heartbeat:
  another RUNNING/SCHEDULED run of the same trial id whose sweep driver's heartbeat is fresh
  (`lease.heartbeat_fresh` on its parent) holds it. Two claims within the same second can both
  pass (the limitation the sweep lease documents too).
A sweep that finds a trial claimed waits for it and then reuses the result if it FINISHED.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import time
from dataclasses import asdict
from typing import Any, Callable

from fp8lab_conf.contracts import ROLE_SWEEP, TAG_ROLE, TAG_SWEEP_ID, TAG_TRIAL_ID
from orchestrator import lease


class TrialClaim:
    """The right to train one trial id now. `acquire()` -> False while another live process has it."""

    def __init__(self, uri: str, trial_id: str) -> None:
        self.uri, self.trial_id = uri, trial_id
        self._handle: Any = None

    def acquire(self, client: Any = None, experiment_id: str | None = None) -> bool:
        store = lease.local_store_path(self.uri)
        if store is None:
            return client is None or not claimed_on_server(client, experiment_id, self.trial_id)
        handle = open(_claim_file(self.uri, self.trial_id), "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(asdict(lease.Holder.me())))
        handle.flush()
        self._handle = handle
        return True

    def holder(self) -> str:
        """Who holds it (for a refusal line)."""
        path = _claim_file(self.uri, self.trial_id)
        return lease.describe_live_holder(path.read_text) if path and path.exists() else "another process"

    def release(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def _claim_file(uri: str, trial_id: str) -> Any:
    store = lease.local_store_path(uri)
    return None if store is None else lease._lock_file(store, f"trial-{trial_id}")


def claim_alive(uri: str, trial_id: str) -> bool | None:
    """Local store: whether a live process holds the trial's claim. None for a server store
    (there only a sweep driver's heartbeat tells)."""
    store = lease.local_store_path(uri)
    if store is None:
        return None
    return lease.lock_held(store.parent / lease.LOCK_DIR / f"{store.name}.trial-{trial_id}.lock")


def claimed_on_server(client: Any, experiment_id: str | None, trial_id: str) -> bool:
    """Another RUNNING/SCHEDULED run of `trial_id` whose sweep driver's heartbeat is fresh."""
    if experiment_id is None:
        return False
    for status in ("RUNNING", "SCHEDULED"):
        for run in client.search_runs([experiment_id], f"attributes.status = '{status}' and tags.`{TAG_TRIAL_ID}` = '{trial_id}'",
                                      max_results=50):
            sweep_id = run.data.tags.get(TAG_SWEEP_ID)
            parents = client.search_runs([experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_SWEEP}' and tags.`{TAG_SWEEP_ID}` = '{sweep_id}'",
                                         max_results=1) if sweep_id else []
            if parents and lease.heartbeat_fresh(parents[0].data.tags):
                return True
    return False


class SweepClaims:
    """The per-trial claims of one sweep (`orchestrator.trial_claim`): taken before a trial's run
    is created, released when its result is in. A trial claimed by another process (an
    overlapping sweep) waits. Every claim taken is checked against the store first: a trial
    another sweep finished since this sweep's plan (seen waiting or not - it may have started and
    finished between the plan and the claim) is reused (added to `plan.skipped`), else trained here."""

    RECHECK_S = 2.0

    def __init__(self, plan: Any, client: Any, experiment_id: str, console: Any,
                 finished_trials: Callable[[Any, str], dict[str, str]]) -> None:
        """`finished_trials`: `runs.finished_trials` (passed in: `runs` imports this module)."""
        self.plan, self.client, self.experiment_id, self.console = plan, client, experiment_id, console
        self._finished_trials = finished_trials
        self.held: dict[str, TrialClaim] = {}
        self.parked: list[tuple[int, Any]] = []
        self.waited: set[str] = set()
        self._next_check = 0.0

    def take(self, index: int, spec: Any) -> bool:
        claim = TrialClaim(self.plan.tracking_uri, spec.trial_id)
        if not claim.acquire(self.client, self.experiment_id):
            if spec.trial_id not in self.waited:
                self.console.print(f"{spec.run_name}: trial {spec.trial_id} is being trained by {claim.holder()} "
                                   "(another sweep); waiting for it", markup=False)
            self.waited.add(spec.trial_id)
            self.parked.append((index, spec))
            return False
        if self._finished_elsewhere(spec):  # also unwaited: another sweep may have finished it since our plan
            claim.release()
            return False
        self.held[spec.trial_id] = claim
        return True

    def _finished_elsewhere(self, spec: Any) -> bool:
        finished = {} if self.plan.force else self._finished_trials(self.client, self.experiment_id)
        if spec.trial_id not in finished:
            return False
        self.plan.skipped[spec.trial_id] = finished[spec.trial_id]
        self.console.print(f"{spec.run_name}: trial {spec.trial_id} was finished by another sweep; its result is reused",
                           markup=False)
        return True

    def ready_again(self) -> list[tuple[int, Any]]:
        """Parked trials to try again (every RECHECK_S)."""
        if not self.parked or time.monotonic() < self._next_check:
            return []
        self._next_check = time.monotonic() + self.RECHECK_S
        again, self.parked = self.parked, []
        return again

    def waiting(self) -> bool:
        return bool(self.parked)

    def release_done(self, results: dict[str, Any]) -> None:
        for trial_id in [t for t in self.held if t in results]:
            self.held.pop(trial_id).release()

    def release_all(self) -> None:
        for claim in self.held.values():
            claim.release()
        self.held.clear()
