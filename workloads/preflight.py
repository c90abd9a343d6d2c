"""Checks of a trial config against the world (files, registries, devices), run before any
trial starts so a sweep fails in seconds with every problem listed, not hours in.

Runnable as `python -m workloads.preflight` (configs as JSON on stdin, problems as JSON on
stdout) so the orchestrator can use it without importing torch itself.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from fp8lab_conf.filesystem import folder_is_writable, special_path_problem
from fp8lab_conf.garbage_collection import skip_final_collection
from workloads.eval.checks import check_eval_tasks
from workloads.model.pretrained import ensure_folder, is_packaged, missing_requirements

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", "*.pt")


def check_config(config: dict[str, Any]) -> list[str]:
    """Every problem found for one trial config, one line each."""
    problems: list[str] = []
    problems += check_model(config["model"])
    data_problems = check_data(config)
    if not problems and not data_problems:
        data_problems = data_plan(config)[1]
        config = resolve_config(config)
    problems += check_model_fit(config) if not problems and config["train"]["max_seq_len"] else []
    problems += data_problems
    problems += check_policy(config["precision"])
    if not problems:
        problems += check_model_policy(config["model"], config["precision"])
    problems += check_device(config["train"], config["cluster"])
    problems += check_output(config["trial"].get("output"))
    problems += check_eval_tasks(config, data_has_problems=bool(data_problems))
    return problems


def check_model(model_cfg: dict[str, Any]) -> list[str]:
    name = model_cfg["name_or_path"]
    if name == "embedded":
        return []
    if is_packaged(name):
        return check_packaged(name)
    path = Path(name).expanduser()
    special = special_path_problem(path)
    if special:
        return [f"model.name_or_path: {special} (fix: point it at a folder saved with save_pretrained)"]
    if path.exists() or name.startswith((".", "/", "~")):
        if not path.is_dir():
            return [f"model.name_or_path: folder {name} does not exist (fix: a folder saved with save_pretrained, or model.name_or_path=embedded)"]
        if not (path / "config.json").exists():
            return [f"model.name_or_path: {name} has no config.json (fix: point at a folder saved with save_pretrained)"]
        if not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
            return [f"model.name_or_path: {name} has no weights (*.safetensors or *.bin) (fix: save the model with save_pretrained)"]
        return []
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not _hub_cached(name):
        return [f"model.name_or_path: '{name}' is neither a local folder nor in the HF cache and HF_HUB_OFFLINE=1 "
                "(fix: download it first, or pass a local folder)"]
    return []


def check_model_fit(config: dict[str, Any]) -> list[str]:
    """A local model folder's weights, shapes and tokenizer (headers only, nothing loaded), then
    whether the trial fits it (positions, LoRA rank, memory): `workloads.model.checks`,
    `workloads.model.sizing`. Hub ids are checked by their loader."""
    from workloads.model.checks import inspect_folder, tokenizer_load_problems
    from workloads.model.sizing import check_fit

    config = config if config["train"]["max_seq_len"] else resolve_config(config)  # the limit the data gives
    name = config["model"]["name_or_path"]
    folder = Path(__file__).resolve().parent / "embedded" / "assets" / "base_model" if name == "embedded" else (
        ensure_folder(name) if is_packaged(name) else Path(name).expanduser())
    if not folder.is_dir():
        return []
    facts, problems = inspect_folder(folder)
    problems = problems or tokenizer_load_problems(folder, bool(config["model"].get("trust_remote_code")))
    return problems or (check_fit(config, facts, training_data_size(config)) if facts else [])


def training_data_size(config: dict[str, Any]) -> tuple[int, int] | None:
    """(rows, bytes) of the rows a trial will tokenize, for the memory estimate: the training
    split's JSONL file (lines counted in 1 MiB chunks, never held), cut to data.max_train_examples.
    None for other sources (Parquet, save_to_disk, hub), whose size the estimate leaves out."""
    from workloads.data.load import locate
    from workloads.embedded.paths import embedded_paths

    data = config["data"]
    files = locate(data["path"], embedded_paths().data_dir).files or {}
    file = files.get(data["train_split"]) or files.get("train")
    if file is None or file.suffix != ".jsonl" or not file.is_file():
        return None
    size, rows = file.stat().st_size, 0
    with file.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            rows += chunk.count(b"\n")
    rows = max(rows, 1)
    kept = min(rows, data.get("max_train_examples") or rows)
    return kept, size * kept // rows


def check_packaged(name: str) -> list[str]:
    """A model fp8lab builds from a pip package (workloads.model.pretrained): the package must be
    installed; the folder is built here, once, so trials find it ready."""
    missing = missing_requirements(name)
    if missing:
        return missing
    try:
        ensure_folder(name)
    except Exception as exc:  # noqa: BLE001 - a failed build is a problem to list, not a crash
        return [f"model.name_or_path={name}: building its folder failed: {type(exc).__name__}: {exc}"]
    return []


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - invalid repo ids raise many types
        return False


def check_data(config: dict[str, Any]) -> list[str]:
    """The training data (and task data a data folder provides): see workloads.data.checks.
    Read once per distinct data/eval/model setting of a `check_many` call, not once per policy."""
    key = json.dumps([config["data"], config["eval"], config["model"]], sort_keys=True, default=str)
    if key not in _DATA_CHECKED:
        from workloads.data.checks import check_data_inputs
        from workloads.embedded.paths import embedded_paths

        paths = embedded_paths()
        _DATA_CHECKED[key] = check_data_inputs(config, paths.data_dir, paths.model_dir)
    return _DATA_CHECKED[key]


_DATA_CHECKED: dict[str, list[str]] = {}


def data_plan(config: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """(the `train` keys the training rows decide, the refusal of a limit that cuts too much):
    `workloads.data.lengths`. Local data only (a hub dataset is measured by the trial itself);
    read once per distinct data/model/length setting, like `check_data`."""
    from workloads.data.load import locate
    from workloads.embedded.paths import embedded_paths

    train = {k: config["train"].get(k) for k in ("max_seq_len", "steps", "epochs", "batch_size", "grad_accum")}
    key = json.dumps([config["data"], config["model"], train], sort_keys=True, default=str)
    if key not in _PLANS:
        paths = embedded_paths()
        if locate(config["data"]["path"], paths.data_dir).hub_name:
            _PLANS[key] = ({}, [])
        else:
            _PLANS[key] = _measured_plan(config, paths)
    return _PLANS[key]


def _measured_plan(config: dict[str, Any], paths: Any) -> tuple[dict[str, int], list[str]]:
    from workloads.data.chat_template import training_tokenizer
    from workloads.data.lengths import load_data_plan, model_positions

    try:
        tokenizer = training_tokenizer(config["model"], config["data"], paths.model_dir)
        plan = load_data_plan(config, tokenizer, paths.data_dir, model_positions(config["model"], paths.model_dir))
    except ValueError as exc:  # a row the chat template cannot render: one line from formats
        return {}, [str(exc)]
    return plan.overrides(), [plan.problem] if plan.problem else []


def resolve_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with the `train` keys its data decides filled in (`train.max_seq_len: null`,
    `train.epochs`), as trained and logged; unchanged when already explicit or not measurable here."""
    overrides = data_plan(config)[0]
    return {**config, "train": {**config["train"], **overrides}} if overrides else config


_PLANS: dict[str, tuple[dict[str, int], list[str]]] = {}


def check_policy(precision_cfg: dict[str, Any]) -> list[str]:
    from workloads.precision.backends import backend_policy_errors
    from workloads.precision.policy import get_policy

    try:
        policy = get_policy(precision_cfg["policy"]).with_switches(**(precision_cfg.get("switches") or {}))
    except (ValueError, TypeError, KeyError) as exc:
        return [f"precision.policy: {exc}" if "switch" not in str(exc) else f"precision.switches: {exc}"]
    from workloads.precision.scaled_mm import gemm_problems

    problems = [f"precision.backend: {problem}" if not problem.startswith("precision.") else problem
                for problem in backend_policy_errors(precision_cfg["backend"], policy)]
    return problems + gemm_problems(precision_cfg.get("gemm", "emulated"), policy, precision_cfg["backend"])


def check_model_policy(model_cfg: dict[str, Any], precision_cfg: dict[str, Any]) -> list[str]:
    """An FP8 policy on a model with GEMM weights that are not linears (fused MoE expert tensors)
    would leave them in BF16 unannounced: refuse before training, naming them."""
    from workloads.precision.policy import get_policy

    policy = get_policy(precision_cfg["policy"]).with_switches(**(precision_cfg.get("switches") or {}))
    if not (policy.base_fp8 or policy.lm_head_fp8):
        return []
    names = _unsupported_weights(json.dumps(model_cfg, sort_keys=True))
    if not names:
        return []
    shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return [f"precision.policy: {policy.name} puts the model's linears in FP8, but {model_cfg['name_or_path']} "
            f"has GEMM weights that are not linears ({shown}, e.g. fused MoE experts), which no FP8 backend "
            "can cast (fix: precision=bf16, or a model whose experts are nn.Linear modules)"]


@functools.lru_cache(maxsize=8)
def _unsupported_weights(model_cfg_json: str) -> tuple[str, ...]:
    """Per model, once per process (a sweep checks every policy against the same model)."""
    from workloads.model.loading import meta_model
    from workloads.precision.walker import unsupported_weights

    try:
        model = meta_model(json.loads(model_cfg_json))
    except Exception:  # noqa: BLE001 - an unloadable model is check_model's to report
        return ()
    return () if model is None else tuple(unsupported_weights(model))


def check_device(train_cfg: dict[str, Any], cluster_cfg: dict[str, Any]) -> list[str]:
    if train_cfg["device"] != "cuda" or cluster_cfg.get("address"):
        return []
    import torch

    if not torch.cuda.is_available():
        return ["train.device: cuda requested but no CUDA GPU is visible (fix: train.device=auto or train.device=cpu)"]
    return []


def check_output(output: str | None) -> list[str]:
    if not output:
        return []
    folder = Path(output).expanduser().resolve().parent
    if not folder.is_dir():
        return [f"trial.output: folder {folder} does not exist (fix: create it or choose another trial.output)"]
    if not folder_is_writable(folder):
        return [f"trial.output: folder {folder} is not writable (fix: choose a writable trial.output)"]
    return []


def check_cluster_gpus(cluster_cfg: dict[str, Any]) -> list[str]:
    """A local Ray with fewer GPUs than one trial asks for would queue the trial forever; say so
    before Ray starts (a remote cluster's GPUs are checked once connected)."""
    wanted = cluster_cfg.get("gpus_per_trial") or 0
    if not wanted or cluster_cfg.get("address"):
        return []
    declared = cluster_cfg.get("num_gpus")
    if declared is None:
        declared, source = _detected_gpus(), "GPUs detected on this machine"
    else:
        source = "GPUs declared by cluster.num_gpus"
    if wanted > declared:
        return [f"cluster.gpus_per_trial: {wanted:g} GPU(s) per trial requested but there are {declared} {source} "
                "(fix: cluster.gpus_per_trial=0 to run on CPU)"]
    return []


def _detected_gpus() -> int:
    """GPUs a local Ray would find (its own detection, capped by CUDA_VISIBLE_DEVICES)."""
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
        count = manager.get_current_node_num_accelerators()
        visible = manager.get_current_process_visible_accelerator_ids()
        return min(count, len(visible)) if visible is not None else count
    except Exception:  # noqa: BLE001 - private Ray API: fall back to torch's count
        import torch

        return torch.cuda.device_count()


def check_many(configs: list[dict[str, Any]]) -> list[str]:
    """Problems across configs, each distinct problem once (a sweep repeats most of them)."""
    _DATA_CHECKED.clear()  # files may have changed since an earlier call in this process
    _PLANS.clear()
    seen: dict[str, None] = {}
    checked: set[str] = set()
    for cluster in {json.dumps(c["cluster"], sort_keys=True, default=str): c["cluster"] for c in configs}.values():
        for problem in check_cluster_gpus(cluster):
            seen.setdefault(problem)
    for config in configs:
        key = json.dumps({k: config.get(k) for k in ("model", "data", "eval", "precision", "trial")}, sort_keys=True, default=str)
        key += f"{config['train']['device']}|{config['cluster'].get('address')}"
        if key in checked:
            continue
        checked.add(key)
        for problem in check_config(config):
            seen.setdefault(problem)
    return list(seen)


def preview_data(config: dict[str, Any], n_rows: int, start: int) -> Any:
    """`fp8lab data preview`: the rows as trained (`workloads.data.preview`), on the shipped paths."""
    from workloads.data.preview import preview
    from workloads.embedded.paths import embedded_paths

    paths = embedded_paths()
    return preview(config, n_rows, start, paths.data_dir, paths.model_dir)


def main() -> None:
    """Problems of every config, and the `train` keys each one's data decides (empty when the
    config is invalid: the orchestrator refuses it anyway)."""
    configs = json.load(sys.stdin)
    problems = check_many(configs)
    resolved = [] if problems else [data_plan(c)[0] for c in configs]
    json.dump({"problems": problems, "train": resolved}, sys.stdout)
    skip_final_collection()  # the process exits next


if __name__ == "__main__":
    main()
