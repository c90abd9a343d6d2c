"""MLflow -> pandas: every network/database call of the report lives here.

Speed matters (a sweep can have hundreds of runs, and a report server may be remote), so:
- runs are fetched with paged `search_runs` filtered on `fp8lab.sweep_id` (one query per 1000 runs);
  scalar metrics, params and tags come with them — no per-run `get_run`;
- the only per-run calls are the metric history we plot (`train/loss`) and the telemetry Parquet
  of FP8 runs; both are I/O-bound and run on a small thread pool;
- artifacts are downloaded straight from each run's `artifact_uri` (no extra run lookup).
Nothing here interprets the data; `analysis.tidy` does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

import pandas as pd

from analysis.errors import ReportError, did_you_mean
from fp8lab_conf import contracts
from fp8lab_conf.contracts import (
    LOSS_ROWS_ARTIFACT, ROLE_SWEEP, ROLE_TRIAL, SAMPLES_DIR, TAG_POLICY, TAG_ROLE, TAG_SWEEP_ID, TAG_TRIAL_ID, TELEMETRY_PATH,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# The report reads the per-layer cast statistics; `value` (per-parameter LoRA rows) is not used.
TELEMETRY_COLUMNS = tuple(c for c in contracts.TELEMETRY_COLUMNS if c != "value")
SAMPLE_COLUMNS = ("run_id", "task", "doc_id", "metric", "value", "prompt", "target", "response")
ENV_JSON = "env.json"
SWEEP_TRIALS_JSON = "sweep/trials.json"
_PAGE = 1000
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:\-]+$")


def _client(tracking_uri: str) -> Any:
    """An MlflowClient bound to this URI (never touches the global tracking URI)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def redact_uri(uri: str) -> str:
    """The tracking URI without user:password, safe to print in a report."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return uri


@dataclass(frozen=True)
class SweepRef:
    """Which runs a report covers and where its artifacts go."""

    experiment_id: str
    experiment_name: str
    sweep_ids: tuple[str, ...]
    """Sweep ids covered (one, or every sweep of the experiment with --all)."""
    parent_run_id: str | None
    """Parent run of the reported sweep (None with --all, or if the parent was deleted)."""
    all_runs: bool
    parent_start_time: int | None = None
    parts: tuple["SweepRef", ...] = ()
    """Several sweeps / experiments in one report (`combine_refs`): the refs it was made of."""


def combine_refs(refs: list[SweepRef]) -> SweepRef:
    """One report over several sweeps or experiments (`--sweep A --sweep B`, `--experiment X
    --experiment Y`): not logged to any parent run, since no single sweep owns it."""
    unique = list({(r.experiment_id, r.sweep_ids, r.all_runs): r for r in refs}.values())
    if len(unique) == 1:
        return unique[0]
    names = ", ".join(dict.fromkeys(r.experiment_name for r in unique))
    sweeps = tuple(dict.fromkeys(s for r in unique for s in r.sweep_ids))
    return SweepRef(unique[0].experiment_id, names, sweeps, None, any(r.all_runs for r in unique), parts=tuple(unique))


def check_store_exists(tracking_uri: str) -> None:
    """A report only reads: fail on a missing SQLite file instead of letting MLflow create an empty one."""
    if tracking_uri.startswith("sqlite:///"):
        path = Path(tracking_uri[len("sqlite:///") :].split("?", 1)[0])
        if str(path) not in ("", ":memory:") and not path.exists():
            raise ReportError(
                f"no MLflow store at {path.resolve()}; pass tracking.uri=sqlite:///<path>/mlflow.db of the store your sweep "
                "wrote (--tracking-uri with python -m analysis) "
                "(or run the report from the folder that has mlflow.db)"
            )


def _experiments(client: Any) -> list[Any]:
    from mlflow.entities import ViewType

    out: list[Any] = []
    token = None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=_PAGE, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _search(
    client: Any,
    experiment_ids: Sequence[str],
    filter_string: str = "",
    order_by: Sequence[str] | None = None,
    limit: int | None = None,
) -> list[Any]:
    """All matching active runs, following page tokens."""
    out: list[Any] = []
    token = None
    while True:
        page = client.search_runs(
            list(experiment_ids),
            filter_string=filter_string,
            order_by=list(order_by or []),
            max_results=min(_PAGE, limit) if limit else _PAGE,
            page_token=token,
        )
        out.extend(page)
        token = page.token
        if not token or (limit and len(out) >= limit):
            return out[:limit] if limit else out


def _check_id(sweep_id: str) -> None:
    if not _SAFE_ID.match(sweep_id):
        raise ReportError(
            f"sweep id {sweep_id!r} has characters a sweep id never has; pass the id printed by the sweep"
        )


def resolve_sweep(tracking_uri: str, experiment: str | None, sweep_id: str | None, all_runs: bool) -> SweepRef:
    """Turn the user's (experiment, sweep, --all) into concrete ids, or raise ReportError.

    No arguments: the latest parent run tagged fp8lab.role=sweep in any experiment.
    --all: every trial run of the experiment (the named one, else the latest sweep's); the report is
    then not logged to any parent run, because no single sweep owns it.
    """
    if sweep_id and all_runs:
        raise ReportError("--sweep and --all are mutually exclusive; pass one of them")
    check_store_exists(tracking_uri)
    client = _client(tracking_uri)
    shown_uri = redact_uri(tracking_uri)
    exps = _experiments(client)
    if experiment is not None:
        match = [e for e in exps if e.name == experiment]
        if not match:
            raise ReportError(
                f"experiment {experiment!r} not found in {shown_uri}"
                f"{did_you_mean(experiment, [e.name for e in exps])} — pass --experiment with one of these"
            )
        scope = match
    else:
        scope = exps
    if not scope:
        raise ReportError(
            f"no experiments in {shown_uri}; run a sweep first or pass tracking.uri=<the store that has it> "
            "(--tracking-uri with python -m analysis)"
        )
    scope_ids = [e.experiment_id for e in scope]
    names = {e.experiment_id: e.name for e in exps}
    role = f"tags.`{TAG_ROLE}` = '{ROLE_SWEEP}'"
    if sweep_id:
        _check_id(sweep_id)
        parents = _search(
            client, scope_ids, f"{role} and tags.`{TAG_SWEEP_ID}` = '{sweep_id}'", ["attributes.start_time DESC"], limit=1
        )
        if parents:
            p = parents[0]
            return SweepRef(
                p.info.experiment_id,
                names.get(p.info.experiment_id, ""),
                (sweep_id,),
                p.info.run_id,
                False,
                p.info.start_time,
            )
        children = _search(client, scope_ids, f"tags.`{TAG_SWEEP_ID}` = '{sweep_id}'", limit=1)
        if children:
            c = children[0]
            log.warning("sweep %s has no parent run; the report will not be logged to MLflow", sweep_id)
            return SweepRef(c.info.experiment_id, names.get(c.info.experiment_id, ""), (sweep_id,), None, False)
        known = [
            r.data.tags.get(TAG_SWEEP_ID, "")
            for r in _search(client, scope_ids, role, ["attributes.start_time DESC"], limit=50)
        ]
        raise ReportError(
            f"unknown sweep id {sweep_id!r} in {shown_uri}{did_you_mean(sweep_id, [k for k in known if k])}"
            " — pass --sweep with one of these, or --all"
        )
    latest = _search(client, scope_ids, role, ["attributes.start_time DESC"], limit=1)
    if all_runs:
        if experiment is None and not latest:
            raise ReportError(
                f"no sweeps (runs tagged {TAG_ROLE}=sweep) in {shown_uri}; pass --experiment to report "
                "its trial runs, or run `fp8lab sweep` first"
            )
        exp_id = scope_ids[0] if experiment is not None else latest[0].info.experiment_id
        sweeps = _search(client, [exp_id], role)
        ids = tuple(sorted({r.data.tags.get(TAG_SWEEP_ID, "") for r in sweeps} - {""}))
        return SweepRef(exp_id, names.get(exp_id, ""), ids, None, True)
    if not latest:
        where = f"experiment {experiment!r}" if experiment else shown_uri
        raise ReportError(
            f"no sweeps (runs tagged {TAG_ROLE}=sweep) in {where}; run `fp8lab sweep` first, "
            "or pass tracking.uri=<store> (--tracking-uri with python -m analysis) / --experiment pointing at the store "
            "that has them"
        )
    p = latest[0]
    sid = p.data.tags.get(TAG_SWEEP_ID, "")
    if not sid:
        raise ReportError(f"latest sweep run {p.info.run_id} has no {TAG_SWEEP_ID} tag; pass --sweep or --all")
    return SweepRef(
        p.info.experiment_id, names.get(p.info.experiment_id, ""), (sid,), p.info.run_id, False, p.info.start_time
    )


def _run_row(run: Any) -> dict[str, Any]:
    info, data = run.info, run.data
    row: dict[str, Any] = {
        "run_id": info.run_id,
        "run_name": info.run_name,
        "experiment_id": info.experiment_id,
        "mlflow_status": info.status,
        "start_time": info.start_time,
        "end_time": info.end_time,
        "artifact_uri": info.artifact_uri,
    }
    row.update({"tags." + k: v for k, v in data.tags.items()})
    row.update({"params." + k: v for k, v in data.params.items()})
    row.update({"metrics." + k: v for k, v in data.metrics.items()})
    return row


def _is_trial(run: Any) -> bool:
    tags = run.data.tags
    return tags.get(TAG_ROLE) != ROLE_SWEEP and (tags.get(TAG_ROLE) == ROLE_TRIAL or TAG_POLICY in tags)


def fetch_runs(tracking_uri: str, ref: SweepRef, parent_artifact_uri: str | None = None) -> pd.DataFrame:
    """The trial runs of the sweep(s) as one raw row per MLflow run (search_runs column style).

    A sweep skips trials that already finished in an earlier sweep of the experiment, so their runs
    carry the earlier sweep's id. When the parent run lists its trial ids (`sweep/trials.json`),
    those runs are fetched too (by trial id) and flagged `reused` = True.
    """
    if ref.parts:
        frames = [fetch_runs(tracking_uri, part, (fetch_parent(tracking_uri, part.parent_run_id) or {}).get("artifact_uri"))
                  for part in ref.parts]
        return pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True).drop_duplicates("run_id")
    client = _client(tracking_uri)
    if ref.all_runs:
        runs = _search(client, [ref.experiment_id])
    else:
        runs = _search(client, [ref.experiment_id], f"tags.`{TAG_SWEEP_ID}` = '{ref.sweep_ids[0]}'")
    runs = [r for r in runs if _is_trial(r)]
    reused: list[Any] = []
    if not ref.all_runs and parent_artifact_uri:
        have = {r.data.tags.get(TAG_TRIAL_ID, "") for r in runs}
        wanted = {t for t in sweep_trial_ids(tracking_uri, parent_artifact_uri) if t not in have}
        if wanted:  # MLflow's search has no IN for tags: one scan of the experiment's trial runs
            found = _search(client, [ref.experiment_id], f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'")
            reused = [r for r in found if r.data.tags.get(TAG_TRIAL_ID) in wanted and _is_trial(r)]
    rows = [_run_row(r) | {"reused": False} for r in runs] + [_run_row(r) | {"reused": True} for r in reused]
    if not rows:
        return pd.DataFrame(
            columns=["run_id", "run_name", "experiment_id", "mlflow_status", "start_time", "end_time", "artifact_uri"]
        )
    return pd.DataFrame.from_records(rows)


def sweep_trial_ids(tracking_uri: str, parent_artifact_uri: str) -> list[str]:
    """Trial ids the sweep's parent run lists in `sweep/trials.json`; [] when absent or unreadable.

    Accepted shapes: ["id", ...], {"trial_ids": [...]}, or {"trials": [{"trial_id": ...}, ...]}.
    """
    with tempfile.TemporaryDirectory(prefix="fp8lab-sweep-") as tmp:
        path = _download(tracking_uri, parent_artifact_uri, SWEEP_TRIALS_JSON, tmp)
        if path is None:
            return []
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("unreadable %s: %s", SWEEP_TRIALS_JSON, exc)
            return []
    if isinstance(data, dict):
        data = data.get("trial_ids", data.get("trials", []))
    ids = [d.get("trial_id") if isinstance(d, dict) else d for d in data] if isinstance(data, list) else []
    return [str(i) for i in ids if i and _SAFE_ID.match(str(i))]


def _pmap(fn: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as ex:
        return list(ex.map(fn, items))


def fetch_histories(tracking_uri: str, run_ids: Sequence[str], keys: Sequence[str], workers: int = 8) -> pd.DataFrame:
    """Full history of each metric key for each run, as written: run_id, key, step, timestamp, value.

    One `get_metric_history` call per (run, key), on a thread pool; nothing is deduplicated here
    (`analysis.tidy` decides which write of a step counts).
    """
    client = _client(tracking_uri)

    def one(item: tuple[str, str]) -> pd.DataFrame:
        run_id, key = item
        try:
            hist = client.get_metric_history(run_id, key)
        except Exception as exc:  # a missing/unreadable history must not sink the report
            log.warning("could not read %s of run %s: %s", key, run_id, exc)
            return pd.DataFrame()
        return pd.DataFrame(
            {
                "run_id": run_id,
                "key": key,
                "step": [m.step for m in hist],
                "timestamp": [m.timestamp for m in hist],
                "value": [m.value for m in hist],
            }
        )

    parts = [p for p in _pmap(one, [(r, k) for r in run_ids for k in keys], workers) if not p.empty]
    if not parts:
        return pd.DataFrame(
            {
                "run_id": pd.Series(dtype=str),
                "key": pd.Series(dtype=str),
                "step": pd.Series(dtype="int64"),
                "timestamp": pd.Series(dtype="int64"),
                "value": pd.Series(dtype=float),
            }
        )
    return pd.concat(parts, ignore_index=True)


def _local_path(artifact_uri: str, path: str) -> Path | None:
    """The file itself when the artifact root is a local folder (file:// or a plain path), else None."""
    parts = urlsplit(artifact_uri)
    if parts.scheme == "file":
        root = Path(url2pathname(parts.path))
    elif parts.scheme == "" or (len(parts.scheme) == 1 and artifact_uri[1:3] in (":\\", ":/")):  # C:\ paths
        root = Path(artifact_uri)
    else:
        return None
    return root / path


def _download(tracking_uri: str, artifact_uri: str, path: str, dst: str) -> Path | None:
    """One artifact file of a run, read in place when local, else downloaded; None if absent.

    Reading local files in place skips a copy per run and MLflow's per-download progress bar.
    """
    local = _local_path(artifact_uri, path)
    if local is not None:
        return local if local.is_file() else None
    from mlflow.artifacts import download_artifacts

    try:
        return Path(
            download_artifacts(
                artifact_uri=f"{artifact_uri.rstrip('/')}/{path}", dst_path=dst, tracking_uri=tracking_uri
            )
        )
    except Exception as exc:  # absent artifacts are normal (bf16 runs, failed trials)
        log.debug("no %s under %s: %s", path, artifact_uri, exc)
        return None


@contextmanager
def quiet_downloads() -> Iterator[None]:
    """Silence MLflow's per-file download progress bar (hundreds of bars drown the CLI output).

    Only when the user has not set MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR; restored afterwards.
    """
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if key in os.environ:
        yield
        return
    os.environ[key] = "false"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def _each_run_file(
    tracking_uri: str, runs: Sequence[tuple[str, str]], workers: int, path: str, read: Callable[[Path], pd.DataFrame]
) -> list[pd.DataFrame]:
    """`read(file)` of artifact `path` of each (run_id, artifact_uri), tagged with run_id; runs
    without the file, or whose file `read` cannot parse (logged), contribute nothing."""

    def one(item: tuple[str, str]) -> pd.DataFrame:
        run_id, artifact_uri = item
        if not artifact_uri:
            return pd.DataFrame()
        with tempfile.TemporaryDirectory(prefix="fp8lab-artifact-") as tmp:
            file = _download(tracking_uri, artifact_uri, path, tmp)
            if file is None:
                return pd.DataFrame()
            try:
                frame = read(file)
            except Exception as exc:
                log.warning("unreadable %s of run %s: %s", path, run_id, exc)
                return pd.DataFrame()
        return frame.assign(run_id=run_id)

    return [p for p in _pmap(one, runs, workers) if not p.empty]


def fetch_telemetry(
    tracking_uri: str,
    runs: Sequence[tuple[str, str]],
    workers: int = 8,
    columns: Sequence[str] = TELEMETRY_COLUMNS,
    path: str = TELEMETRY_PATH,
) -> pd.DataFrame:
    """Per-layer telemetry of each (run_id, artifact_uri); runs without the Parquet are skipped.
    ``path``/``columns``: another telemetry Parquet (the what-if one: WHATIF_PATH / WHATIF_COLUMNS)."""

    def read(path: Path) -> pd.DataFrame:
        import pyarrow.parquet as pq

        available = set(pq.read_schema(path).names)
        return pd.read_parquet(path, columns=[c for c in columns if c in available])

    parts = _each_run_file(tracking_uri, runs, workers, path, read)
    if not parts:
        return pd.DataFrame(columns=["run_id", *columns])
    return pd.concat(parts, ignore_index=True)


def _sample_files(tracking_uri: str, run_id: str, artifact_uri: str, dst: str) -> list[Path]:
    """Every `eval/samples/<task>.jsonl` of one run (local folder read in place, else listed and downloaded)."""
    local = _local_path(artifact_uri, SAMPLES_DIR)
    if local is not None:
        return sorted(local.glob("*.jsonl")) if local.is_dir() else []
    try:
        listed = _client(tracking_uri).list_artifacts(run_id, SAMPLES_DIR)
    except Exception as exc:  # no samples is normal for runs older than per-item logging
        log.debug("no %s for run %s: %s", SAMPLES_DIR, run_id, exc)
        return []
    paths = [_download(tracking_uri, artifact_uri, f.path, dst) for f in listed if f.path.endswith(".jsonl")]
    return [p for p in paths if p is not None]


def read_samples(path: Path) -> pd.DataFrame:
    """One task's per-item results: doc_id, metric, value, and the prompt, target (the gold option's
    text for multiple choice) and response where the run logged them (None in older stores);
    malformed lines are skipped with a warning."""
    rows, bad = [], 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                rows.append((int(item["doc_id"]), str(item.get("metric", "")), float(item["value"]), item.get("prompt"),
                             item.get("gold", item.get("target")), item.get("response")))
            except (ValueError, TypeError, KeyError, AttributeError):
                bad += 1
    if bad:
        log.warning("%s: %d malformed line(s) skipped", path, bad)
    return pd.DataFrame(rows, columns=["doc_id", "metric", "value", "prompt", "target", "response"])


def fetch_samples(tracking_uri: str, runs: Sequence[tuple[str, str]], workers: int = 8) -> pd.DataFrame:
    """Per-item eval results of each (run_id, artifact_uri): run_id, task, doc_id, metric, value.

    Runs without `eval/samples/` (older runs, failed trials) contribute nothing; the statistics then
    fall back to the binomial standard error and say so.
    """

    def one(item: tuple[str, str]) -> pd.DataFrame:
        run_id, artifact_uri = item
        if not artifact_uri:
            return pd.DataFrame()
        with tempfile.TemporaryDirectory(prefix="fp8lab-samples-") as tmp:
            parts = [
                read_samples(p).assign(task=p.stem) for p in _sample_files(tracking_uri, run_id, artifact_uri, tmp)
            ]
        parts = [p for p in parts if not p.empty]
        return pd.concat(parts, ignore_index=True).assign(run_id=run_id) if parts else pd.DataFrame()

    parts = [p for p in _pmap(one, runs, workers) if not p.empty]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=float if c == "value" else object) for c in SAMPLE_COLUMNS})
    return pd.concat(parts, ignore_index=True)[list(SAMPLE_COLUMNS)]


LOSS_ROW_COLUMNS = ("run_id", "row", "loss", "tokens")


def fetch_loss_rows(tracking_uri: str, runs: Sequence[tuple[str, str]], workers: int = 8) -> pd.DataFrame:
    """Per-row held-out losses (`eval/loss_rows.jsonl`) of each (run_id, artifact_uri): run_id,
    row, loss, tokens. Runs without the file (older runs, failed trials) contribute nothing."""

    def read(path: Path) -> pd.DataFrame:
        frame = pd.read_json(path, lines=True, convert_dates=False)  # "row" is an index, not a date
        return frame if {"row", "loss", "tokens"} <= set(frame.columns) else pd.DataFrame()

    parts = [p for p in _each_run_file(tracking_uri, runs, workers, LOSS_ROWS_ARTIFACT, read) if "row" in p]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "run_id" else float) for c in LOSS_ROW_COLUMNS})
    return pd.concat(parts, ignore_index=True)[list(LOSS_ROW_COLUMNS)]


def fetch_env_json(tracking_uri: str, artifact_uris: Sequence[str]) -> dict[str, Any] | None:
    """The first `env.json` artifact found among these run roots (parent first), else None."""
    for uri in artifact_uris:
        if not uri:
            continue
        with tempfile.TemporaryDirectory(prefix="fp8lab-env-") as tmp:
            path = _download(tracking_uri, uri, ENV_JSON, tmp)
            if path is None:
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                log.warning("unreadable %s under %s: %s", ENV_JSON, uri, exc)
                continue
            if isinstance(data, dict):
                return data
    return None


def fetch_parent(tracking_uri: str, run_id: str | None) -> dict[str, Any] | None:
    """Artifact root, tags and params of the parent run (one call), or None."""
    if not run_id:
        return None
    try:
        run = _client(tracking_uri).get_run(run_id)
    except Exception as exc:
        log.warning("parent run %s unreadable: %s", run_id, exc)
        return None
    return {
        "run_id": run_id,
        "artifact_uri": run.info.artifact_uri,
        "tags": dict(run.data.tags),
        "params": dict(run.data.params),
        "metrics": dict(run.data.metrics),
    }


def log_report_artifacts(
    tracking_uri: str, run_id: str, files: Sequence[Path], base: Path, artifact_dir: str = "report"
) -> None:
    """Log written report files under `report/` of the parent run, keeping sub-folders (figures/)."""
    client = _client(tracking_uri)
    root = Path(base).resolve()
    for f in files:
        rel = Path(f).resolve().relative_to(root).parent.as_posix()
        dest = artifact_dir if rel in ("", ".") else f"{artifact_dir}/{rel}"
        client.log_artifact(run_id, str(f), dest)
