"""generate_report: MLflow runs -> report.md, report.html, summary.csv, figures/*.png.

The pipeline reads top to bottom: resolve which runs -> fetch -> tidy -> statistics -> figures ->
document -> write (atomically) -> log to the parent run. Everything that can be missing (metrics,
histories, telemetry, env info) degrades to "n/a" or a note; only user errors raise ReportError.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import load
from analysis.compare import Evidence
from analysis.disagreements import DISAGREEMENTS_CSV, disagreements
from analysis.document import ReportInputs, build_document
from analysis.loss_compare import LossEvidence
from analysis.environment import environment_items
from analysis.errors import ReportError
from analysis.figures import all_figures, whatif_heatmaps
from analysis.files import write_folder_atomic
from analysis.options import ReportOptions
from analysis.render import to_html, to_markdown
from analysis.speed_probe import apply_probe, probe_ratios
from analysis.summary import ablation_table, build_summary
from analysis.tidy import apply_final_values, axes_where_runs_differ, clean_history, dedupe_trials, step_series, tidy_runs
from analysis.whatif import whatif_summary
from fp8lab_conf.contracts import WHATIF_COLUMNS, WHATIF_PATH

log = logging.getLogger(__name__)

FIGURE_DIR = "figures"
MANIFEST = ".fp8lab-report.json"


@dataclass(frozen=True)
class ReportResult:
    """What was written and what it covers."""

    out_dir: Path
    report_md: Path
    report_html: Path
    summary_csv: Path
    runs_csv: Path
    ablations_csv: Path | None
    figures: tuple[Path, ...]
    n_runs: int
    """Trials reported (one per trial id, incomplete ones included)."""
    n_counted: int
    """Trials that entered the statistics (FINISHED or DIVERGED)."""
    n_mlflow_runs: int
    """MLflow child runs read (retries included)."""
    experiment: str
    sweep_ids: tuple[str, ...]
    parent_run_id: str | None
    logged_to_run_id: str | None
    """Parent run the files were logged to under `report/`, or None (--all, disabled, or failed)."""
    warnings: tuple[str, ...]
    seconds: float
    timings: dict[str, float]
    disagreements_csv: Path | None = None
    """Items where a policy and the baseline disagree (`analysis.disagreements`), when any."""

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every file written."""
        extra = tuple(p for p in (self.ablations_csv, self.disagreements_csv) if p)
        return (self.report_md, self.report_html, self.summary_csv, self.runs_csv, *extra, *self.figures)


_RUNS_CSV_FIRST = [
    "run_id",
    "run_name",
    "trial_id",
    "policy",
    "seed",
    "status",
    "counted",
    "reason",
    "diverged_step",
    "mlflow_status",
    "accuracy",
    "tokens_per_s",
    "peak_bytes",
]


def resolve_refs(tracking_uri: str, experiment: str | Sequence[str] | None, sweep_id: str | Sequence[str] | None,
                 all_runs: bool) -> load.SweepRef:
    """What a report covers: each sweep id (looked up in the named experiment, or in all of them
    when several are named), else each experiment's latest sweep (or all its runs), combined."""
    experiments = [experiment] if isinstance(experiment, str) or experiment is None else list(experiment) or [None]
    sweeps = [sweep_id] if isinstance(sweep_id, str) else list(sweep_id or [])
    if sweeps:
        scope = experiments[0] if len(experiments) == 1 else None
        refs = [load.resolve_sweep(tracking_uri, scope, s, all_runs) for s in sweeps]
    else:
        refs = [load.resolve_sweep(tracking_uri, e, None, all_runs) for e in experiments]
    return load.combine_refs(refs)


def _runs_csv(trials: pd.DataFrame, superseded: pd.DataFrame) -> str:
    both = pd.concat([trials.assign(superseded_by=""), superseded], ignore_index=True)
    first = [c for c in _RUNS_CSV_FIRST if c in both.columns]
    return both[first + [c for c in both.columns if c not in first]].to_csv(index=False)


def generate_report(
    tracking_uri: str,
    experiment: str | Sequence[str] | None,
    sweep_id: str | Sequence[str] | None,
    all_runs: bool,
    out_dir: Path,
    options: ReportOptions | None = None,
) -> ReportResult:
    """Write the report of one sweep (default: the latest) or of all runs of an experiment; several
    sweep ids or experiments combine into one report (`resolve_refs`).

    Raises ReportError (a ValueError) for an unknown experiment / sweep id, a store without sweeps,
    or a sweep without trial runs; the message names the fix.
    """
    options = options or ReportOptions()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str, start: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - start, 3)
        return now

    out_dir = Path(out_dir)
    warnings: list[str] = []
    t = time.perf_counter()
    ref = resolve_refs(tracking_uri, experiment, sweep_id, all_runs)
    parent = load.fetch_parent(tracking_uri, ref.parent_run_id)
    with load.quiet_downloads():
        raw = load.fetch_runs(tracking_uri, ref, parent["artifact_uri"] if parent else None)
    if ref.parts:
        raw = axes_where_runs_differ(raw)
    t = lap("search_runs", t)
    if raw.empty:
        what = f"experiment {ref.experiment_name!r}" if ref.all_runs else f"sweep {ref.sweep_ids[0]!r}"
        raise ReportError(f"{what} has no trial runs yet; wait for trials to start, or pass --sweep with another id")
    if ref.all_runs:
        warnings.append(
            "--all: runs of every sweep of the experiment are pooled; the report is not logged to a parent run."
        )
    if ref.parts:
        warnings.append(f"{len(ref.parts)} sweeps / experiments combined: each policy is compared with the baseline "
                        "of the same model, task and recipe; the report is not logged to a parent run.")
    elif not ref.all_runs and ref.parent_run_id is None:
        warnings.append(f"sweep {ref.sweep_ids[0]} has no parent run; the report is not logged to MLflow.")

    runs = tidy_runs(raw, options)
    trials, superseded = dedupe_trials(runs)
    counted = trials[trials["counted"]]
    keys = list(dict.fromkeys([options.loss_metric, *options.final_from_history]))
    histories = clean_history(load.fetch_histories(tracking_uri, counted["run_id"].tolist(), keys, options.max_workers))
    trials = apply_final_values(trials, histories, options)
    counted = trials[trials["counted"]]
    history = step_series(histories, options.loss_metric)
    t = lap("metric_history", t)
    telemetry = whatif = pd.DataFrame()
    uris = raw.set_index("run_id")["artifact_uri"].to_dict()
    with load.quiet_downloads():
        if options.fetch_telemetry:
            fp8 = counted[counted["policy"] != options.baseline_policy]
            telemetry = load.fetch_telemetry(
                tracking_uri, [(r, str(uris.get(r) or "")) for r in fp8["run_id"]], options.max_workers
            )
            whatif = whatif_summary(load.fetch_telemetry(
                tracking_uri, [(r, str(uris.get(r) or "")) for r in fp8["run_id"]], options.max_workers,
                WHATIF_COLUMNS, WHATIF_PATH), counted)  # fmt: skip
        t = lap("telemetry", t)
        first_child = str(uris.get(trials["run_id"].iloc[0]) or "") if len(trials) else ""
        env_json = load.fetch_env_json(tracking_uri, [parent["artifact_uri"] if parent else "", first_child])
    env = environment_items(raw, parent, env_json)
    t = lap("environment", t)

    with load.quiet_downloads():
        samples = load.fetch_samples(
            tracking_uri, [(r, str(uris.get(r) or "")) for r in counted["run_id"]], options.max_workers
        )
        loss_rows = load.fetch_loss_rows(
            tracking_uri, [(r, str(uris.get(r) or "")) for r in counted["run_id"]], options.max_workers
        )
    evidence = Evidence.of(samples)
    disagree = disagreements(counted, samples, options.baseline_policy)
    loss_evidence = LossEvidence.of(loss_rows)
    t = lap("eval_samples", t)
    summary = apply_probe(build_summary(trials, options, superseded, evidence, loss_evidence),
                          probe_ratios(parent.get("metrics") if parent else None))
    ablations = ablation_table(trials, options, evidence)
    t = lap("statistics", t)
    figures = all_figures(trials, summary, history, telemetry, options, warnings)
    if not whatif.empty:
        figures = [*figures, *whatif_heatmaps(whatif, options)]
    t = lap("figures", t)

    will_log = options.log_to_mlflow and ref.parent_run_id is not None and not ref.all_runs
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc = build_document(
        ReportInputs(
            ref=ref,
            tracking_uri=load.redact_uri(tracking_uri),
            generated_at=generated,
            options=options,
            trials=trials,
            superseded=superseded,
            summary=summary,
            ablations=ablations,
            figures=figures,
            environment=env,
            warnings=warnings,
            whatif=whatif,
            logged_to=ref.parent_run_id if will_log else None,
            disagreements=disagree,
        )
    )

    payloads: dict[str, bytes | str] = {f"{FIGURE_DIR}/{f.name}.png": f.png for f in figures}
    payloads.update({"summary.csv": summary.to_csv(index=False), "runs.csv": _runs_csv(trials, superseded),
                     "report.html": to_html(doc), "report.md": to_markdown(doc, FIGURE_DIR)})
    if len(ablations):
        payloads["ablations.csv"] = ablations.to_csv(index=False)
    if len(disagree):
        payloads[DISAGREEMENTS_CSV] = disagree.to_csv(index=False)
    try:  # the whole folder at once: never a mix of two reports, nothing changed on failure
        written = write_folder_atomic(out_dir, payloads, MANIFEST)
    except OSError as exc:
        raise ReportError(f"report.out: cannot write the report to {out_dir}: {exc.strerror or exc} (fix: free space "
                          "or choose a writable folder with --out / report.out; nothing there was changed)") from None
    fig_paths = tuple(out_dir / name for name in payloads if name.startswith(f"{FIGURE_DIR}/"))
    report_md, report_html, summary_csv, runs_csv = (out_dir / n for n in ("report.md", "report.html", "summary.csv", "runs.csv"))
    abl_csv = out_dir / "ablations.csv" if len(ablations) else None
    t = lap("write", t)

    logged_to = None
    if will_log:
        try:
            load.log_report_artifacts(tracking_uri, str(ref.parent_run_id), written, out_dir)
            logged_to = ref.parent_run_id
        except Exception as exc:  # the files are on disk; say what failed instead of losing them
            log.warning("could not log the report to run %s: %s", ref.parent_run_id, exc)
            warnings.append(f"report written to {out_dir} but not logged to MLflow run {ref.parent_run_id}: {exc}")
    lap("log_artifacts", t)
    return ReportResult(
        out_dir=out_dir,
        report_md=report_md,
        report_html=report_html,
        summary_csv=summary_csv,
        runs_csv=runs_csv,
        ablations_csv=abl_csv,
        figures=fig_paths,
        n_runs=len(trials),
        n_counted=len(counted),
        n_mlflow_runs=len(raw),
        experiment=ref.experiment_name,
        sweep_ids=ref.sweep_ids,
        parent_run_id=ref.parent_run_id,
        logged_to_run_id=logged_to,
        warnings=tuple(warnings),
        seconds=round(time.perf_counter() - t0, 3),
        timings=timings,
        disagreements_csv=out_dir / DISAGREEMENTS_CSV if len(disagree) else None,
    )
