"""The reference trial's loss at a step: the bf16 trial of the same configuration and seed.

Queried once per trial, at the verdict step (docs/health.md, "Reference loss"). Same
configuration means: same experiment, policy `health.reference_policy`, same seed, and the same
value for every logged param that changes what is trained (model, data, lora, train, except the
throughput and bookkeeping keys). A reference still RUNNING counts once it has logged the step.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from mlflow.tracking import MlflowClient

from fp8lab_conf.contracts import METRIC_LOSS, NON_SEMANTIC_KEYS, TAG_POLICY, TAG_SEED

log = logging.getLogger("fp8lab.health")

_SAME_GROUPS = ("model.", "data.", "lora.", "train.")
# Keys of those groups that never change the loss curve: the trial id's non-semantic keys.
_IGNORED = tuple(k for k in NON_SEMANTIC_KEYS if k.startswith(_SAME_GROUPS))
_USABLE = ("FINISHED", "RUNNING")


def mlflow_reference(tracking_uri: str, run_id: str, policy: str) -> Callable[[int], float | None]:
    """A function step -> the reference trial's train/loss at that step, or None (absent)."""

    def lookup(step: int) -> float | None:
        try:
            return _reference_loss(MlflowClient(tracking_uri), run_id, policy, step)
        except Exception as exc:  # noqa: BLE001 - a store hiccup makes the signal missing, not the trial fail
            log.warning("health: reference loss not available (%s)", exc)
            return None

    return lookup


def _reference_loss(client: MlflowClient, run_id: str, policy: str, step: int) -> float | None:
    me = client.get_run(run_id)
    if me.data.tags.get(TAG_POLICY) == policy:
        return None  # the reference has no reference
    for run in reference_runs(client, me, policy, _USABLE):
        at_step = [m.value for m in client.get_metric_history(run.info.run_id, METRIC_LOSS) if m.step == step]
        if at_step:
            return float(at_step[-1])
    return None


def reference_runs(client: MlflowClient, me: Any, policy: str, statuses: tuple[str, ...] = ("FINISHED",)) -> list[Any]:
    """Runs of `policy` in `me`'s experiment with `me`'s seed and training configuration, newest
    first: the health monitor's reference loss and the export's model card compare with these."""
    seed = me.data.tags.get(TAG_SEED, "")
    runs = client.search_runs([me.info.experiment_id],
                              filter_string=f"tags.`{TAG_POLICY}` = '{policy}' and tags.`{TAG_SEED}` = '{seed}'",
                              order_by=["attributes.start_time DESC"], max_results=200)
    wanted = _config_key(me.data.params)
    return [run for run in runs if run.info.status in statuses and _config_key(run.data.params) == wanted]


def _config_key(params: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in params.items() if k.startswith(_SAME_GROUPS) and k not in _IGNORED))
