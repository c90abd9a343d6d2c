"""Which trial of a sweep to export with `--best`, by a rule that is printed with the choice.

The rule, kept simple on purpose (the report holds the statistics):
1. Only FINISHED trials of the sweep count; each policy is summarised by the mean over its trials
   of `eval/accuracy` and of `train/tokens_per_s` (the trials' steady-state throughput).
2. A policy is *at equal quality* when its mean accuracy is at least bf16's mean accuracy minus
   `margin_pts` points (default 1). bf16 itself always qualifies.
3. On real FP8 (no trial emulated): best = the qualifying policy with the highest mean tokens/s.
   On an emulated backend the measured speed is the emulator's, not FP8's (emulated FP8 is
   *slower* than bf16 on CPU, so ranking by it always picks bf16): best = the qualifying FP8
   policy with the highest mean accuracy, bf16 only when no FP8 policy qualifies. FP8 GEMMs are
   faster than BF16 ones on FP8 hardware (docs: README "GPU projection"); a projected speed-up
   would break ties, but the projection has not passed its validation, so none is used.
4. Without a bf16 arm in the sweep, best = the policy with the highest mean accuracy.
5. Within that policy, its run with the highest accuracy (ties: lowest seed) is exported.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from mlflow.tracking import MlflowClient

from fp8lab_conf.contracts import (
    METRIC_ACCURACY, METRIC_TOKENS_PER_S, ROLE_TRIAL, TAG_EMULATED, TAG_POLICY, TAG_ROLE, TAG_SEED, TAG_STATUS,
    TAG_SWEEP_ID,
)
from orchestrator.errors import UserInputError

REFERENCE_POLICY = "bf16"
DEFAULT_MARGIN_PTS = 1.0


@dataclass(frozen=True)
class BestChoice:
    run_id: str
    run_name: str
    policy: str
    reason: str


def sweep_trial_runs(client: MlflowClient, sweep_id: str) -> list[Any]:
    """Every trial run tagged with `sweep_id`, in any experiment."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs: list[Any] = []
    page_token = None
    while experiments:
        page = client.search_runs(experiments, f"tags.`{TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'",
                                  max_results=1000, page_token=page_token)
        runs += list(page)
        page_token = page.token
        if not page_token:
            break
    return runs


def choose_best(runs: list[Any], margin_pts: float = DEFAULT_MARGIN_PTS) -> BestChoice:
    """Apply the module's rule to trial runs (MLflow `Run`s)."""
    finished = [r for r in runs if r.data.tags.get(TAG_STATUS) == "FINISHED" and METRIC_ACCURACY in r.data.metrics]
    if not finished:
        raise UserInputError("--best: the sweep has no FINISHED trial with an accuracy (fix: finish the sweep first)")
    by_policy: dict[str, list[Any]] = defaultdict(list)
    for run in finished:
        by_policy[run.data.tags.get(TAG_POLICY, "?")].append(run)
    acc = {p: _mean(rs, METRIC_ACCURACY) for p, rs in by_policy.items()}
    speed = {p: _mean(rs, METRIC_TOKENS_PER_S) for p, rs in by_policy.items()}
    emulated = any(r.data.tags.get(TAG_EMULATED) == "true" for r in finished)
    if REFERENCE_POLICY in acc:
        floor = acc[REFERENCE_POLICY] - margin_pts / 100.0
        equal = [p for p in acc if acc[p] >= floor or p == REFERENCE_POLICY]
        policy, reason = (_emulated_choice if emulated else _measured_choice)(equal, acc, speed, margin_pts)
    else:
        policy = max(acc, key=lambda p: (acc[p], speed[p]))
        reason = f"no bf16 arm: most accurate policy {policy} ({acc[policy]:.3f})"
    run = max(by_policy[policy], key=lambda r: (r.data.metrics[METRIC_ACCURACY], -int(r.data.tags.get(TAG_SEED, 0))))
    return BestChoice(run.info.run_id, run.data.tags.get("mlflow.runName", ""), policy, reason)


def _measured_choice(equal: list[str], acc: dict[str, float], speed: dict[str, float],
                     margin_pts: float) -> tuple[str, str]:
    policy = max(equal, key=lambda p: (speed[p], acc[p]))
    ratio = speed[policy] / speed[REFERENCE_POLICY] if speed[REFERENCE_POLICY] else float("nan")
    return policy, (f"rule: the fastest policy (measured tokens/s, real FP8) within {margin_pts:g} pt of bf16's accuracy "
                    f"({acc[REFERENCE_POLICY]:.3f}): {policy}, accuracy {acc[policy]:.3f}, {speed[policy]:.0f} tokens/s "
                    f"({ratio:.2f}x bf16)")


def _emulated_choice(equal: list[str], acc: dict[str, float], speed: dict[str, float],
                     margin_pts: float) -> tuple[str, str]:
    fp8 = [p for p in equal if p != REFERENCE_POLICY]
    policy = max(fp8, key=lambda p: (acc[p], p)) if fp8 else REFERENCE_POLICY
    why = (f"{policy}, accuracy {acc[policy]:.3f}" if fp8 else
           f"bf16: no FP8 policy is within {margin_pts:g} pt of its accuracy")
    return policy, (f"rule (emulated FP8: measured speed is the emulator's, not FP8's, so it is not ranked): the most "
                    f"accurate FP8 policy within {margin_pts:g} pt of bf16's accuracy ({acc[REFERENCE_POLICY]:.3f}), "
                    f"bf16 if none; no validated GPU projection to break ties: {why}")


def _mean(runs: list[Any], key: str) -> float:
    values = [r.data.metrics[key] for r in runs if key in r.data.metrics]
    return sum(values) / len(values) if values else 0.0
