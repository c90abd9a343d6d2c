"""The early-warning sections of the report (docs/health.md): trials the health verdict stopped,
and how well the verdict predicted the trials that ran to the end.

Outcome of a trial that ran to the end (FINISHED or DIVERGED): **bad** when it diverged, or its
accuracy is more than `MARGIN_PTS` points below the baseline-policy trial with the same seed and
the same values of the other sweep axes; **ok** otherwise; **unknown** without that reference
accuracy; **reference** for the baseline policy's own trials, which are the yardstick of every
outcome and so would always score "ok" against themselves (they are not scored). The verdict is
the `fp8lab.health.verdict` tag the trial logged live at its verdict
step; `doomed` is the positive call (what `sweep.early_stop` acts on).

Trial time early stop would have saved on a trial called doomed: the training after the verdict
step plus the evaluation, `train/wall_s * (1 - verdict_step / steps_done) + eval/wall_s`; the
share is over the `trial/wall_s` of every scored trial.
"""
from __future__ import annotations

import math

import pandas as pd

from analysis import fmt
from analysis.options import ReportOptions
from analysis.render import Bullets, Heading, Para, Table
from analysis.tidy import axis_columns
from fp8lab_conf.contracts import STATUS_STOPPED_EARLY

MARGIN_PTS = 5.0
VERDICT_ORDER = ("doomed", "at_risk", "healthy", "none")


def outcomes(trials: pd.DataFrame, options: ReportOptions) -> pd.Series:
    """bad / ok / unknown / reference per trial that ran to the end (others: "")."""
    axes = axis_columns(trials)
    base = trials[(trials["policy"] == options.baseline_policy) & trials["counted"]]
    ref = {(*(r[a] for a in axes), r["seed"]): r["accuracy"] for _, r in base.iterrows()}
    out = []
    for _, r in trials.iterrows():
        if not r["counted"]:
            out.append("")
        elif r["policy"] == options.baseline_policy:
            out.append("reference")
        elif r["status"] == "DIVERGED":
            out.append("bad")
        else:
            acc, ref_acc = r["accuracy"], ref.get((*(r[a] for a in axes), r["seed"]), math.nan)
            if not (fmt.ok(acc) and fmt.ok(ref_acc)):
                out.append("unknown")
            else:
                # rounded: 0.9575 - 0.9075 is 5.000000000000004 points, which is not "more than 5"
                out.append("bad" if round(100 * (ref_acc - acc), 9) > MARGIN_PTS else "ok")
    return pd.Series(out, index=trials.index, dtype=str)


def saved_seconds(r: pd.Series) -> float:
    """Trial time a stop at the verdict step would have saved (NaN when unknown)."""
    step, done = pd.to_numeric(r.get("health_step"), errors="coerce"), r.get("steps_done")
    if not (fmt.ok(step) and fmt.ok(done) and done > 0 and fmt.ok(r.get("wall_s"))):
        return math.nan
    return float(r["wall_s"]) * max(0.0, 1 - float(step) / float(done)) + (float(r["eval_wall_s"]) if fmt.ok(r.get("eval_wall_s")) else 0.0)


def scoring(trials: pd.DataFrame, options: ReportOptions) -> dict[str, object]:
    """Confusion counts, precision, recall and saved share of the live verdicts."""
    t = trials.assign(outcome=outcomes(trials, options))
    t = t[t["outcome"].isin(("bad", "ok"))].copy()
    t["verdict"] = t["health_verdict"].replace("", "none")
    t["saved_s"] = [saved_seconds(r) if r["verdict"] == "doomed" else 0.0 for _, r in t.iterrows()]
    counts = {(v, o): int(((t["verdict"] == v) & (t["outcome"] == o)).sum()) for v in VERDICT_ORDER for o in ("bad", "ok")}
    tp, fp = counts[("doomed", "bad")], counts[("doomed", "ok")]
    fn = sum(counts[(v, "bad")] for v in VERDICT_ORDER if v != "doomed")
    total = float(t["trial_wall_s"].sum(skipna=True)) if len(t) else math.nan
    return {
        "scored": t, "counts": counts, "tp": tp, "fp": fp, "fn": fn,
        "precision": tp / (tp + fp) if tp + fp else math.nan,
        "recall": tp / (tp + fn) if tp + fn else math.nan,
        "saved_share": float(t["saved_s"].sum(skipna=True)) / total if total and total > 0 else math.nan,
        "warned_recall": (tp + counts[("at_risk", "bad")]) / (tp + fn) if tp + fn else math.nan,
    }


def confusion_table(score: dict[str, object]) -> pd.DataFrame:
    counts = score["counts"]
    rows = [{"verdict at the verdict step": v.replace("_", " ") if v != "none" else "no verdict (ended before it)",
             "bad outcome": counts[(v, "bad")], "ok outcome": counts[(v, "ok")]} for v in VERDICT_ORDER]
    return pd.DataFrame([r for r in rows if r["bad outcome"] or r["ok outcome"] or r["verdict at the verdict step"] != "no verdict (ended before it)"])


def _who(r: pd.Series, axes: list[str]) -> dict[str, str]:
    row = {"run": r["run_name"] or r["run_id"], "policy": r["policy"]}
    row.update({a.removeprefix("axis."): r[a] or "—" for a in axes})
    row["seed"] = fmt.num(r["seed"], 0)
    return row


def wrong_calls(score: dict[str, object]) -> pd.DataFrame:
    t = score["scored"]
    axes = axis_columns(t)
    wrong = t[((t["verdict"] == "doomed") & (t["outcome"] == "ok")) | ((t["verdict"] != "doomed") & (t["outcome"] == "bad"))]
    rows = [{**_who(r, axes), "verdict": r["verdict"].replace("_", " "), "outcome": r["outcome"],
             "accuracy %": fmt.num(100 * r["accuracy"], 1) if fmt.ok(r["accuracy"]) else r["status"],
             "signals": r["health_reasons"] or "—"} for _, r in wrong.iterrows()]
    return pd.DataFrame(rows)


def stopped_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Every trial the early stop ended: where, why, and the compute it saved (estimated)."""
    stopped = trials[trials["status"] == STATUS_STOPPED_EARLY]
    done = trials[trials["status"] == "FINISHED"]
    eval_s = float(done["eval_wall_s"].median()) if len(done) and done["eval_wall_s"].notna().any() else 0.0
    axes = axis_columns(trials)
    rows = []
    for _, r in stopped.iterrows():
        steps, done_steps = r.get("train_steps"), r.get("steps_done")
        rest = (float(r["wall_s"]) / done_steps * (steps - done_steps)
                if fmt.ok(r.get("wall_s")) and fmt.ok(steps) and fmt.ok(done_steps) and done_steps > 0 else math.nan)
        rows.append({**_who(r, axes), "stopped at step": fmt.num(done_steps, 0) + (f"/{fmt.num(steps, 0)}" if fmt.ok(steps) else ""),
                     "predicted outcome": f"doomed: {r['health_reasons'] or r['stopped_early'] or 'reason not recorded'}",
                     "compute saved, s (est.)": fmt.num(rest + eval_s, 0) if fmt.ok(rest) else fmt.NA})
    return pd.DataFrame(rows)


def early_warning_blocks(trials: pd.DataFrame, options: ReportOptions) -> list:
    """Report sections; empty when no trial logged a health verdict."""
    if trials.empty or "health_verdict" not in trials or not (trials["health_verdict"] != "").any():
        return []
    blocks: list = [Heading("Early warning")]
    stopped = stopped_table(trials)
    if len(stopped):
        blocks += [Para(f"{len(stopped)} trial(s) were stopped at their health verdict (`sweep.early_stop=true`): "
                        "not evaluated, so they have no accuracy and are in no statistic above; their metrics and "
                        "telemetry up to the stop are in MLflow."),
                   Table(stopped, "Compute saved: the remaining training steps at the trial's own pace plus the "
                                  "median evaluation time of the finished trials.")]
    score = scoring(trials, options)
    n = len(score["scored"])
    if not n:
        return blocks + [Para("No trial with a verdict ran to the end with a reference accuracy, so the verdict "
                              "cannot be scored here (run with `sweep.early_stop=false` to validate it).")]
    blocks += [
        Para(f"How the live verdict predicted the outcome of the {n} trial(s) that ran to the end. Bad outcome: "
             f"diverged, or more than {MARGIN_PTS:g} points below `{options.baseline_policy}` with the same seed and "
             "other axis values. Positive call: **doomed** (what `sweep.early_stop` stops). "
             f"`{options.baseline_policy}` trials are the reference and are not scored."),
        Table(confusion_table(score)),
        Bullets([f"precision (doomed calls that were bad): {fmt.num(score['precision'], 2)} "
                 f"({score['tp']} of {score['tp'] + score['fp']})",
                 f"recall (bad trials called doomed): {fmt.num(score['recall'], 2)} ({score['tp']} of {score['tp'] + score['fn']}); "
                 f"called doomed or at risk: {fmt.num(score['warned_recall'], 2)}",
                 f"trial time early stop would have saved: {fmt.num(100 * score['saved_share'], 1)}% of the "
                 "scored trials' total (`trial/wall_s`)"]),
    ]
    wrong = wrong_calls(score)
    blocks.append(Table(wrong, "Where the verdict was wrong.") if len(wrong)
                  else Para("The verdict was right on every scored trial."))
    return blocks
