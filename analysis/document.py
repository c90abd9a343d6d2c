"""The report's content, section by section, as render blocks (no I/O, no MLflow).

Every sentence here is derived from the tables in `summary`; this module only chooses words
and layout. The statistics section says exactly which test and interval were used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import fmt
from analysis.figures import FigureArtifact
from analysis.load import SweepRef
from analysis.options import ReportOptions
from analysis.render import Bullets, Document, Heading, Image, Para, Table
from analysis.summary import EMULATED_NOTE, ablation_lines, verdict_lines
from analysis.tidy import axis_columns


@dataclass(frozen=True)
class ReportInputs:
    """Everything the document is written from."""

    ref: SweepRef
    tracking_uri: str
    """Already redacted (no credentials)."""
    generated_at: str
    options: ReportOptions
    trials: pd.DataFrame
    superseded: pd.DataFrame
    summary: pd.DataFrame
    ablations: pd.DataFrame
    figures: Sequence[FigureArtifact]
    environment: Sequence[tuple[str, str]]
    warnings: Sequence[str] = ()
    logged_to: str | None = None


def _axes_of(frame: pd.DataFrame) -> list[str]:
    return axis_columns(frame)


def _sig_text(row: pd.Series) -> str:
    sig = row["significant"]
    if isinstance(sig, (bool, np.bool_)):
        return "yes" if sig else "no"
    note = str(row["delta_note"])
    return "—" if note == "baseline" else f"no test ({note})"


def quality_table(summary: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    base = options.baseline_policy
    rows = []
    for _, r in summary.iterrows():
        acc = fmt.pm(r["acc_mean"], r["acc_low"], r["acc_high"])
        if r["n_seeds"] == 1:
            acc += " (n=1, no CI)"
        rows.append(
            {
                "configuration": r["group"],
                "seeds": f"{int(r['n_seeds'])}"
                + (f" (+{int(r['n_diverged_no_acc'])} diverged, no accuracy)" if r["n_diverged_no_acc"] else ""),
                "accuracy %": acc,
                f"Δ vs {base}, pts": "—"
                if r["policy"] == base
                else fmt.pm(r["delta_pts"], r["delta_low"], r["delta_high"], 1, True),
                "Welch p": "—" if r["policy"] == base else fmt.pvalue(r["welch_p"]),
                "significant": _sig_text(r),
                "final loss": fmt.num(r["final_loss_mean"], 3),
                "underflow events": fmt.num(r["underflow_events_mean"], 1),
                "finished / diverged / failed / incomplete": " / ".join(
                    str(r[f"n_{k}"]) for k in ("finished", "diverged", "failed", "incomplete")
                ),
            }
        )
    return pd.DataFrame(rows)


def speed_table(summary: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    base = options.baseline_policy
    rows = []
    for _, r in summary.iterrows():
        is_base = r["policy"] == base
        rows.append(
            {
                "configuration": r["group"],
                "tokens/s" + (" (emulated FP8)" if summary["emulated"].any() else ""): fmt.pm(
                    r["tps_mean"], r["tps_low"], r["tps_high"], 1
                ),
                f"throughput × {base} [{options.confidence:.0%} CI]": "1.00x (baseline)"
                if is_base
                else fmt.ratio(r["tps_ratio"], r["tps_ratio_low"], r["tps_ratio_high"]),
                "peak memory, GiB": fmt.pm(r["mem_gib_mean"], r["mem_gib_low"], r["mem_gib_high"], 2),
                f"memory × {base} [{options.confidence:.0%} CI]": "1.00x (baseline)"
                if is_base
                else fmt.ratio(r["mem_ratio"], r["mem_ratio_low"], r["mem_ratio_high"]),
                "Pareto": "yes" if r["pareto"] else "",
                "backend": r["backend"] or fmt.NA,
                "emulated": "yes" if r["emulated"] else "no",
            }
        )
    return pd.DataFrame(rows)


def cost_table(summary: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    cur = options.currency
    rows = []
    for _, r in summary.iterrows():
        rows.append(
            {
                "configuration": r["group"],
                "tokens/s": fmt.num(r["tps_mean"], 1),
                "tokens/hour": fmt.si(r["tokens_per_hour"], 2),
                "cost per 1M tokens": fmt.money(r["cost_per_1m_tokens"], cur),
                "tokens per epoch": fmt.si(r["tokens_per_epoch"], 2),
                "cost per epoch": fmt.money(r["cost_per_epoch"], cur),
                "billed hours per epoch": fmt.num(r["hours_per_epoch"], 3),
            }
        )
    return pd.DataFrame(rows)


def ablation_display(ablations: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    rows = []
    for _, r in ablations.iterrows():
        sig = r["significant"]
        rows.append(
            {
                "protection switched off": r["protection"],
                "variant": r["variant"],
                f"accuracy recovered by it, pts [{options.confidence:.0%} CI]": fmt.pm(
                    r["recovered_pts"], r["recovered_low"], r["recovered_high"], 1, True
                ),
                "Welch p": fmt.pvalue(r["welch_p"]),
                "significant": ("yes" if sig else "no")
                if isinstance(sig, (bool, np.bool_))
                else f"no test ({r['note']})",
                f"{options.naive_policy}→{options.protected_policy} gap, pts": fmt.pm(
                    r["gap_pts"], r["gap_low"], r["gap_high"], 1, True
                ),
                "share of gap": f"{float(r['share_of_gap']):.0%}" if fmt.ok(r["share_of_gap"]) else fmt.NA,
            }
        )
    return pd.DataFrame(rows)


def problem_runs_table(trials: pd.DataFrame, statuses: Sequence[str]) -> pd.DataFrame:
    sel = trials[trials["status"].isin(statuses)]
    axes = _axes_of(trials)
    rows = []
    for _, r in sel.sort_values(["status", "policy", "run_name"]).iterrows():
        row = {"run": r["run_name"] or r["run_id"], "policy": r["policy"]}
        for a in axes:
            row[a.removeprefix("axis.")] = r[a] or "—"
        row.update(
            {
                "seed": fmt.num(r["seed"], 0),
                "status": r["status"] + ("" if r["status"] != "INCOMPLETE" else f" (MLflow {r['mlflow_status']})"),
                "reason": r["reason"] or ("not recorded" if r["status"] in ("DIVERGED", "FAILED") else "—"),
                "diverged at step": fmt.num(r["diverged_step"], 0) if fmt.ok(r["diverged_step"]) else "—",
                "run id": f"`{r['run_id']}`",
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _scope_text(inp: ReportInputs) -> str:
    ref = inp.ref
    if ref.all_runs:
        sweeps = ", ".join(f"`{s}`" for s in ref.sweep_ids) or "none tagged"
        return (
            f"all trial runs of experiment `{ref.experiment_name}` (sweeps: {sweeps}); trials pooled by policy "
            "and axis values, retries counted once"
        )
    return f"sweep `{ref.sweep_ids[0]}` of experiment `{ref.experiment_name}`"


def build_document(inp: ReportInputs) -> Document:
    o = inp.options
    s = inp.summary
    t = inp.trials
    base = o.baseline_policy
    emulated = bool(len(s) and s["emulated"].any())
    on_cpu = bool(len(t) and t["device"].str.lower().str.startswith("cpu").any())
    n_counted = int(t["counted"].sum()) if len(t) else 0
    n_incomplete = int((t["status"] == "INCOMPLETE").sum()) if len(t) else 0
    n_reused = int(t["reused"].sum()) if len(t) and "reused" in t else 0
    blocks: list = []
    blocks.append(
        Para(
            f"Report of {_scope_text(inp)}, tracking store `{inp.tracking_uri}`, generated {inp.generated_at}. "
            f"{len(t)} trial(s) from {len(t) + len(inp.superseded)} MLflow run(s): {n_counted} counted "
            f"(FINISHED or DIVERGED), {int((t['status'] == 'FAILED').sum()) if len(t) else 0} failed, "
            f"{n_incomplete} incomplete, {len(inp.superseded)} superseded retries."
            + (
                f" {n_reused} trial(s) finished in an earlier sweep and were reused (same trial id)."
                if n_reused
                else ""
            )
            + (f" Logged to parent run `{inp.logged_to}` under `report/`." if inp.logged_to else "")
        )
    )
    if emulated:
        blocks.append(
            Para(
                f"FP8 was emulated (quantize-dequantize on {'CPU' if on_cpu else 'the device'}): "
                "accuracy effects are FP8's, but every speed and cost figure is "
                "**not representative of FP8 hardware**.",
                "warning",
            )
        )
    for w in inp.warnings:
        blocks.append(Para(w, "note"))

    blocks.append(Heading("Verdicts"))
    if s.empty:
        blocks.append(Para("No trials to summarise."))
    else:
        blocks.append(Bullets(verdict_lines(s, o)))
    blocks.append(
        Para(
            f"Reference rule from the source article: if quality loss exceeds {o.quality_loss_rule_pts:g} "
            f"points, go back to BF16. Comparisons are against `{base}` with the same values of the other "
            "sweep axes.",
            "note",
        )
    )

    blocks.append(Heading("Summary"))
    if not s.empty:
        blocks.append(
            Table(
                quality_table(s, o),
                f"Quality: accuracy mean ± half-width of the {o.confidence:.0%} "
                f"t-interval over seeds; Δ vs {base} with Welch's t-test.",
            )
        )
        blocks.append(
            Table(
                speed_table(s, o),
                "Speed and memory: ratios to the baseline with delta-method "
                f"{o.confidence:.0%} CI." + (f" {EMULATED_NOTE}." if emulated else ""),
            )
        )
        blocks.append(
            Para(
                "The full table with every number (CI bounds, degrees of freedom, cost) is in "
                "`summary.csv`; one row per trial is in `runs.csv`."
            )
        )

    blocks.append(Heading("Figures"))
    if inp.figures:
        blocks += [Image(f) for f in inp.figures]
    else:
        blocks.append(Para("No figures: the runs logged no accuracy, throughput, loss history or telemetry."))

    if not inp.ablations.empty:
        blocks.append(Heading("Ablations"))
        blocks.append(
            Table(
                ablation_display(inp.ablations, o),
                f"Accuracy each protection recovers = accuracy({o.protected_policy}) − accuracy(variant "
                f"without it), Welch {o.confidence:.0%} CI; share of the {o.naive_policy}→"
                f"{o.protected_policy} gap it explains.",
            )
        )
        blocks.append(Bullets(ablation_lines(inp.ablations, o)))
        blocks.append(
            Para(
                "Shares need not add up to 100%: protections interact, and each variant removes one "
                "protection from the full recipe.",
                "note",
            )
        )

    blocks.append(Heading("Cost"))
    blocks.append(
        Para(
            f"Assumptions: {fmt.money(o.gpu_hour_price, o.currency)} per GPU-hour, {o.n_gpu} GPU(s), target "
            f"utilisation {o.utilization:.0%}. TokensPerHour = tokens/s × 3600 × N_gpu; "
            "EffCostPerHour = price × N_gpu / U; cost per 1M tokens = EffCostPerHour / (TokensPerHour / 1e6); "
            "cost per epoch = EffCostPerHour × tokens per epoch / TokensPerHour, tokens per epoch = "
            f"`{o.tokens_per_epoch_params[0]}` × `{o.tokens_per_epoch_params[1]}` "
            f"(or the `{o.tokens_per_epoch_metric}` metric)."
        )
    )
    if emulated or on_cpu:
        blocks.append(
            Para(
                "Throughput was measured "
                + ("on CPU " if on_cpu else "")
                + ("with emulated FP8 " if emulated else "")
                + "— these costs illustrate the formula, they do not predict a GPU bill.",
                "warning",
            )
        )
    if not s.empty:
        blocks.append(Table(cost_table(s, o)))
        if not s["tokens_per_epoch"].notna().any():
            blocks.append(
                Para(
                    f"Tokens per epoch unknown: the runs log neither `{o.tokens_per_epoch_params[0]}` and "
                    f"`{o.tokens_per_epoch_params[1]}` params nor a `{o.tokens_per_epoch_metric}` metric, so there "
                    "is no cost per epoch.",
                    "note",
                )
            )

    blocks.append(Heading("Runs that diverged, failed or did not finish"))
    bad = problem_runs_table(t, ("DIVERGED", "FAILED")) if len(t) else pd.DataFrame()
    blocks.append(Table(bad) if len(bad) else Para("None: every trial finished without diverging."))
    inc = problem_runs_table(t, ("INCOMPLETE",)) if len(t) else pd.DataFrame()
    if len(inc):
        blocks.append(
            Para(
                f"{len(inc)} run(s) still running or killed (MLflow status RUNNING / KILLED); listed, not "
                "counted in any statistic:"
            )
        )
        blocks.append(Table(inc))
    if len(inp.superseded):
        sup = inp.superseded
        blocks.append(
            Para(
                f"{len(sup)} retried run(s) superseded (same `fp8lab.trial_id` as a kept run; the FINISHED "
                "run is preferred, then the latest):"
            )
        )
        blocks.append(
            Table(
                pd.DataFrame(
                    {
                        "run": sup["run_name"],
                        "status": sup["status"],
                        "trial id": sup["trial_id"].map(lambda x: f"`{x}`"),
                        "kept run": sup["superseded_by"].map(lambda x: f"`{x}`"),
                    }
                )
            )
        )

    blocks.append(Heading("Environment"))
    blocks.append(Bullets([f"{k}: {v}" for k, v in inp.environment]))

    blocks.append(Heading("Statistics used"))
    blocks.append(
        Bullets(
            [
                "Counted trials: FINISHED and DIVERGED (a diverged seed is part of what the policy delivers) "
                "wherever they logged the metric; a diverged trial that was not evaluated has no accuracy and "
                "appears only in the status counts and verdicts. FAILED and incomplete runs are listed, never "
                "averaged; a trial retried several times counts once.",
                f"Mean over seeds: Student t-interval, mean ± t(n−1) × s/√n at {o.confidence:.0%}; "
                "n=1 has no interval.",
                f"Accuracy difference vs `{base}`: Welch's unequal-variance two-sided t-test and its "
                f"{o.confidence:.0%} interval (Welch–Satterthwaite df); significant means p < {o.alpha:.2g}. "
                "No multiple-comparison correction. "
                "No test when a group has fewer than 2 seeds or both have zero variance.",
                f"Throughput and memory ratios: ratio of means with a delta-method {o.confidence:.0%} interval on "
                "the log ratio, Var(log R) ≈ s_x²/(n_x·x̄²) + s_y²/(n_y·ȳ²), t quantile with Welch–Satterthwaite df.",
                "Pareto front: configurations for which no other is both at least as accurate and at least as fast "
                "(mean values).",
            ]
        )
    )
    title = "fp8lab report — " + (inp.ref.experiment_name or "experiment")
    if not inp.ref.all_runs and inp.ref.sweep_ids:
        title += f" / sweep {inp.ref.sweep_ids[0]}"
    return Document(title, blocks)
