"""Trials -> the numbers a team acts on: summary table, verdicts, ablations, cost.

One row per (policy, values of the other sweep axes). Every comparison is against the baseline
policy with the *same* other-axis values (a bf16 row with lora.r=8 is not the baseline of an
fp8 row with lora.r=16). Only counted trials (FINISHED, DIVERGED) enter statistics; the rest
appear in the status counts. Accuracy is in points (percent).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis import fmt
from analysis.cost import training_cost
from analysis.options import ReportOptions
from analysis.stats import mean_ci, pareto_front, ratio_ci, welch
from analysis.tidy import axis_columns, natural_key, policy_rank

GIB = float(1 << 30)
EMULATED_NOTE = "emulated FP8 — speed not representative of FP8 hardware"


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


def _counted(sub: pd.DataFrame) -> pd.DataFrame:
    return sub[sub["counted"]]


def _acc_pts(sub: pd.DataFrame) -> np.ndarray:
    return _counted(sub)["accuracy"].to_numpy(dtype=float) * 100.0


def _vals(sub: pd.DataFrame, col: str, scale: float = 1.0) -> np.ndarray:
    return _counted(sub)[col].to_numpy(dtype=float) * scale


def _uniq(sub: pd.DataFrame, col: str) -> str:
    vals = sorted({str(v) for v in sub[col] if str(v)})
    return ", ".join(vals)


def build_summary(trials: pd.DataFrame, options: ReportOptions, superseded: pd.DataFrame | None = None) -> pd.DataFrame:
    """The summary table (numbers only; `document` formats it). One row per group."""
    groups = groups_of(trials, options)
    keys = list(groups)
    conf = options.confidence
    rows: list[dict[str, object]] = []
    for g, sub in groups.items():
        base = find_reference(g, options.baseline_policy, keys)
        is_base = g.policy == options.baseline_policy
        base_sub = groups[base] if base is not None and not is_base else None
        acc = mean_ci(_acc_pts(sub), conf)
        tps = mean_ci(_vals(sub, "tokens_per_s"), conf)
        mem = mean_ci(_vals(sub, "peak_bytes", 1.0 / GIB), conf)
        row: dict[str, Any] = {"group": g.label, "policy": g.policy, **dict(g.axes)}
        row["ablation"] = _uniq(sub, "ablation")
        row["n_trials"] = len(sub)
        for s in ("FINISHED", "DIVERGED", "FAILED", "INCOMPLETE"):
            row[f"n_{s.lower()}"] = int((sub["status"] == s).sum())
        diverged = sub[sub["status"] == "DIVERGED"]
        row["n_diverged_no_acc"] = int(diverged["accuracy"].isna().sum())
        row["n_superseded"] = (
            0 if superseded is None or superseded.empty else int(superseded["trial_id"].isin(sub["trial_id"]).sum())
        )
        row.update(
            n_seeds=acc.n, acc_mean=acc.mean, acc_sd=acc.sd, acc_low=acc.low, acc_high=acc.high, acc_note=acc.note
        )
        row["baseline"] = "(baseline)" if is_base else (base.label if base is not None else "")
        if base_sub is not None:
            w = welch(_acc_pts(sub), _acc_pts(base_sub), conf)
            tr = ratio_ci(_vals(sub, "tokens_per_s"), _vals(base_sub, "tokens_per_s"), conf)
            mr = ratio_ci(_vals(sub, "peak_bytes"), _vals(base_sub, "peak_bytes"), conf)
            sig = w.significant(options.alpha)
            row.update(
                delta_pts=w.delta,
                delta_low=w.low,
                delta_high=w.high,
                welch_df=w.df,
                welch_t=w.t,
                welch_p=w.p,
                significant=sig,
                delta_note=w.note,
                tps_ratio=tr.ratio,
                tps_ratio_low=tr.low,
                tps_ratio_high=tr.high,
                tps_ratio_note=tr.note,
                mem_ratio=mr.ratio,
                mem_ratio_low=mr.low,
                mem_ratio_high=mr.high,
                mem_ratio_note=mr.note,
            )
        else:
            note = "baseline" if is_base else f"no {options.baseline_policy} baseline"
            row.update(
                delta_pts=math.nan,
                delta_low=math.nan,
                delta_high=math.nan,
                welch_df=math.nan,
                welch_t=math.nan,
                welch_p=math.nan,
                significant=None,
                delta_note=note,
                tps_ratio=math.nan,
                tps_ratio_low=math.nan,
                tps_ratio_high=math.nan,
                tps_ratio_note=note,
                mem_ratio=math.nan,
                mem_ratio_low=math.nan,
                mem_ratio_high=math.nan,
                mem_ratio_note=note,
            )
        row.update(
            n_tps=tps.n,
            tps_mean=tps.mean,
            tps_low=tps.low,
            tps_high=tps.high,
            mem_gib_mean=mem.mean,
            mem_gib_low=mem.low,
            mem_gib_high=mem.high,
        )
        row["underflow_events_mean"] = _nanmean(_vals(sub, "underflow_events"))
        row["final_loss_mean"] = _nanmean(_vals(sub, "final_loss"))
        stds = _vals(sub, "lora_std_min")
        stds = stds[np.isfinite(stds)]
        row["lora_std_min"] = float(stds.min()) if stds.size else math.nan
        row["emulated"] = bool(sub["emulated"].any())
        row["backend"] = _uniq(sub, "backend")
        row["device"] = _uniq(sub, "device")
        tpe = sub["tokens_per_epoch"].to_numpy(dtype=float)
        tpe = tpe[np.isfinite(tpe)]
        row["tokens_per_epoch"] = float(np.median(tpe)) if tpe.size else math.nan
        c = training_cost(tps.mean, row["tokens_per_epoch"], options.gpu_hour_price, options.utilization, options.n_gpu)
        row.update(
            tokens_per_hour=c.tokens_per_hour,
            eff_cost_per_hour=c.eff_cost_per_hour,
            cost_per_1m_tokens=c.cost_per_1m_tokens,
            cost_per_epoch=c.cost_per_epoch,
            hours_per_epoch=c.hours_per_epoch,
        )
        rows.append(row)
    summary = pd.DataFrame(rows)
    if summary.empty:
        return summary
    summary["pareto"] = pareto_front(summary["acc_mean"].to_numpy(float), summary["tps_mean"].to_numpy(float))
    return summary


def _sig(value: object) -> bool | None:
    """Significance flag from a table cell: True/False, or None when no test was possible."""
    return bool(value) if isinstance(value, (bool, np.bool_)) else None


def _nanmean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


# --------------------------------------------------------------------------- verdicts


def _quality_phrase(row: Mapping[Any, Any], options: ReportOptions) -> str:
    base = options.baseline_policy
    d, lo, hi, p = row["delta_pts"], row["delta_low"], row["delta_high"], row["welch_p"]
    if not fmt.ok(row["acc_mean"]):
        return "no accuracy measured"
    if not fmt.ok(d):
        return f"accuracy {fmt.pm(row['acc_mean'], row['acc_low'], row['acc_high'])}% (no {base} baseline to compare)"
    has_ci = fmt.ok(lo) and fmt.ok(hi)
    hw = (float(hi) - float(lo)) / 2 if has_ci else math.nan
    sig = _sig(row["significant"])
    if sig is None:
        phrase = f"accuracy {fmt.num(d, 1, True)} points vs {base} (no significance test: {row['delta_note']})"
    elif not sig:
        phrase = (
            f"accuracy within {fmt.num(abs(float(d)))} ± {fmt.num(hw)} points of {base} "
            f"(not significant, Welch {fmt.p_eq(p)})"
        )
    else:
        word = "better" if float(d) > 0 else "worse"
        phrase = (
            f"accuracy {fmt.num(abs(float(d)))} ± {fmt.num(hw)} points {word} than {base} "
            f"(significant, Welch {fmt.p_eq(p)})"
        )
    rule = options.quality_loss_rule_pts
    if float(d) < -rule:
        phrase += f" — loses more than {rule:g} points: by the source article's rule, go back to BF16"
    elif has_ci and float(lo) < -rule:
        phrase += f" — the {options.confidence:.0%} CI reaches a loss of more than {rule:g} points; more seeds needed"
    return phrase


def verdict_lines(summary: pd.DataFrame, options: ReportOptions) -> list[str]:
    """One plain-language line per group, computed from the summary table only."""
    lines: list[str] = []
    for _, row in summary.iterrows():
        r = row.to_dict()
        speed_note = f" ({EMULATED_NOTE})" if r["emulated"] else ""
        stability = _stability(r)
        if r["policy"] == options.baseline_policy:
            parts = [
                f"baseline: accuracy {fmt.pm(r['acc_mean'], r['acc_low'], r['acc_high'])}% over "
                f"{r['n_seeds']} seed(s)" + (" (n=1: no CI)" if r["n_seeds"] == 1 else ""),
                f"{fmt.si(r['tps_mean'])} tokens/s{speed_note}",
            ]
        else:
            parts = [_quality_phrase(r, options)]
            if fmt.ok(r["tps_ratio"]):
                ci = fmt.interval(r["tps_ratio_low"], r["tps_ratio_high"])
                parts.append(f"{fmt.num(r['tps_ratio'], 2)}x its throughput" + (f" {ci}" if ci else "") + speed_note)
            elif fmt.ok(r["tps_mean"]):
                parts.append(f"{fmt.si(r['tps_mean'])} tokens/s{speed_note}")
            if fmt.ok(r["mem_ratio"]):
                parts.append(f"{fmt.num(r['mem_ratio'], 2)}x its peak memory")
        if stability:
            parts.append(stability)
        lines.append(f"{r['group']}: " + "; ".join(parts))
    return lines


# SOURCES.md §1: a LoRA weight std below 1e-4 late in training means the adapter is collapsing.
COLLAPSE_STD = 1e-4


def _stability(r: Mapping[Any, Any]) -> str:
    bits = []
    n = int(r["n_trials"])
    for key, word in (("n_diverged", "diverged"), ("n_failed", "failed"), ("n_incomplete", "incomplete")):
        k = int(r[key])
        if k:
            bits.append(f"{k} of {n} trial(s) {word}")
    if fmt.ok(r.get("lora_std_min")) and r["lora_std_min"] < COLLAPSE_STD:
        bits.append(f"LoRA collapse detector fired: the smallest LoRA weight std at the end is {r['lora_std_min']:.1e} "
                    f"(< {COLLAPSE_STD:g}, SOURCES.md §1), so some adapter matrices never left their zero init "
                    "and the fine-tune did not change the model")
    unevaluated = int(r.get("n_diverged_no_acc", 0) or 0)
    if unevaluated:
        bits.append(f"{unevaluated} diverged trial(s) were not evaluated and are missing from the accuracy mean")
    return ", ".join(bits)


# --------------------------------------------------------------------------- ablations


def ablation_table(trials: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    """Accuracy each protection recovers: acc(protected) - acc(variant without it), Welch CI.

    `share_of_gap` = recovered / (acc(protected) - acc(naive)); shares need not sum to 1 because
    protections interact. Empty when the sweep has no ablation variants.
    """
    groups = groups_of(trials, options)
    keys = list(groups)
    conf = options.confidence
    rows: list[dict[str, object]] = []
    for g, sub in groups.items():
        abl = _uniq(sub, "ablation")
        if not abl or g.policy in (options.protected_policy, options.naive_policy, options.baseline_policy):
            continue
        prot = find_reference(g, options.protected_policy, keys)
        naive = find_reference(g, options.naive_policy, keys)
        row: dict[str, object] = {"protection": abl, "variant": g.label, "policy": g.policy, **dict(g.axes)}
        if prot is None:
            row.update(
                recovered_pts=math.nan,
                recovered_low=math.nan,
                recovered_high=math.nan,
                welch_p=math.nan,
                significant=None,
                note=f"no {options.protected_policy} run with the same settings",
                gap_pts=math.nan,
                gap_low=math.nan,
                gap_high=math.nan,
                share_of_gap=math.nan,
                n_protected=0,
                n_variant=int(sub["counted"].sum()),
            )
            rows.append(row)
            continue
        w = welch(_acc_pts(groups[prot]), _acc_pts(sub), conf)
        row.update(
            recovered_pts=w.delta,
            recovered_low=w.low,
            recovered_high=w.high,
            welch_p=w.p,
            significant=w.significant(options.alpha),
            note=w.note,
            n_protected=w.n_x,
            n_variant=w.n_y,
        )
        if naive is not None:
            gap = welch(_acc_pts(groups[prot]), _acc_pts(groups[naive]), conf)
            share = w.delta / gap.delta if fmt.ok(gap.delta) and gap.delta > 0 and fmt.ok(w.delta) else math.nan
            row.update(gap_pts=gap.delta, gap_low=gap.low, gap_high=gap.high, share_of_gap=share)
        else:
            row.update(gap_pts=math.nan, gap_low=math.nan, gap_high=math.nan, share_of_gap=math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def ablation_lines(ablations: pd.DataFrame, options: ReportOptions) -> list[str]:
    """Plain-language reading of the ablation table."""
    lines = []
    naive, prot = options.naive_policy, options.protected_policy
    for _, r in ablations.iterrows():
        if not fmt.ok(r["recovered_pts"]):
            lines.append(f"{r['variant']}: {r['note'] or 'no accuracy to compare'}")
            continue
        sig = _sig(r["significant"])
        tag = "no test: " + str(r["note"]) if sig is None else ("significant" if sig else "not significant")
        cost = fmt.pm(r["recovered_pts"], r["recovered_low"], r["recovered_high"])
        line = f"switching off {r['protection']} costs {cost} points ({tag})"
        if fmt.ok(r["share_of_gap"]):
            line += f", i.e. {float(r['share_of_gap']):.0%} of the {naive}→{prot} gap of {fmt.num(r['gap_pts'])} points"
        elif fmt.ok(r["gap_pts"]):
            line += f"; the {naive}→{prot} gap is {fmt.num(r['gap_pts'], 1, True)} points, so no share is defined"
        lines.append(f"{r['variant']}: {line}")
    return lines
