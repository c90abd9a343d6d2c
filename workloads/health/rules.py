"""The verdict: health rules kept as data (conf/health/*.yaml), applied to one step's signals.

Pure Python (no torch, no MLflow) so the rules can be tested on hand-built situations. A rule is
a list of conditions that must all hold; `doomed` rules are checked first, then `at_risk`; no
rule firing means `healthy`. A condition on a signal the step does not have cannot hold: the
verdict lists that signal as missing instead of guessing (docs/health.md, "Rules").
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

VERDICTS = ("healthy", "at_risk", "doomed")  # in increasing severity
OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
NONFINITE = "nonfinite"  # the condition holds when the signal is NaN or +-inf (takes no value)


@dataclass(frozen=True)
class Condition:
    metric: str
    op: str
    value: float | None = None

    def holds(self, x: float) -> bool:
        if self.op == NONFINITE:
            return not math.isfinite(x)
        return math.isfinite(x) and OPS[self.op](x, float(self.value))  # NaN never passes a threshold

    def describe(self, x: float) -> str:
        return f"{self.metric}={x:.4g}" + ("" if self.op == NONFINITE else f" {self.op} {self.value:g}")


@dataclass(frozen=True)
class Rule:
    verdict: str  # at_risk | doomed
    why: str
    when: tuple[Condition, ...]


@dataclass(frozen=True)
class Verdict:
    """What a trial's health looks like at `step`, and which signals said so."""

    verdict: str
    step: int
    reasons: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # every metric a rule needed and the step lacked
    unchecked: tuple[str, ...] = ()  # doomed rules that could not be evaluated for lack of a metric

    def line(self) -> str:
        """One line for the progress table and the logs: the verdict, why, and which doomed rule
        could not be checked (at-risk rules on absent FP8 kinds, e.g. in bf16, are not news)."""
        text = self.verdict.replace("_", " ")
        if self.reasons:
            text += ": " + "; ".join(self.reasons)
        if self.unchecked:
            text += f" (not checked: {'; '.join(self.unchecked)})"
        return text


@dataclass(frozen=True)
class HealthRules:
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    @classmethod
    def from_config(cls, rules: list[Mapping[str, Any]]) -> "HealthRules":
        """Rules from `health.rules` (validated beforehand by `rule_problems`)."""
        return cls(tuple(Rule(str(r["verdict"]), str(r["why"]),
                              tuple(Condition(str(c["metric"]), str(c["op"]),
                                              None if c.get("value") is None else float(c["value"]))
                                    for c in r["when"]))
                         for r in rules))

    def judge(self, step: int, signals: Mapping[str, float]) -> Verdict:
        """The most severe verdict whose every condition holds; reasons name the values."""
        fired: dict[str, list[str]] = {v: [] for v in VERDICTS}
        missing: list[str] = []
        unchecked: list[str] = []
        for rule in self.rules:
            absent = [c.metric for c in rule.when if c.metric not in signals]
            if absent:
                missing += [m for m in absent if m not in missing]
                if rule.verdict == "doomed":
                    unchecked.append(f"{rule.why}, no {', '.join(absent)}")
                continue
            if all(c.holds(float(signals[c.metric])) for c in rule.when):
                values = ", ".join(c.describe(float(signals[c.metric])) for c in rule.when)
                fired[rule.verdict].append(f"{rule.why} ({values})")
        for verdict in reversed(VERDICTS[1:]):
            if fired[verdict]:
                return Verdict(verdict, step, tuple(fired[verdict]), tuple(missing), tuple(unchecked))
        return Verdict("healthy", step, (), tuple(missing), tuple(unchecked))


def rule_problems(rules: Any, path: str = "health.rules") -> list[str]:
    """Every problem in a rules list, one line each naming the entry and the fix."""
    if not isinstance(rules, list) or not rules:
        return [f"{path}: must be a non-empty list of rules (fix: see conf/health/default.yaml)"]
    problems = []
    for i, rule in enumerate(rules):
        where = f"{path}[{i}]"
        if not isinstance(rule, Mapping):
            problems.append(f"{where}: must be a mapping with verdict, why, when (fix: see conf/health/default.yaml)")
            continue
        if rule.get("verdict") not in VERDICTS[1:]:
            problems.append(f"{where}.verdict: must be at_risk or doomed, got {rule.get('verdict')!r} (fix: verdict: doomed)")
        if not isinstance(rule.get("why"), str) or not rule["why"].strip():
            problems.append(f"{where}.why: must be a short sentence (fix: why: adapters frozen)")
        when = rule.get("when")
        if not isinstance(when, list) or not when:
            problems.append(f"{where}.when: must be a non-empty list of conditions (fix: when: [{{metric: train/loss, op: nonfinite}}])")
            continue
        problems += [p for j, c in enumerate(when) for p in _condition_problems(c, f"{where}.when[{j}]")]
    return problems


def _condition_problems(cond: Any, where: str) -> list[str]:
    if not isinstance(cond, Mapping) or not isinstance(cond.get("metric"), str) or not cond["metric"].strip():
        return [f"{where}: must be a mapping with metric, op and value (fix: {{metric: train/loss, op: '>', value: 5}})"]
    op, value = cond.get("op"), cond.get("value")
    if op == NONFINITE:
        return [] if value is None else [f"{where}.value: op nonfinite takes no value (fix: drop value)"]
    if op not in OPS:
        return [f"{where}.op: must be one of {', '.join([*OPS, NONFINITE])}, got {op!r} (fix: op: '<')"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return [f"{where}.value: must be a finite number, got {value!r} (fix: value: 1.0e-6)"]
    return []
