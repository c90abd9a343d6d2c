"""The report's content, section by section, as render blocks (no I/O, no MLflow).

Every sentence here is derived from the tables in `summary`; this module only chooses words
and layout. The statistics section says exactly which test and interval were used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis import fmt
from analysis.disagreements import disagreement_blocks
from analysis.early_warning import early_warning_blocks
from analysis.figures import FigureArtifact
from analysis.load import SweepRef
from analysis.loss_compare import loss_cells
from analysis.options import ReportOptions
from analysis.recommend import recommendation
from analysis.render import Bullets, Document, Heading, Image, Para, Table
from analysis.summary import EMULATED_NOTE, ablation_lines, acc_text, verdict_lines
from analysis.tidy import axis_columns
from analysis.whatif import whatif_blocks
from fp8lab_conf.contracts import TAG_TRIAL_ID


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
    disagreements: pd.DataFrame | None = None
    """Items where a policy and the baseline disagree (`analysis.disagreements`); None: not computed."""
    whatif: pd.DataFrame = field(default_factory=pd.DataFrame)
    """``analysis.whatif.whatif_summary`` of the runs' what-if telemetry (empty: none logged)."""


def _axes_of(frame: pd.DataFrame) -> list[str]:
    return axis_columns(frame)


def _verdict_word(row: pd.Series, low_evidence_seeds: int) -> str:
    """The comparison's outcome in one or two words (after Holm); an equivalence below
    `low_evidence_seeds` compared seeds is only provisional."""
    sig, eq = row.get("significant"), row.get("equivalent")
    if isinstance(sig, (bool, np.bool_)) and sig:
        return "better" if float(row["delta_pts"]) > 0 else "worse"
    if isinstance(eq, (bool, np.bool_)) and eq:
        seeds = row.get("cmp_seeds")
        seeds = int(seeds) if fmt.ok(seeds) else int(row["n_seeds"])
        return f"provisionally equivalent ({seeds} seeds)" if seeds < low_evidence_seeds else "equivalent"
    if isinstance(sig, (bool, np.bool_)):
        return "not distinguishable"
    note = str(row["delta_note"])
    return "—" if note == "baseline" else f"no test ({note})"


def _task_cells(r: pd.Series, tasks: Sequence[str], base: str, options: ReportOptions) -> dict[str, str]:
    """Per-task columns: mean (interval or per-seed) and, against the baseline, Δ with its CI."""
    cells = {}
    for col in tasks:
        task = col[len("task.") :]
        text = fmt.spread(r[f"{col}.mean"], r[f"{col}.low"], r[f"{col}.high"], int(r[f"{col}.n"] or 0),
                          "per-seed values in runs.csv", options.low_evidence_seeds)  # fmt: skip
        if r["policy"] != base and fmt.ok(r.get(f"{col}.delta")):
            text += f"; Δ {fmt.num(r[f'{col}.delta'], 1, True)} {fmt.interval(r[f'{col}.delta_low'], r[f'{col}.delta_high'], 1)}"
        cells[task] = text
    return cells


def underflow_events_header(summary: pd.DataFrame) -> str:
    """The events column names its threshold: an event is a cast with at least that share of its
    elements flushed to zero, so 0 events stands beside heatmaps of a few percent underflow."""
    thresholds = sorted({float(t) for t in summary.get("underflow_threshold_pct", []) if fmt.ok(t)})
    if len(thresholds) == 1:
        return f"underflow events (casts ≥{thresholds[0]:g}% flushed)"
    return "underflow events (casts ≥ precision.telemetry.underflow_threshold_pct flushed)"


def quality_table(summary: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    base = options.baseline_policy
    tasks = sorted({c[: -len(".mean")] for c in summary.columns if c.startswith("task.") and c.endswith(".mean")})
    has_loss = "loss_mean" in summary and bool(np.isfinite(summary["loss_mean"].to_numpy(float)).any())
    rows = []
    for _, r in summary.iterrows():
        is_base = r["policy"] == base
        row = {
            "configuration": r["group"],
            "seeds": f"{int(r['n_seeds'])}"
            + (f" (+{int(r['n_diverged_no_acc'])} diverged, no accuracy)" if r["n_diverged_no_acc"] else "")
            + (f" (seed {r['missing_acc_seeds']}: no accuracy logged)" if r.get("missing_acc_seeds") else ""),
            "accuracy %": acc_text(r, options),
            f"Δ vs {base}, pts [{options.confidence:.0%} CI]": "—"
            if is_base
            else f"{fmt.num(r['delta_pts'], 1, True)} {fmt.interval(r['delta_low'], r['delta_high'], 1)}".strip(),
            "method": "—" if is_base else (r["method"] or fmt.NA),
            "p (Holm)": "—" if is_base else fmt.pvalue(r["p_holm"]),
            f"TOST ±{options.equivalence_margin_pts:g} p (Holm)": "—" if is_base else fmt.pvalue(r.get("tost_p_holm")),
            "verdict": _verdict_word(r, options.low_evidence_seeds),
            **_task_cells(r, tasks, base, options),
            **(loss_cells(r, options) if has_loss else {}),
            "final loss": fmt.num(r["final_loss_mean"], 3),
            underflow_events_header(summary): fmt.num(r["underflow_events_mean"], 1),
            "finished / diverged / failed / incomplete": " / ".join(
                str(r[f"n_{k}"]) for k in ("finished", "diverged", "failed", "incomplete")
            ),
        }
        if summary["deviations"].astype(bool).any():
            row["backend deviations"] = r["deviations"] or "none"
        rows.append(row)
    return pd.DataFrame(rows)


def _plain(mean: object, low: object, high: object, n: object, digits: int) -> str:
    """Mean ± half-width, saying 'zero variance over n seeds' rather than a bare '± 0.0'."""
    return fmt.spread(mean, low, high, int(n or 0), fmt.num(mean, digits), 2, digits)


def speed_table(summary: pd.DataFrame, options: ReportOptions) -> pd.DataFrame:
    base = options.baseline_policy
    rows = []
    for _, r in summary.iterrows():
        is_base = r["policy"] == base
        rows.append(
            {
                "configuration": r["group"],
                "tokens/s" + (" (emulated FP8)" if summary["emulated"].any() else ""): _plain(
                    r["tps_mean"], r["tps_low"], r["tps_high"], r["n_tps"], 1
                ) + (" (reused trial, timed in another context)" if r.get("tps_other_context") else ""),
                f"throughput × {base} [{options.confidence:.0%} CI]": "1.00x (baseline)"
                if is_base
                else fmt.ratio(r["tps_ratio"], r["tps_ratio_low"], r["tps_ratio_high"])
                + (f" ({r['tps_ratio_source']})" if r.get("tps_ratio_source") and fmt.ok(r["tps_ratio"]) else ""),
                "peak memory, GiB": _plain(r["mem_gib_mean"], r["mem_gib_low"], r["mem_gib_high"], r["n_mem"], 2),
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
                "rung": f"{'+' if r['direction'] == 'up' else '−'} {r['mechanism']}",
                "variant": r["variant"],
                "what it is": r["description"] or "—",
                f"accuracy the protection is worth, pts [{options.confidence:.0%} CI]": (
                    f"{fmt.num(r['effect_pts'], 1, True)} {fmt.interval(r['effect_low'], r['effect_high'], 1)}".strip()
                ),
                "method": r["method"] or fmt.NA,
                "p (Holm)": fmt.pvalue(r["p_holm"]),
                "significant": ("yes" if sig else "no")
                if isinstance(sig, (bool, np.bool_))
                else f"no test ({r['note']})",
                f"{options.naive_policy}→{options.protected_policy} gap, pts": (
                    f"{fmt.num(r['gap_pts'], 1, True)} {fmt.interval(r['gap_low'], r['gap_high'], 1)}".strip()
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
    if ref.parts:
        return (f"{len(ref.parts)} sweeps / experiments combined (experiments {ref.experiment_name}; sweeps "
                + ", ".join(f"`{s}`" for s in ref.sweep_ids) + "); recipe settings that differ between them "
                "(model, data, eval task, LoRA, training) are axes, so every comparison stays within one of them")
    if ref.all_runs:
        sweeps = ", ".join(f"`{s}`" for s in ref.sweep_ids) or "none tagged"
        return (
            f"all trial runs of experiment `{ref.experiment_name}` (sweeps: {sweeps}); trials pooled by policy "
            "and axis values, retries counted once"
        )
    return f"sweep `{ref.sweep_ids[0]}` of experiment `{ref.experiment_name}`"


Block = Heading | Para | Bullets | Table | Image


def _flags(inp: ReportInputs) -> tuple[bool, bool]:
    """(emulated FP8 anywhere, measured on CPU anywhere)."""
    s, t = inp.summary, inp.trials
    emulated = bool(len(s) and s["emulated"].any())
    on_cpu = bool(len(t) and t["device"].str.lower().str.startswith("cpu").any())
    return emulated, on_cpu


def intro_blocks(inp: ReportInputs) -> list[Block]:
    t = inp.trials
    n_counted = int(t["counted"].sum()) if len(t) else 0
    n_failed = int((t["status"] == "FAILED").sum()) if len(t) else 0
    n_incomplete = int((t["status"] == "INCOMPLETE").sum()) if len(t) else 0
    n_stopped = int((t["status"] == "STOPPED_EARLY").sum()) if len(t) else 0
    n_reused = int(t["reused"].sum()) if len(t) and "reused" in t else 0
    blocks: list[Block] = [Para(recommendation(inp.summary, inp.options))] if len(inp.summary) else []
    blocks += [
        Para(
            f"Report of {_scope_text(inp)}, tracking store `{inp.tracking_uri}`, generated {inp.generated_at}. "
            f"{len(t)} trial(s) from {len(t) + len(inp.superseded)} MLflow run(s): {n_counted} counted "
            f"(FINISHED or DIVERGED), {n_failed} failed, {n_incomplete} incomplete, "
            + (f"{n_stopped} stopped early (see Early warning), " if n_stopped else "")
            + f"{len(inp.superseded)} superseded retries."
            + (f" {n_reused} trial(s) finished in an earlier sweep and were reused (same trial id)." if n_reused else "")
            + (f" Logged to parent run `{inp.logged_to}` under `report/`." if inp.logged_to else "")
        )
    ]
    emulated, on_cpu = _flags(inp)
    if emulated:
        blocks.append(
            Para(
                f"FP8 was emulated (quantize-dequantize on {'CPU' if on_cpu else 'the device'}): "
                "accuracy effects are FP8's, but every speed and cost figure is "
                "**not representative of FP8 hardware**.",
                "warning",
            )
        )
    blocks += evidence_notes(inp)
    blocks += [Para(w, "note") for w in inp.warnings]
    return blocks


def evidence_notes(inp: ReportInputs) -> list[Block]:
    """Visible warnings about how much the numbers can carry: few seeds, lost metrics, overruled runs."""
    s, t, o = inp.summary, inp.trials, inp.options
    out: list[Block] = []
    if len(s):
        few = s[s["n_seeds"] < o.low_evidence_seeds]
        if len(few):
            out.append(
                Para(
                    f"**Low evidence**: {', '.join(few['group'])} ha{'s' if len(few) == 1 else 've'} fewer than "
                    f"{o.low_evidence_seeds} seeds with an accuracy. Their accuracy is shown per seed, not as a "
                    "t-interval, and every conclusion about them is provisional.",
                    "warning",
                )
            )
        lost = s[s["missing_acc_seeds"].astype(bool)]
        for _, r in lost.iterrows():
            out.append(
                Para(
                    f"{r['group']}: FINISHED seed(s) {r['missing_acc_seeds']} logged no `{o.accuracy_metric}` "
                    "(metrics lost or never written); they are missing from the accuracy statistics, not silently "
                    "averaged.",
                    "warning",
                )
            )
    if len(t):
        overruled = t[t["reason"].str.startswith("run marked FAILED in MLflow")]
        if len(overruled):
            names = ", ".join(overruled["run_name"].where(overruled["run_name"] != "", overruled["run_id"]))
            out.append(
                Para(
                    f"{len(overruled)} run(s) were marked FAILED in MLflow after the trial recorded a result "
                    f"({names}); they are counted as FAILED, not as results.",
                    "note",
                )
            )
    return out


def verdict_blocks(inp: ReportInputs) -> list[Block]:
    s, o = inp.summary, inp.options
    blocks: list[Block] = [Heading("Verdicts")]
    blocks.append(Bullets(verdict_lines(s, o, inp.ablations)) if len(s) else Para("No trials to summarise."))
    blocks.append(
        Para(
            f"How to read a verdict: **better/worse** — the accuracy difference to `{o.baseline_policy}` is "
            f"significant after Holm correction; **as good as** — a TOST equivalence test shows the difference is "
            f"inside ±{o.equivalence_margin_pts:g} points (`report.equivalence_margin_pts`); **not distinguishable "
            "with this evidence** — neither, so nothing is claimed and the line says how many seeds or items "
            f"would decide it. Reference rule from the source article: if quality loss exceeds "
            f"{o.quality_loss_rule_pts:g} points, go back to BF16. Comparisons are against `{o.baseline_policy}` "
            "with the same values of the other sweep axes.",
            "note",
        )
    )
    return blocks


def summary_blocks(inp: ReportInputs) -> list[Block]:
    s, o = inp.summary, inp.options
    blocks: list[Block] = [Heading("Summary")]
    if s.empty:
        return blocks
    emulated, _ = _flags(inp)
    methods = sorted({m for m in s["method"] if m})
    blocks.append(
        Table(
            quality_table(s, o),
            f"Quality: accuracy mean with its {o.confidence:.0%} t-interval over seeds (clipped to [0, 100]; per-seed "
            f"values below {o.low_evidence_seeds} seeds); Δ vs {o.baseline_policy} by "
            + (" / ".join(methods) or "no method")
            + "; p and TOST p Holm-corrected across this table.",
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
            "The full table with every number (CI bounds, raw and Holm-corrected p-values, method, cost) is in "
            "`summary.csv`; one row per trial is in `runs.csv`."
        )
    )
    return blocks


def figure_blocks(inp: ReportInputs) -> list[Block]:
    if inp.figures:
        return [Heading("Figures"), *[Image(f) for f in inp.figures]]
    return [Heading("Figures"), Para("No figures: the runs logged no accuracy, throughput, loss history or telemetry.")]


def mechanism_blocks(inp: ReportInputs) -> list[Block]:
    o, a = inp.options, inp.ablations
    if a.empty:
        return []
    return [
        Heading("Mechanisms: ladder and ablations"),
        Table(
            ablation_display(a, o),
            f"Up rungs (+) add one protection to their base policy, down rungs (−) remove one; the accuracy a "
            f"protection is worth = accuracy with it − accuracy without it ({o.confidence:.0%} CI, p Holm-corrected "
            f"across this table); share of the {o.naive_policy}→{o.protected_policy} gap it explains.",
        ),
        Bullets(ablation_lines(a, o)),
        Para(
            "Shares need not add up to 100%: protections interact, and each rung changes one protection of a full "
            "recipe. Shares that add up to about 0% mean the switches tested do not explain the gap.",
            "note",
        ),
    ]


def cost_blocks(inp: ReportInputs) -> list[Block]:
    s, o = inp.summary, inp.options
    emulated, on_cpu = _flags(inp)
    blocks: list[Block] = [
        Heading("Cost"),
        Para(
            f"Assumptions: {fmt.money(o.gpu_hour_price, o.currency)} per GPU-hour, {o.n_gpu} GPU(s), target "
            f"utilisation {o.utilization:.0%}. TokensPerHour = tokens/s × 3600 × N_gpu; "
            "EffCostPerHour = price × N_gpu / U; cost per 1M tokens = EffCostPerHour / (TokensPerHour / 1e6); "
            "cost per epoch = EffCostPerHour × tokens per epoch / TokensPerHour, tokens per epoch = "
            f"`{o.tokens_per_epoch_params[0]}` × `{o.tokens_per_epoch_params[1]}` "
            f"(or the `{o.tokens_per_epoch_metric}` metric)."
        ),
    ]
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
    return blocks


def problem_blocks(inp: ReportInputs) -> list[Block]:
    t = inp.trials
    blocks: list[Block] = [Heading("Runs that diverged, failed or did not finish")]
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
    sup = inp.superseded
    if len(sup):
        blocks.append(
            Para(
                f"{len(sup)} retried run(s) superseded (same `{TAG_TRIAL_ID}` as a kept run; the FINISHED "
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
    return blocks


def statistics_blocks(inp: ReportInputs) -> list[Block]:
    o = inp.options
    base = o.baseline_policy
    holm_m = int(inp.summary["holm_m"].iloc[0]) if len(inp.summary) and "holm_m" in inp.summary else 0
    abl_m = int(inp.ablations["holm_m"].iloc[0]) if len(inp.ablations) and "holm_m" in inp.ablations else 0
    return [
        Heading("Statistics used"),
        Bullets(
            [
                "Counted trials: FINISHED and DIVERGED (a diverged seed is part of what the policy delivers) "
                "wherever they logged the metric; a diverged trial that was not evaluated has no accuracy and "
                "appears only in the status counts and verdicts. FAILED (including runs marked FAILED in MLflow "
                "after the trial ended) and incomplete runs are listed, never averaged; a trial retried several "
                "times counts once.",
                f"Mean over seeds: Student t-interval, mean ± t(n−1) × s/√n at {o.confidence:.0%}, clipped to the "
                f"metric's possible range; below {o.low_evidence_seeds} seeds the per-seed values are shown instead.",
                f"Accuracy difference vs `{base}`, **seeds x items t** when every compared run logged per-item "
                "results (`eval/samples/<task>.jsonl`) on common items: every policy answers the same items, so the "
                "difference is paired on items, and on seeds when both sides ran the same seeds; seeds and items are "
                "crossed (item noise is not divided by the number of seeds). Var(Δ) = σ²(seed)/S + σ²(item)/n + "
                "σ²(residual)/(S·n) from the two-way ANOVA mean squares, with a t quantile on Satterthwaite's degrees "
                "of freedom: the seed term is estimated from S − 1 df, so with 2 seeds and seed-dominated noise the "
                f"quantile is t(1). At the margin this keeps false 'as good as' at or below {o.alpha:.0%} for 2, 3 "
                "and 5 seeds (docs/statistics.md); a bootstrap over 2 seeds reached 9%.",
                "Few discordant items (items on which not every compared run scored alike; the verdict gives their "
                "number) would make the interval too confident — with none at all the variance is 0 and anything "
                "would look equivalent. So the Agresti and Min (2005) ½ pseudo-count per discordant cell of the "
                "paired 2×2 table is added as known item variance: (range/items)² per task, with range the metric's "
                "(100 points for a 0/1 metric). It is negligible with many discordant items, while 0 discordant of "
                "40 items gives a 95% interval of about ±5 points, and 0 of 2000 about ±0.1.",
                f"Otherwise **binomial + seeds**: Var(Δ) = s²/n of each side's seed accuracies + each side's mean "
                "squared `eval/accuracy_stderr` (item noise, shared by a side's seeds), t quantile with "
                "Welch–Satterthwaite df; conservative, as it ignores the pairing on items. Without a stderr it is "
                "Welch's t-test. Each seed's stderr is at least the Wald error with ½ added to its right and wrong "
                "counts, √(p̃(1−p̃)/(n+1)) with p̃ = (right + ½)/(n + 1), so 0% or 100% accuracy (binomial stderr 0) "
                "is not noise-free; a side whose seeds agree and whose stderr is 0 or unknown gets no test. The "
                "method of each comparison is in the Summary table and `summary.csv`.",
                f"Equivalence: two one-sided tests (TOST) against ±{o.equivalence_margin_pts:g} points; 'as good as "
                f"`{base}`' only when the Holm-corrected TOST p < {o.alpha:.2g}, i.e. the "
                f"{1 - 2 * o.alpha:.0%} interval lies inside the margin. Otherwise the verdict is 'not "
                "distinguishable with this evidence' with the seeds or items (at 80% power, if the true difference "
                "were the observed one) a conclusive comparison would need, from the seed/item variance components.",
                f"Multiple comparisons: Holm–Bonferroni within each family of one report — the {holm_m} difference "
                f"tests vs `{base}`, the {holm_m} equivalence tests, and the {abl_m} mechanism-ladder tests; "
                f"significant means Holm-corrected p < {o.alpha:.2g}. Per-task Δ columns are descriptive and not "
                "corrected.",
                f"Throughput and memory ratios: ratio of means with a delta-method {o.confidence:.0%} interval on "
                "the log ratio, Var(log R) ≈ s_x²/(n_x·x̄²) + s_y²/(n_y·ȳ²), t quantile with Welch–Satterthwaite df.",
                "Pareto front: configurations for which no other is both at least as accurate and at least as fast "
                "(mean values).",
            ]
        ),
    ]


def build_document(inp: ReportInputs) -> Document:
    """The report, one builder per section, in reading order."""
    blocks: list[Block] = []
    for section in (intro_blocks, verdict_blocks, summary_blocks, figure_blocks, mechanism_blocks, cost_blocks,
                    problem_blocks):  # fmt: skip
        blocks += section(inp)
    blocks += whatif_blocks(inp.whatif)
    if inp.disagreements is not None:
        blocks += disagreement_blocks(inp.disagreements, inp.options.baseline_policy)
    blocks += early_warning_blocks(inp.trials, inp.options)
    blocks += [Heading("Environment"), Bullets([f"{k}: {v}" for k, v in inp.environment])]
    blocks += statistics_blocks(inp)
    title = "fp8lab report — " + (inp.ref.experiment_name or "experiment")
    if not inp.ref.all_runs and inp.ref.sweep_ids:
        title += f" / sweep {', '.join(inp.ref.sweep_ids)}"
    return Document(title, blocks)
