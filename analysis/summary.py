"""Trials -> the numbers a team acts on: summary table, verdicts, ablations, cost.

One row per (policy, values of the other sweep axes). Every comparison is against the baseline
policy with the *same* other-axis values (a bf16 row with lora.r=8 is not the baseline of an
fp8 row with lora.r=16). Only counted trials (FINISHED, DIVERGED) enter statistics; the rest
appear in the status counts. Accuracy is in points (percent).

Accuracy differences come from `analysis.compare` (seeds x items t-test when per-item
results exist, else binomial + seed variance); Holm corrects each family of one report's
comparisons (difference from the baseline; equivalence to it; mechanism effects). The builders
below each fill one section of a row, so the table grows by adding a builder, not a branch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis import fmt
from analysis.compare import Evidence, compare, holm_columns
from analysis.cost import training_cost
from analysis.loss_compare import LossEvidence, loss_cols, loss_holm, loss_phrase, overall_phrase
from analysis.options import ReportOptions
from analysis.paired import PAIRED, Comparison, needed
from analysis.stats import mean_ci, pareto_front, ratio_ci
from analysis.tidy import TEL_PREFIX, TELEMETRY_KINDS, axis_columns, natural_key, policy_rank, task_metrics

GIB = float(1 << 30)
EMULATED_NOTE = "emulated FP8 — speed not representative of FP8 hardware"
# A trial reused from an earlier sweep (or `fp8lab trial`) was timed on another occasion: another
# load, maybe another machine. Its tokens/s is shown with this flag and never enters a ratio.
OTHER_CONTEXT_NOTE = "timed in another context (reused trial: earlier sweep or `fp8lab trial`), not compared"


@dataclass(frozen=True)
class Group:
    """One cell of the sweep: a policy at fixed values of the other axes."""

    policy: str
    axes: tuple[tuple[str, str], ...]  # (axis column, value), in axis_columns order

    @property
    def axes_dict(self) -> dict[str, str]:
        return {k.removeprefix("axis."): v for k, v in self.axes}

    @property
    def label(self) -> str:
        return fmt.group_label(self.policy, self.axes_dict)


def groups_of(trials: pd.DataFrame, options: ReportOptions) -> dict[Group, pd.DataFrame]:
    """Split trials into groups, ordered by axis values then policy (baseline first)."""
    axes = axis_columns(trials)
    out: dict[Group, pd.DataFrame] = {}
    if trials.empty:
        return out
    keys = ["policy", *axes]
    for key, sub in trials.groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        out[Group(str(key[0]), tuple(zip(axes, (str(v) for v in key[1:]), strict=True)))] = sub
    order = sorted(out, key=lambda g: (tuple(natural_key(v) for _, v in g.axes), policy_rank(g.policy, options)))
    return {g: out[g] for g in order}


def find_reference(group: Group, policy: str, candidates: Sequence[Group]) -> Group | None:
    """The group of `policy` comparable with `group`.

    Exact match on every other-axis value first; else the single `policy` group whose non-empty
    axis values all agree (e.g. a bf16 run that was not expanded over an FP8-only axis).
    """
    same = [c for c in candidates if c.policy == policy]
    for c in same:
        if c.axes == group.axes:
            return c
    mine = dict(group.axes)
    loose = [c for c in same if all(v == "" or mine.get(k, "") == v for k, v in c.axes)]
    return loose[0] if len(loose) == 1 else None


ACC_BOUNDS = (0.0, 100.0)
COMPARISON_COLUMNS = (
    "delta_pts", "delta_low", "delta_high", "p", "tost_p", "tost_low", "tost_high", "method", "items",
    "paired_seeds", "delta_note", "needed", "discordant",
)  # fmt: skip


def _counted(sub: pd.DataFrame) -> pd.DataFrame:
    return sub[sub["counted"]]


def _acc_pts(sub: pd.DataFrame) -> np.ndarray:
    return _counted(sub)["accuracy"].to_numpy(dtype=float) * 100.0


def _vals(sub: pd.DataFrame, col: str, scale: float = 1.0) -> np.ndarray:
    return _counted(sub)[col].to_numpy(dtype=float) * scale


def _uniq(sub: pd.DataFrame, col: str) -> str:
    vals = sorted({str(v) for v in sub[col] if str(v)}) if col in sub else []
    return ", ".join(vals)


def _nanmean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def axes_key(g: Group) -> str:
    """The other-axis values of a group as one string (to match rows of different tables)."""
    return "; ".join(f"{k}={v}" for k, v in g.axes)


# --------------------------------------------------------------------------- row builders


def _status_cols(sub: pd.DataFrame, superseded: pd.DataFrame | None) -> dict[str, Any]:
    row: dict[str, Any] = {"n_trials": len(sub)}
    for s in ("FINISHED", "DIVERGED", "FAILED", "INCOMPLETE"):
        row[f"n_{s.lower()}"] = int((sub["status"] == s).sum())
    row["n_diverged_no_acc"] = int(sub.loc[sub["status"] == "DIVERGED", "accuracy"].isna().sum())
    lost = sub[(sub["status"] == "FINISHED") & sub["accuracy"].isna()]
    row["missing_acc_seeds"] = ", ".join(fmt.num(v, 0) for v in sorted(lost["seed"].tolist()))
    row["n_superseded"] = (
        0 if superseded is None or superseded.empty else int(superseded["trial_id"].isin(sub["trial_id"]).sum())
    )
    return row


def _accuracy_cols(sub: pd.DataFrame, options: ReportOptions) -> dict[str, Any]:
    counted = _counted(sub)
    counted = counted[np.isfinite(counted["accuracy"].to_numpy(float))].sort_values("seed")
    acc = mean_ci(counted["accuracy"].to_numpy(float) * 100.0, options.confidence, ACC_BOUNDS)
    return {
        "n_seeds": acc.n,
        "acc_mean": acc.mean,
        "acc_sd": acc.sd,
        "acc_low": acc.low,
        "acc_high": acc.high,
        "acc_note": acc.note,
        "acc_seeds": ", ".join(fmt.num(v * 100.0, 1) for v in counted["accuracy"]),
        "low_evidence": acc.n < options.low_evidence_seeds,
    }


def _comparison_cols(c: Comparison | None, note: str, options: ReportOptions) -> dict[str, Any]:
    if c is None:
        return {k: (note if k == "delta_note" else "" if k in ("method", "needed") else math.nan)
                for k in COMPARISON_COLUMNS} | {"paired_seeds": False, "margin_ok": False}  # fmt: skip
    return {
        "delta_pts": c.delta, "delta_low": c.low, "delta_high": c.high, "p": c.p, "tost_p": c.tost_p,
        "tost_low": c.tost_low, "tost_high": c.tost_high, "method": c.method, "items": c.items,
        "paired_seeds": c.paired_seeds, "delta_note": c.note, "needed": needed(c, options.alpha),
        "margin_ok": c.inside_margin(), "discordant": c.discordant, "cmp_seeds": min(c.n_x, c.n_y),
    }  # fmt: skip


def _ratio_cols(sub: pd.DataFrame, base_sub: pd.DataFrame | None, note: str, options: ReportOptions) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name, col in (("tps_ratio", "tokens_per_s"), ("mem_ratio", "peak_bytes")):
        if base_sub is None:
            row.update({name: math.nan, f"{name}_low": math.nan, f"{name}_high": math.nan, f"{name}_note": note})
            continue
        mine, base = (_same_context(sub), _same_context(base_sub)) if col == "tokens_per_s" else (sub, base_sub)
        if col == "tokens_per_s" and not (_finite(mine, col) and _finite(base, col)) and _finite(sub, col) and _finite(base_sub, col):
            row.update({name: math.nan, f"{name}_low": math.nan, f"{name}_high": math.nan, f"{name}_note": OTHER_CONTEXT_NOTE})
            continue
        r = ratio_ci(_vals(mine, col), _vals(base, col), options.confidence)
        row.update({name: r.ratio, f"{name}_low": r.low, f"{name}_high": r.high, f"{name}_note": r.note})
    return row


def _same_context(sub: pd.DataFrame) -> pd.DataFrame:
    """The trials timed in this sweep (not reused from another): the only ones whose speeds compare."""
    return sub[~sub["reused"].astype(bool)] if "reused" in sub else sub


def _finite(sub: pd.DataFrame, col: str) -> bool:
    return bool(np.isfinite(_vals(sub, col)).any())


def _speed_cols(sub: pd.DataFrame, options: ReportOptions) -> dict[str, Any]:
    """Speed from this sweep's own trials; only when it has none, from reused ones (flagged)."""
    same = _same_context(sub)
    other = not _finite(same, "tokens_per_s") and _finite(sub, "tokens_per_s")
    tps = mean_ci(_vals(sub if other else same, "tokens_per_s"), options.confidence, (0.0, math.inf))
    mem = mean_ci(_vals(sub, "peak_bytes", 1.0 / GIB), options.confidence, (0.0, math.inf))
    return {
        "n_tps": tps.n, "tps_mean": tps.mean, "tps_low": tps.low, "tps_high": tps.high, "tps_other_context": other,
        "n_mem": mem.n, "mem_gib_mean": mem.mean, "mem_gib_low": mem.low, "mem_gib_high": mem.high,
    }  # fmt: skip


def _telemetry_cols(sub: pd.DataFrame) -> dict[str, Any]:
    """What the telemetry says about the mechanism: adapter collapse, underflow and saturation by kind."""
    row: dict[str, Any] = {
        "underflow_events_mean": _nanmean(_vals(sub, "underflow_events")),
        "underflow_threshold_pct": _nanmean(_vals(sub, "underflow_threshold_pct")),
        "final_loss_mean": _nanmean(_vals(sub, "final_loss")),
    }
    stds = _vals(sub, "lora_std_min")
    stds = stds[np.isfinite(stds)]
    row["lora_std_min"] = float(stds.min()) if stds.size else math.nan
    for kind in TELEMETRY_KINDS:
        for stat in ("underflow_pct", "overflow_pct"):
            col = f"{TEL_PREFIX}{kind}.{stat}"
            row[col] = _nanmean(_vals(sub, col)) if col in sub else math.nan
    return row


def _backend_cols(sub: pd.DataFrame) -> dict[str, Any]:
    seen = (line.strip() for v in sub.get("deviations", pd.Series(dtype=str)) for line in str(v).split(";"))
    lines = [line for line in dict.fromkeys(seen) if line]  # first-seen order: the backend's own order
    return {
        "emulated": bool(sub["emulated"].any()),
        "backend": _uniq(sub, "backend"),
        "device": _uniq(sub, "device"),
        "deviations": "; ".join(lines),
    }


def _cost_cols(sub: pd.DataFrame, tps_mean: float, options: ReportOptions) -> dict[str, Any]:
    tpe = sub["tokens_per_epoch"].to_numpy(dtype=float)
    tpe = tpe[np.isfinite(tpe)]
    tokens = float(np.median(tpe)) if tpe.size else math.nan
    c = training_cost(tps_mean, tokens, options.gpu_hour_price, options.utilization, options.n_gpu)
    return {
        "tokens_per_epoch": tokens, "tokens_per_hour": c.tokens_per_hour, "eff_cost_per_hour": c.eff_cost_per_hour,
        "cost_per_1m_tokens": c.cost_per_1m_tokens, "cost_per_epoch": c.cost_per_epoch,
        "hours_per_epoch": c.hours_per_epoch,
    }  # fmt: skip


def primary_metrics(trials: pd.DataFrame, ev: Evidence) -> dict[str, str]:
    """task -> the metric its column shows: the one its per-item results carry (lm-eval's
    'exact_match,strict-match' is logged as 'exact_match.strict-match'), else acc, else a strict
    exact match, else the first."""
    out = {}
    for task, metrics in task_metrics(trials).items():
        named = ev.metric_of(task).replace(",", ".")
        pick = [m for m in metrics if m == named] or [m for m in metrics if m == "acc"]
        exact = sorted((m for m in metrics if m.startswith("exact_match")), key=lambda m: "strict" not in m)
        out[task] = (pick or exact or metrics)[0]
    return out


def _task_cols(
    sub: pd.DataFrame, base_sub: pd.DataFrame | None, tasks: Mapping[str, str], ev: Evidence,
    options: ReportOptions, label: str,
) -> dict[str, Any]:  # fmt: skip
    """Per task: mean with its interval and, against the baseline, Δ with the best method available."""
    row: dict[str, Any] = {}
    for task, metric in tasks.items():
        col = f"task.{task}/{metric}"
        vals = _counted(sub)[col].to_numpy(float)
        pts = vals * 100.0 if np.nanmax(np.append(vals, 0)) <= 1 else vals
        bounds = ACC_BOUNDS if pts is not vals else (0.0, math.inf)
        m = mean_ci(pts, options.confidence, bounds)
        row.update({f"{col}.mean": m.mean, f"{col}.low": m.low, f"{col}.high": m.high, f"{col}.n": m.n})
        if base_sub is not None:
            c = compare(sub, base_sub, ev, options, f"{label}|{task}", task, col, f"{col}_stderr")
            row.update({f"{col}.delta": c.delta, f"{col}.delta_low": c.low, f"{col}.delta_high": c.high,
                        f"{col}.method": c.method})  # fmt: skip
    return row


# --------------------------------------------------------------------------- the table


def build_summary(
    trials: pd.DataFrame,
    options: ReportOptions,
    superseded: pd.DataFrame | None = None,
    evidence: Evidence | None = None,
    loss_evidence: LossEvidence | None = None,
) -> pd.DataFrame:
    """The summary table (numbers only; `document` formats it). One row per group.

    Holm: `p_holm` over every group's difference test, `tost_p_holm` over every equivalence test.
    """
    ev = evidence or Evidence()
    groups = groups_of(trials, options)
    keys = list(groups)
    tasks = primary_metrics(trials, ev)
    rows: list[dict[str, object]] = []
    for g, sub in groups.items():
        base = find_reference(g, options.baseline_policy, keys)
        is_base = g.policy == options.baseline_policy
        base_sub = groups[base] if base is not None and not is_base else None
        note = "baseline" if is_base else f"no {options.baseline_policy} baseline"
        row: dict[str, Any] = {"group": g.label, "policy": g.policy, **dict(g.axes), "axes_key": axes_key(g)}
        row["ablation"] = _uniq(sub, "ablation")
        row["mechanism"] = _uniq(sub, "mechanism")
        row.update(_status_cols(sub, superseded))
        row.update(_accuracy_cols(sub, options))
        row["baseline"] = "(baseline)" if is_base else (base.label if base is not None else "")
        cmp = compare(sub, base_sub, ev, options, f"{g.label}|{base.label}") if base_sub is not None else None
        row.update(_comparison_cols(cmp, note, options))
        row.update(loss_cols(sub, base_sub, loss_evidence or LossEvidence(), options))
        row.update(_ratio_cols(sub, base_sub, note, options))
        row.update(_speed_cols(sub, options))
        row.update(_telemetry_cols(sub))
        row.update(_backend_cols(sub))
        row.update(_cost_cols(sub, row["tps_mean"], options))
        row.update(_task_cols(sub, base_sub, tasks, ev, options, g.label))
        rows.append(row)
    summary = pd.DataFrame(rows)
    if summary.empty:
        return summary
    summary = holm_columns(summary, options.alpha, summary["margin_ok"])
    summary = loss_holm(summary, options)
    summary["pareto"] = pareto_front(summary["acc_mean"].to_numpy(float), summary["tps_mean"].to_numpy(float))
    return summary


def _sig(value: object) -> bool | None:
    """Significance flag from a table cell: True/False, or None when no test was possible."""
    return bool(value) if isinstance(value, (bool, np.bool_)) else None


# --------------------------------------------------------------------------- verdicts


def acc_text(r: Mapping[Any, Any], options: ReportOptions) -> str:
    """A group's accuracy cell: per-seed values below the low-evidence line, else mean and interval."""
    return fmt.spread(r["acc_mean"], r["acc_low"], r["acc_high"], int(r["n_seeds"]), str(r.get("acc_seeds", "")),
                      options.low_evidence_seeds)  # fmt: skip


def _evidence_text(row: Mapping[Any, Any]) -> str:
    """'seeds x items t over 3 seed(s) x 400 items (12 discordant), paired seeds' / 'binomial + seeds, 2 seed(s)'."""
    n = int(row["n_seeds"])
    if row["method"] == PAIRED:
        pairing = "paired seeds" if row["paired_seeds"] else "unpaired seeds"
        k = row.get("discordant")
        disc = f" ({int(k)} discordant)" if fmt.ok(k) and int(k) >= 0 else ""
        return f"{row['method']} over {n} seed(s) x {int(row['items'])} items{disc}, {pairing}"
    return f"{row['method']}, {n} seed(s)" if row["method"] else f"{n} seed(s)"


def _quality_phrase(row: Mapping[Any, Any], options: ReportOptions) -> str:
    base, m = options.baseline_policy, options.equivalence_margin_pts
    d, lo, hi = row["delta_pts"], row["delta_low"], row["delta_high"]
    if not fmt.ok(row["acc_mean"]):
        return "no accuracy measured"
    if not fmt.ok(d):
        return f"accuracy (%) {acc_text(row, options)} (no {base} baseline to compare)"
    ci = fmt.interval(lo, hi, 1)
    how = _evidence_text(row)
    sig, equiv = _sig(row["significant"]), _sig(row.get("equivalent"))
    if sig is None:
        phrase = f"accuracy {fmt.num(d, 1, True)} points vs {base} (no test: {row['delta_note'] or 'no variance'})"
    elif sig:
        word = "better" if float(d) > 0 else "worse"
        phrase = (
            f"accuracy {fmt.num(abs(float(d)))} points {word} than {base}, {options.confidence:.0%} CI {ci} "
            f"(Holm-corrected {fmt.p_eq(row['p_holm'])}; {how})"
        )
    elif equiv:
        seeds = int(row.get("cmp_seeds") or row["n_seeds"])
        claim = f"provisionally as good as {base} ({seeds} seeds)" if seeds < options.low_evidence_seeds else f"as good as {base}"
        phrase = (
            f"{claim} within ±{m:g} points: Δ {fmt.num(d, 1, True)}, "
            f"{1 - 2 * options.alpha:.0%} CI {fmt.interval(row['tost_low'], row['tost_high'], 1)} inside the margin "
            f"(TOST, Holm-corrected {fmt.p_eq(row['tost_p_holm'])}; {how})"
        )
    else:
        phrase = (
            f"not distinguishable from {base} with this evidence: Δ {fmt.num(d, 1, True)} points, "
            f"{options.confidence:.0%} CI {ci} — neither a difference nor equivalence within ±{m:g} points "
            f"({how}); {row['needed']}"
        )
    rule = options.quality_loss_rule_pts
    if float(d) < -rule:
        phrase += f" — loses more than {rule:g} points: by the source article's rule, go back to BF16"
    elif fmt.ok(lo) and float(lo) < -rule:
        phrase += f" — the {options.confidence:.0%} CI reaches a loss of more than {rule:g} points"
    return phrase


def loses_accuracy(r: Mapping[Any, Any], options: ReportOptions) -> bool:
    """A significant loss, or a point estimate below the equivalence margin."""
    d = r.get("delta_pts")
    if not fmt.ok(d):
        return False
    return bool((_sig(r.get("significant")) and float(d) < 0) or float(d) <= -options.equivalence_margin_pts)


def verdict_lines(
    summary: pd.DataFrame, options: ReportOptions, mechanisms: pd.DataFrame | None = None
) -> list[str]:
    """One plain-language line per group, computed from the summary (and mechanism) tables only."""
    lines: list[str] = []
    for _, row in summary.iterrows():
        r = row.to_dict()
        speed_note = f" ({EMULATED_NOTE})" if r["emulated"] else ""
        if r["policy"] == options.baseline_policy:
            context = f" ({OTHER_CONTEXT_NOTE})" if r.get("tps_other_context") else ""
            parts = [f"baseline: accuracy (%) {acc_text(r, options)}", f"{fmt.si(r['tps_mean'])} tokens/s{context}{speed_note}"]
            if fmt.ok(r.get("loss_mean")):
                parts.insert(1, f"held-out loss {float(r['loss_mean']):.4f} nats/token")
        else:
            parts = [_quality_phrase(r, options)]
            parts += [p for p in (loss_phrase(r, options), overall_phrase(r, options)) if p]
            if loses_accuracy(r, options):  # the mechanism phrase then carries the collapse finding
                parts.append(mechanism_phrase(r, options, mechanisms))
                r["lora_std_min"] = math.nan
            if fmt.ok(r["tps_ratio"]):
                ci = fmt.interval(r["tps_ratio_low"], r["tps_ratio_high"])
                source = f" ({r['tps_ratio_source']})" if r.get("tps_ratio_source") else ""
                parts.append(f"{fmt.num(r['tps_ratio'], 2)}x its throughput" + (f" {ci}" if ci else "") + source + speed_note)
            elif fmt.ok(r["tps_mean"]):
                context = f" ({OTHER_CONTEXT_NOTE})" if r.get("tps_ratio_note") == OTHER_CONTEXT_NOTE else ""
                parts.append(f"{fmt.si(r['tps_mean'])} tokens/s{context}{speed_note}")
            if fmt.ok(r["mem_ratio"]):
                parts.append(f"{fmt.num(r['mem_ratio'], 2)}x its peak memory")
        if r.get("deviations"):
            parts.append(f"the {r['backend'] or 'backend'} backend changed the policy: {r['deviations']}")
        if r.get("low_evidence"):
            parts.append(f"low evidence: {r['n_seeds']} seed(s), per-seed values shown instead of a t-interval")
        stability = _stability(r)
        if stability:
            parts.append(stability)
        lines.append(f"{r['group']}: " + "; ".join(parts))
    return lines


# docs/background.md §1: a LoRA weight std below 1e-4 late in training means the adapter is collapsing.
COLLAPSE_STD = 1e-4
UNDERFLOW_SHOWN_PCT = 1.0
"""Underflow shares below this (percent of elements) are not named in a verdict."""
SATURATION_SHOWN_PCT = 0.01


def _by_kind(r: Mapping[Any, Any], stat: str, shown: float, title: str, none: str, digits: int) -> list[str]:
    """'<title>: dgrad 17.3%, wgrad 5.1%' for kinds at or above `shown`; `none` when all are below."""
    vals = {k: r.get(f"{TEL_PREFIX}{k}.{stat}") for k in TELEMETRY_KINDS}
    vals = {k: float(v) for k, v in vals.items() if fmt.ok(v)}
    big = sorted(((v, k) for k, v in vals.items() if v >= shown), reverse=True)
    if big:
        return [f"{title}: " + ", ".join(f"{k} {v:.{digits}f}%" for v, k in big)]
    return [none.format(shown)] if vals else []


def telemetry_findings(r: Mapping[Any, Any]) -> list[str]:
    """What the telemetry of a group shows, in words (empty when it logged none)."""
    out = []
    if fmt.ok(r.get("lora_std_min")) and float(r["lora_std_min"]) < COLLAPSE_STD:
        out.append(f"adapters frozen at init (smallest LoRA weight std {float(r['lora_std_min']):.1e} < {COLLAPSE_STD:g})")
    out += _by_kind(r, "underflow_pct", UNDERFLOW_SHOWN_PCT, "underflow at the end of training", "underflow below {:g}% for every tensor kind", 1)
    out += _by_kind(r, "overflow_pct", SATURATION_SHOWN_PCT, "saturation", "no saturation", 2)
    return out


def mechanism_phrase(r: Mapping[Any, Any], options: ReportOptions, mechanisms: pd.DataFrame | None) -> str:
    """Why a policy loses accuracy: the telemetry, and which ladder rung recovers it if it was run."""
    seen = telemetry_findings(r)
    text = "telemetry: " + "; ".join(seen) if seen else "no telemetry logged"
    if r.get("ablation") or r.get("mechanism"):  # a rung itself: the ladder table says what it is worth
        return text
    rungs = (
        mechanisms[(mechanisms["direction"] == "up") & (mechanisms["base"] == r["policy"])
                   & (mechanisms["axes_key"] == r.get("axes_key", ""))]
        if mechanisms is not None and len(mechanisms) else pd.DataFrame()
    )  # fmt: skip
    if rungs.empty:
        hint = " (run `experiment=mechanisms`)" if r["policy"] == options.naive_policy else ""
        return text + f"; no ladder rung in this store adds a protection to {r['policy']}{hint}"
    rec = rungs[rungs["significant"].map(_sig).eq(True) & (rungs["effect_pts"] > 0)].sort_values("effect_pts")
    if rec.empty:
        return text + f"; none of the {len(rungs)} ladder rung(s) added to {r['policy']} recovers a significant amount"
    best = rec.iloc[-1]
    desc = f" ({best['description']})" if best["description"] else ""
    return (
        text + f"; the ladder rung that recovers most is {best['variant']}: adding {best['mechanism']}{desc} recovers "
        f"{fmt.num(best['effect_pts'], 1, True)} points, {options.confidence:.0%} CI "
        f"{fmt.interval(best['effect_low'], best['effect_high'], 1)}"
    )


def _stability(r: Mapping[Any, Any]) -> str:
    bits = []
    n = int(r["n_trials"])
    for key, word in (("n_diverged", "diverged"), ("n_failed", "failed"), ("n_incomplete", "incomplete")):
        k = int(r[key])
        if k:
            bits.append(f"{k} of {n} trial(s) {word}")
    if fmt.ok(r.get("lora_std_min")) and r["lora_std_min"] < COLLAPSE_STD:
        bits.append(f"LoRA collapse detector fired: the smallest LoRA weight std at the end is {r['lora_std_min']:.1e} "
                    f"(< {COLLAPSE_STD:g}, docs/background.md §1), so some adapter matrices never left their zero init "
                    "and the fine-tune did not change the model")
    unevaluated = int(r.get("n_diverged_no_acc", 0) or 0)
    if unevaluated:
        bits.append(f"{unevaluated} diverged trial(s) were not evaluated and are missing from the accuracy mean")
    if r.get("missing_acc_seeds"):
        bits.append(f"FINISHED seed(s) {r['missing_acc_seeds']} have no accuracy metric (lost or never logged) and "
                    "are missing from the accuracy statistics")
    return ", ".join(bits)


# --------------------------------------------------------------------------- mechanisms: ladder and ablations


def _rung(g: Group, sub: pd.DataFrame, options: ReportOptions) -> tuple[str, str, str, str] | None:
    """(direction, base policy, mechanism id, description) of a ladder rung or legacy ablation, else None."""
    if g.policy in (options.protected_policy, options.naive_policy, options.baseline_policy):
        return None
    direction, base = _uniq(sub, "ladder"), _uniq(sub, "ladder_base")
    if direction in ("up", "down") and base:
        return direction, base, _uniq(sub, "mechanism") or g.policy, _uniq(sub, "mechanism_desc")
    abl = _uniq(sub, "ablation")
    return ("down", options.protected_policy, abl, "") if abl else None


def ablation_table(trials: pd.DataFrame, options: ReportOptions, evidence: Evidence | None = None) -> pd.DataFrame:
    """One row per mechanism-ladder rung (and legacy ablation): the accuracy its protection is worth.

    `effect_pts` > 0 means the protection helps: up rung = acc(base + protection) - acc(base); down
    rung = acc(base) - acc(base without it). `share_of_gap` = effect / (acc(protected) - acc(naive));
    shares need not sum to 1 because protections interact. Holm over the table's rows.
    """
    ev = evidence or Evidence()
    groups = groups_of(trials, options)
    keys = list(groups)
    gaps: dict[str, Comparison | None] = {}
    rows: list[dict[str, object]] = []
    for g, sub in groups.items():
        rung = _rung(g, sub, options)
        if rung is None:
            continue
        direction, base_policy, mech, desc = rung
        row: dict[str, object] = {
            "direction": direction, "base": base_policy, "mechanism": mech, "protection": mech, "description": desc,
            "variant": g.label, "policy": g.policy, **dict(g.axes), "axes_key": axes_key(g),
        }  # fmt: skip
        base = find_reference(g, base_policy, keys)
        if base is None:
            row.update(_effect_cols(None, f"no {base_policy} run with the same settings"), n_base=0,
                       n_variant=int(sub["counted"].sum()))  # fmt: skip
        else:
            x, y = (groups[base], sub) if direction == "down" else (sub, groups[base])
            c = compare(x, y, ev, options, f"{g.label}|{base.label}|rung")
            row.update(_effect_cols(c, c.note), n_base=len(_acc_pts(groups[base])), n_variant=len(_acc_pts(sub)))
        key = axes_key(g)
        if key not in gaps:
            prot, naive = (find_reference(g, p, keys) for p in (options.protected_policy, options.naive_policy))
            gaps[key] = (
                compare(groups[prot], groups[naive], ev, options, f"{key}|gap") if prot and naive else None
            )
        gap = gaps[key]
        eff = row["effect_pts"]
        # a gap smaller than the equivalence margin is noise: a share of it (noise / noise) means nothing
        ok_gap = gap is not None and fmt.ok(gap.delta) and gap.delta >= options.equivalence_margin_pts
        row.update(
            gap_pts=gap.delta if gap else math.nan, gap_low=gap.low if gap else math.nan,
            gap_high=gap.high if gap else math.nan, gap_p=gap.p if gap else math.nan,
            share_of_gap=float(eff) / gap.delta if ok_gap and fmt.ok(eff) else math.nan,  # type: ignore[arg-type, union-attr]
        )  # fmt: skip
        rows.append(row)
    table = pd.DataFrame(rows)
    return holm_columns(table, options.alpha) if len(table) else table


def _effect_cols(c: Comparison | None, note: str) -> dict[str, object]:
    if c is None:
        return {"effect_pts": math.nan, "effect_low": math.nan, "effect_high": math.nan, "p": math.nan,
                "method": "", "note": note}  # fmt: skip
    return {"effect_pts": c.delta, "effect_low": c.low, "effect_high": c.high, "p": c.p, "method": c.method,
            "note": note}  # fmt: skip


def ablation_lines(ablations: pd.DataFrame, options: ReportOptions) -> list[str]:
    """Plain-language reading of the mechanism table, then what the shares add up to."""
    lines = []
    naive, prot = options.naive_policy, options.protected_policy
    for _, r in ablations.iterrows():
        if not fmt.ok(r["effect_pts"]):
            lines.append(f"{r['variant']}: {r['note'] or 'no accuracy to compare'}")
            continue
        sig = _sig(r["significant"])
        tag = "no test: " + str(r["note"]) if sig is None else (
            f"significant, Holm-corrected {fmt.p_eq(r['p_holm'])}" if sig else
            f"not significant, Holm-corrected {fmt.p_eq(r['p_holm'])}"
        )  # fmt: skip
        eff = fmt.num(r["effect_pts"], 1, True)
        ci = fmt.interval(r["effect_low"], r["effect_high"], 1)
        if r["direction"] == "up":
            line = f"adding {r['mechanism']} to {r['base']} changes accuracy by {eff} points {ci} ({tag})"
        else:
            line = f"removing {r['mechanism']} from {r['base']} costs {eff} points {ci} ({tag})"
        if fmt.ok(r["share_of_gap"]):
            line += f", i.e. {float(r['share_of_gap']):.0%} of the {naive}→{prot} gap of {fmt.num(r['gap_pts'])} points"
        elif fmt.ok(r["gap_pts"]):
            line += (f"; the {naive}→{prot} gap is {fmt.num(r['gap_pts'], 1, True)} points "
                     f"[{fmt.num(r['gap_low'], 1, True)}, {fmt.num(r['gap_high'], 1, True)}], too small to share out")
        lines.append(f"{r['variant']}: {line}")
    return lines + gap_lines(ablations, options)


EXPLAINS_NOTHING = 0.10
"""Shares of the gap that sum to less than this (either sign) explain none of it."""


def gap_lines(ablations: pd.DataFrame, options: ReportOptions) -> list[str]:
    """Per axis setting: do the switches explain the naive→protected gap at all?"""
    out = []
    naive, prot = options.naive_policy, options.protected_policy
    for key, sub in ablations.groupby("axes_key", sort=False):
        gap = sub.iloc[0]
        if not (fmt.ok(gap["gap_pts"]) and float(gap["gap_pts"]) >= options.equivalence_margin_pts):
            continue
        where = f" [{key}]" if key and any(v.split("=", 1)[-1] for v in str(key).split("; ")) else ""
        down = sub[(sub["direction"] == "down") & (sub["base"] == prot) & sub["share_of_gap"].map(fmt.ok)]
        if len(down):
            total = float(down["share_of_gap"].sum())
            if abs(total) < EXPLAINS_NOTHING:
                out.append(
                    f"none of these switches explains the gap{where}: removing each of the {len(down)} protection(s) "
                    f"from {prot} costs {total:.0%} of the {fmt.num(gap['gap_pts'])}-point {naive}→{prot} gap in "
                    "total, so the gap comes from a difference between the two policies that no switch here covers"
                )
            else:
                out.append(f"the {len(down)} protection(s) removed from {prot} together account for {total:.0%} of "
                           f"the {fmt.num(gap['gap_pts'])}-point gap{where} (protections interact; shares need not add up)")  # fmt: skip
        up = sub[(sub["direction"] == "up") & (sub["base"] == naive) & sub["share_of_gap"].map(fmt.ok)]
        if len(up):
            best = up.sort_values("share_of_gap").iloc[-1]
            if float(best["share_of_gap"]) >= 0.5:
                out.append(f"adding {best['mechanism']} alone to {naive} recovers {float(best['share_of_gap']):.0%} of "
                           f"the gap{where}: that is the mechanism that costs {naive} its accuracy on this task")  # fmt: skip
            elif abs(float(up["share_of_gap"].sum())) < EXPLAINS_NOTHING:
                out.append(f"none of the {len(up)} protection(s) added to {naive} recovers the gap{where}")
    return out
