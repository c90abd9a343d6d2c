"""Checks of a trial config against the world (files, registries, devices), run before any
trial starts so a sweep fails in seconds with every problem listed, not hours in.

Runnable as `python -m workloads.preflight` (configs as JSON on stdin, problems as JSON on
stdout) so the orchestrator can use it without importing torch itself.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", "*.pt")
EMBEDDED_TASK = "fp8lab_embedded"


def check_config(config: dict[str, Any]) -> list[str]:
    """Every problem found for one trial config, one line each."""
    problems: list[str] = []
    problems += check_model(config["model"])
    problems += check_model_fit(config) if not problems else []
    problems += check_data(config["data"], config["eval"])
    problems += check_policy(config["precision"])
    problems += check_device(config["train"], config["cluster"])
    problems += check_output(config["trial"].get("output"))
    problems += check_eval_task(config["eval"])
    return problems


def check_model(model_cfg: dict[str, Any]) -> list[str]:
    name = model_cfg["name_or_path"]
    if name == "embedded":
        return []
    path = Path(name).expanduser()
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
    whether the trial fits it (positions, LoRA rank, memory): `workloads.model_checks`,
    `workloads.resource_guard`. Hub ids are checked by their loader."""
    from workloads.model_checks import inspect_folder
    from workloads.resource_guard import check_fit

    name = config["model"]["name_or_path"]
    folder = Path(__file__).resolve().parent / "embedded" / "assets" / "base_model" if name == "embedded" else Path(name).expanduser()
    if not folder.is_dir():
        return []
    facts, problems = inspect_folder(folder)
    return problems or (check_fit(config, facts) if facts else [])


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - invalid repo ids raise many types
        return False


def check_data(data_cfg: dict[str, Any], eval_cfg: dict[str, Any]) -> list[str]:
    path = data_cfg["path"]
    if path == "embedded":
        return []
    local = Path(path).expanduser()
    if not local.exists():
        if path.startswith((".", "/", "~")) or path.endswith((".jsonl", ".json")):
            return [f"data.path: {path} does not exist (fix: a JSONL file or a folder of <split>.jsonl files)"]
        return []  # a HF dataset name: `datasets` reports it when loading
    files = _split_files(local)
    split = data_cfg["train_split"]
    if split not in files:
        return [f"data.path: no '{split}' split in {path} (found: {', '.join(files) or 'no .jsonl files'}) "
                f"(fix: add {split}.jsonl or set data.train_split)"]
    needed = [split] + (["test"] if eval_cfg["task"] == EMBEDDED_TASK and local.is_dir() else [])
    problems = []
    for name in needed:
        if name not in files:
            problems.append(f"data.path: eval.task={EMBEDDED_TASK} evaluates {path}/test.jsonl, which is missing "
                            "(fix: add test.jsonl, or choose another eval.task)")
            continue
        problems += check_jsonl(Path(files[name]), data_cfg)
    return problems


def _split_files(local: Path) -> dict[str, str]:
    if local.is_dir():
        return {f.stem: str(f) for f in sorted(local.glob("*.jsonl"))}
    return {"train": str(local)}


def check_jsonl(path: Path, data_cfg: dict[str, Any]) -> list[str]:
    """Malformed lines (with their number), missing fields, bad answer indices, empty file."""
    fields = [data_cfg["prompt_field"], data_cfg["answer_field"]] + ([data_cfg["choices_field"]] if data_cfg.get("choices_field") else [])
    rows = 0
    for lineno, row, error in _jsonl_rows(path):
        if error:
            return [f"data.path: {path} line {lineno} is not valid JSON ({error}) (fix: one JSON object per line)"]
        rows += 1
        missing = [f for f in fields if f not in row]
        if missing:
            key = {data_cfg["prompt_field"]: "data.prompt_field", data_cfg["answer_field"]: "data.answer_field"}.get(missing[0], "data.choices_field")
            return [f"{key}: {path} line {lineno} has no field '{missing[0]}' (fields: {', '.join(row)}) "
                    f"(fix: set {key} to one of those fields)"]
        problem = _check_answer(row, data_cfg, path, lineno)
        if problem:
            return [problem]
    if rows == 0:
        return [f"data.path: {path} has no examples (fix: add at least one JSON line)"]
    return []


def _check_answer(row: dict[str, Any], data_cfg: dict[str, Any], path: Path, lineno: int) -> str | None:
    choices_field = data_cfg.get("choices_field")
    answer = row[data_cfg["answer_field"]]
    if not choices_field or isinstance(answer, str):
        return None
    choices = row[choices_field]
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
        return (f"data.answer_field: {path} line {lineno}: answer {answer!r} is not an index into {len(choices)} choices "
                "(fix: a 0-based int index, or set data.choices_field=null for text answers)")
    return None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any], str | None]]:
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, {}, exc.msg
                return
            if not isinstance(row, dict):
                yield lineno, {}, "not a JSON object"
                return
            yield lineno, row, None


def check_policy(precision_cfg: dict[str, Any]) -> list[str]:
    from workloads.precision.backends import backend_policy_errors
    from workloads.precision.policy import get_policy

    try:
        policy = get_policy(precision_cfg["policy"]).with_switches(**(precision_cfg.get("switches") or {}))
    except (ValueError, TypeError, KeyError) as exc:
        return [f"precision.policy: {exc}" if "switch" not in str(exc) else f"precision.switches: {exc}"]
    return [f"precision.backend: {problem}" if not problem.startswith("precision.") else problem
            for problem in backend_policy_errors(precision_cfg["backend"], policy)]


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


def folder_is_writable(folder: Path) -> bool:
    """Really create (and remove) a file: os.access says yes to root even where writes fail."""
    probe = folder / f".fp8lab-write-probe-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False


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


def check_eval_task(eval_cfg: dict[str, Any]) -> list[str]:
    """The embedded task ships with fp8lab; any other name is looked up in lm-eval (slow: ~10 s)."""
    if eval_cfg["task"] == EMBEDDED_TASK and not eval_cfg.get("include_path"):
        return []
    if eval_cfg.get("include_path") and not Path(eval_cfg["include_path"]).expanduser().is_dir():
        return [f"eval.include_path: {eval_cfg['include_path']} is not a folder (fix: a folder of lm-eval task YAMLs)"]
    from workloads.evaluate import check_task_exists

    try:
        check_task_exists(eval_cfg["task"], eval_cfg.get("include_path"))
    except ValueError as exc:
        fix = "" if "fix:" in str(exc) else (" (fix: a task `lm-eval ls tasks` lists, or eval.include_path=<a folder of "
                                              "task YAMLs> for your own)")
        return [f"eval.task: {exc}{fix}"]
    return []


def check_many(configs: list[dict[str, Any]]) -> list[str]:
    """Problems across configs, each distinct problem once (a sweep repeats most of them)."""
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


def main() -> None:
    configs = json.load(sys.stdin)
    json.dump(check_many(configs), sys.stdout)


if __name__ == "__main__":
    main()
