"""The `fp8lab` command: trial, sweep, report, export, ui, bench, policies.

Arguments after the subcommand's flags are Hydra overrides (`lora.r=16`, `precision=fp8_naive`,
`'+sweep.axes={train.lr:[1e-4,2e-4]}'`). Bad input exits with code 2 and one line per problem,
before anything is written.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

from fp8lab_conf.contracts import STATUS_STOPPED_EARLY
from fp8lab_conf.garbage_collection import skip_final_collection
from orchestrator.errors import UserInputError

EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130

EPILOG = """examples:
  fp8lab sweep                                  # default sweep: 3 policies x 2 seeds, then the report
  fp8lab sweep --dry-run '+sweep.axes={lora.r:[8,16]}'
  fp8lab sweep -m precision=bf16,fp8_protected seed=0,1 train.lr=1e-4,3e-4   # Hydra's multirun grammar
  fp8lab sweep precision=fp8_protected          # a plain value of an axis narrows it: 2 trials (seeds 0, 1)
  fp8lab trial precision=fp8_protected seed=1 trial.output=result.json
  fp8lab report --out report/
  fp8lab export RUN_ID --format fp8-block128 --out model-fp8/
  fp8lab export --sweep SWEEP_ID --best --format merged --out model/ --register my-model
  fp8lab ui
  fp8lab bench precision=bf16,fp8_protected     # paired speed probe: step-time ratios to bf16 with CIs
  fp8lab trial --cfg job                        # print the composed config
  fp8lab trial --info                           # config search path, every group's options
  fp8lab policies                               # the precision policies: name, version, ladder base
  fp8lab data preview data.path=sft.jsonl -n 3  # the rows as trained: loss tokens marked, counts, truncation
"""


def build_parser() -> argparse.ArgumentParser:
    from orchestrator.discover import groups_epilog

    parser = argparse.ArgumentParser(prog="fp8lab", description="LoRA fine-tunes under BF16 vs FP8 precision policies, "
                                     "scheduled on Ray, tracked in MLflow.", epilog=EPILOG + "\n" + groups_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("policies", help="list the precision policies (name, version, ladder base, description)")
    trial = sub.add_parser("trial", help="run one trial (a LoRA fine-tune under one precision policy)")
    _add_hydra_args(trial)
    trial.add_argument("--force", action="store_true",
                       help="rerun the trial even if an identical one (same trial id) already FINISHED in the experiment")
    sweep = sub.add_parser("sweep", help="run the sweep matrix on Ray (policies x seeds x other axes)")
    _add_hydra_args(sweep)
    sweep.add_argument("--dry-run", action="store_true", help="print the trials (and which would be skipped) and stop")
    sweep.add_argument("-m", "--multirun", action="store_true",
                       help="Hydra's flag, accepted for familiarity: `fp8lab sweep` always reads key=a,b, choice(), "
                            "range() and glob() as sweep axes")
    sweep.add_argument("--force", action="store_true", help="rerun trials that already FINISHED in this experiment")
    report = sub.add_parser("report", help="write the quality-vs-speed report from MLflow")
    report.add_argument("--experiment", action="append", default=[],
                        help="MLflow experiment (default: sweep.name); repeat to combine experiments in one report")
    group = report.add_mutually_exclusive_group()
    group.add_argument("--sweep", dest="sweep_id", action="append", default=[],
                       help="sweep id to report (default: the latest sweep); repeat to combine sweeps in one report "
                            "(each policy is compared with the baseline of the same model, task and recipe)")
    group.add_argument("--all", action="store_true", help="report every trial run in the experiment")
    report.add_argument("--out", help="output folder (default: fp8lab-report/<sweep_id>)")
    report.add_argument("--no-log", action="store_true",
                        help="leave the MLflow store untouched: no report/ artifacts, no closing of lost runs")
    _add_hydra_args(report, cfg=False)
    from orchestrator.bench_cmd import add_bench_parser
    from orchestrator.data_preview import add_data_parser
    from orchestrator.export_cmd import add_export_parser

    add_export_parser(sub)
    add_bench_parser(sub)
    add_data_parser(sub)
    ui = sub.add_parser("ui", help="start the MLflow UI on 127.0.0.1 for the configured store")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ui.add_argument("--experiment", help="experiment to open (default: sweep.name)")
    ui.add_argument("--with-jobs", action="store_true",
                    help="also start MLflow's job runner (GenAI jobs; off by default: several extra processes)")
    _add_hydra_args(ui, cfg=False)
    return parser


def _add_hydra_args(parser: argparse.ArgumentParser, cfg: bool = True) -> None:
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. precision=fp8_naive train.steps=100")
    parser.add_argument("--config-dir", help="your own config folder, searched before fp8lab's (Hydra search path)")
    if cfg:
        parser.add_argument("--cfg", choices=["job", "all", "hydra"],
                            help="print the composed config and exit (like Hydra's --cfg; 'hydra' is refused: "
                                 "there is no Hydra runtime config)")
        parser.add_argument("--info", action="store_true",
                            help="print the config search path and every config group's options, and exit")
        parser.add_argument("-sc", "--shell-completion", metavar="ARG", help=argparse.SUPPRESS)
        parser.add_argument("--hydra-help", action="store_true", help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "export" and all("=" in e and not e.startswith("-") for e in extra):
        args.args += extra  # `export RUN_ID --format ... key=value`: overrides after the options
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "trial": cmd_trial, "sweep": cmd_sweep, "report": cmd_report, "export": cmd_export, "ui": cmd_ui,
        "bench": cmd_bench, "policies": cmd_policies, "data": cmd_data}
    try:
        _hydra_flags(args)
        if getattr(args, "info", False):
            from orchestrator.discover import print_info

            return print_info(args.config_dir)
        return handlers[args.command](args)
    except UserInputError as exc:
        for problem in exc.problems:
            print(f"fp8lab: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _hydra_flags(args: argparse.Namespace) -> None:
    """Hydra's app flags that have no meaning here are refused with the supported alternative."""
    from orchestrator.discover import refuse

    if getattr(args, "cfg", None) == "hydra":
        refuse("--cfg hydra")
    if getattr(args, "shell_completion", None) is not None:
        refuse("--shell-completion")
    if getattr(args, "hydra_help", False):
        refuse("--hydra-help")


def cmd_policies(args: argparse.Namespace) -> int:
    from orchestrator.discover import print_policies

    return print_policies()


def _composed(args: argparse.Namespace) -> dict[str, Any]:
    from orchestrator.config_loader import compose_config, to_container
    from orchestrator.schema import validate_config
    from orchestrator.sweep_grammar import refuse_sweep_overrides

    if args.command != "sweep":  # a sweep's overrides were rewritten into axes by cmd_sweep
        refuse_sweep_overrides(args.overrides, args.command)
    config = to_container(compose_config(args.overrides, args.config_dir))
    problems = validate_config(config)
    if problems:
        raise UserInputError(problems)
    return config


def _print_cfg(config: dict[str, Any]) -> int:
    from orchestrator.matrix import resolved_yaml

    print(resolved_yaml(config), end="")
    return 0


def cmd_trial(args: argparse.Namespace) -> int:
    config = _composed(args)  # before importing MLflow (seconds): a config mistake is reported at once
    if args.cfg:
        return _print_cfg(config)
    from orchestrator.single_trial import run_single_trial

    result = run_single_trial(config, args.overrides, args.force)
    return {"FINISHED": 0, "DIVERGED": 0, STATUS_STOPPED_EARLY: 0, "KILLED": EXIT_INTERRUPTED}.get(result["status"], EXIT_FAILED)


def cmd_sweep(args: argparse.Namespace) -> int:
    from orchestrator.sweep_grammar import rewrite_sweep_overrides

    command_line = rewrite_sweep_overrides(args.overrides, args.config_dir)
    args.overrides = command_line.overrides
    config = _composed(args)  # before importing MLflow and Ray (seconds): a config mistake is reported at once
    if args.cfg:
        return _print_cfg(config)
    from orchestrator.plan import plan_sweep

    plan = plan_sweep(config, args.overrides, args.config_dir, args.force)
    from orchestrator import sweep as sweep_mod
    from orchestrator.progress import console

    out = console()
    if args.dry_run:
        _print_plan(plan, out, command_line.axes_set)
        return 0
    if not plan.to_run:
        out.print(f"All {len(plan.specs)} trials of sweep {plan.sweep_id} already FINISHED (use --force to rerun them).")
        outcome = None
    else:
        outcome = sweep_mod.run_sweep(plan, out)
        _print_outcome(outcome, out)
        if outcome.interrupted:
            out.print("Interrupted: unfinished trials marked KILLED; run the same command again to finish them.")
            return EXIT_INTERRUPTED
    if plan.config["sweep"]["report"]:
        _report_after_sweep(plan, out)
    _print_where(plan, out)
    failed = outcome is not None and any(r["status"] == "FAILED" for r in outcome.results.values())
    return EXIT_FAILED if failed else 0


def _print_plan(plan: Any, out: Any, axes_set: dict[str, str]) -> None:
    from rich.table import Table

    from orchestrator.axes import flatten_axes
    from orchestrator.matrix import describe

    axes = flatten_axes(plan.config["sweep"]["axes"])
    out.print("axes: " + " x ".join(f"{k}={v}" + (f" (from {axes_set[k]})" if k in axes_set else "") for k, v in axes.items()),
              highlight=False, markup=False)

    table = Table(title=f"sweep {plan.sweep_id}: {len(plan.specs)} trials, experiment '{plan.config['sweep']['name']}'")
    rows = [describe(s) for s in plan.specs]
    columns = list(dict.fromkeys(k for row in rows for k in row)) + ["action"]
    for column in columns:
        table.add_column(column)
    for spec, row in zip(plan.specs, rows):
        action = "skip (FINISHED)" if spec.trial_id in plan.skipped else "run"
        table.add_row(*[str(row.get(c, "")) for c in columns[:-1]], action)
    out.print(table)
    out.print("Overrides per trial: fp8lab trial <your overrides> " + " ".join(plan.specs[0].overrides[-len(plan.specs[0].axis_values):]) if plan.specs else "")


def _print_outcome(outcome: Any, out: Any) -> None:
    from orchestrator.progress import summary_table

    out.print(summary_table(outcome.plan.to_run, outcome.results, f"sweep {outcome.plan.sweep_id} results"))
    busy = sum(r.get("task_wall_s", 0.0) for r in outcome.results.values())
    ideal = busy / outcome.slots
    efficiency = ideal / outcome.makespan_s if outcome.makespan_s else 0.0
    out.print(f"makespan {outcome.makespan_s:.0f}s for {len(outcome.results)} trials on {outcome.slots} parallel slot(s); "
              f"sum of trial durations / slots = {ideal:.0f}s -> scheduling efficiency {efficiency:.2f}")


def _report_after_sweep(plan: Any, out: Any) -> None:
    """The sweep ends with its report; a report problem is shown (one line) but never changes the
    sweep's exit status: the trials' results are in MLflow whatever happens to the files."""
    from analysis.report import generate_report

    try:
        result = _run_report(plan.config, plan.tracking_uri, plan.config["sweep"]["name"], plan.sweep_id, False, None, generate_report)
    except UserInputError as exc:
        out.print(f"Report not written: {exc} (the sweep's results are in MLflow; rerun `fp8lab report` when fixed)")
        return
    except Exception as exc:  # noqa: BLE001 - a report bug must not fail a sweep whose trials finished
        out.print(f"Report not written: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                  "(the sweep's results are in MLflow; rerun `fp8lab report`)")
        return
    where = "logged to the sweep's parent run" if result.logged_to_run_id else "NOT logged to MLflow: see the warning above"
    out.print(f"Report: {result.report_html} (also report.md, summary.csv, figures/; {where})")


def _run_report(config: dict[str, Any], uri: str, experiment: str | list[str] | None, sweep_id: str | list[str] | None,
                all_runs: bool, out_dir: str | None, generate: Callable[..., Any], log: bool = True) -> Any:
    from dataclasses import replace

    from analysis.errors import ReportError
    from analysis.options import ReportOptions

    rep = config["report"]
    sweeps = [sweep_id] if isinstance(sweep_id, str) else list(sweep_id or [])
    target = Path(out_dir or rep["out"] or f"fp8lab-report/{'+'.join(sweeps) or ('all' if all_runs else 'latest')}")
    try:
        options = ReportOptions.from_mapping(rep, ignore=["out"])
        options = options if log else replace(options, log_to_mlflow=False)
        return generate(tracking_uri=uri, experiment=experiment, sweep_id=sweep_id, all_runs=all_runs,
                        out_dir=target, options=options)
    except ReportError as exc:
        raise UserInputError(str(exc)) from None


def _print_where(plan: Any, out: Any) -> None:
    name = plan.config["sweep"]["name"]
    out.print(f"Results: MLflow store {plan.tracking_uri}, experiment '{name}', sweep {plan.sweep_id}")
    out.print(f"Open the MLflow UI: {ui_command(plan.tracking_uri, name)}", soft_wrap=True)
    out.print(f"Use the best model: fp8lab export --sweep {plan.sweep_id} --best --format fp8-block128 --out model-fp8 "
              f"tracking.uri={shlex.quote(plan.tracking_uri)}", soft_wrap=True)


def ui_command(uri: str, experiment: str) -> str:
    """The full `fp8lab ui` command for this store and experiment (works from any folder)."""
    return f"fp8lab ui tracking.uri={shlex.quote(uri)} --experiment {shlex.quote(experiment)}"


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import generate_report

    from orchestrator.runs import absolute_uri

    from orchestrator.store_checks import store_kind_problems

    config = _composed(args)
    uri = absolute_uri(config["tracking"]["uri"])
    if problems := store_kind_problems(uri):
        raise UserInputError(problems)
    experiments = args.experiment or ([config["sweep"]["name"]] if args.all else [])
    if not args.no_log:  # --no-log: the report only reads
        for experiment in experiments or [None]:
            _close_lost_drivers(uri, experiment)
    result = _run_report(config, uri, experiments, args.sweep_id, args.all, args.out, generate_report, not args.no_log)
    logged = "logged to the sweep's parent run" if result.logged_to_run_id else "not logged to MLflow"
    print(f"Report written to {result.out_dir}: report.html, report.md, summary.csv, figures/ "
          f"({result.n_runs} trials, {result.n_counted} in the statistics; {logged})")
    return 0


def _close_lost_drivers(uri: str, experiment: str | None) -> None:
    """Runs whose sweep driver died are closed (KILLED, reason `driver lost`) before the report
    reads them; a store this cannot write (read-only copy) is reported as it is."""
    from orchestrator.runs import close_lost_in_store

    try:
        lines = close_lost_in_store(uri, experiment)
    except Exception as exc:  # noqa: BLE001 - the report itself still runs and names store problems
        print(f"fp8lab: warning: could not check for runs of lost drivers: {str(exc).splitlines()[0] if str(exc) else exc!r}",
              file=sys.stderr)
        return
    for line in lines:
        print(f"fp8lab: {line}", file=sys.stderr)


def cmd_export(args: argparse.Namespace) -> int:
    from orchestrator.export_cmd import cmd_export as run_export

    return run_export(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from orchestrator.bench_cmd import run_bench
    from orchestrator.sweep_grammar import rewrite_sweep_overrides

    args.overrides = rewrite_sweep_overrides(args.overrides, args.config_dir).overrides
    args.command = "sweep"  # the overrides are axes now, as for `fp8lab sweep`
    return run_bench(args, _composed(args))


def cmd_data(args: argparse.Namespace) -> int:
    from orchestrator.data_preview import run_preview

    return run_preview(args, _composed(args))


def cmd_ui(args: argparse.Namespace) -> int:
    from orchestrator.config_loader import compose_config, to_container
    from orchestrator.sweep_grammar import refuse_sweep_overrides
    from orchestrator.runs import absolute_uri
    from orchestrator.ui import runs_view_url, server_command, server_env

    refuse_sweep_overrides(args.overrides, "ui")
    config = to_container(compose_config(args.overrides, args.config_dir))
    uri = absolute_uri(config["tracking"]["uri"])
    url = runs_view_url(uri, args.experiment or config["sweep"]["name"], args.host, args.port)
    print(f"MLflow UI for {uri}: {url}  (Ctrl-C to stop)", flush=True)
    command = server_command(uri, args.host, args.port)
    os.execve(command[0], command, server_env(args.with_jobs))  # the server replaces this process: one less


def run() -> NoReturn:
    """The `fp8lab` command: `main`, then exit without the interpreter's final walk over every
    object (fp8lab_conf.garbage_collection says why). Tests call `main`, which returns."""
    code = main()
    skip_final_collection()
    sys.exit(code)


if __name__ == "__main__":
    run()
