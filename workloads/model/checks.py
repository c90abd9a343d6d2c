"""What can be known about a model folder without loading its weights: readable safetensors,
shapes that agree with config.json, a tokenizer with a pad or eos token, and whether a trial
fits (positions, LoRA rank, memory). Used by preflight, so a truncated download or a trial that
would swap the machine to death is refused in seconds, before Ray and MLflow start.

Reads only the JSON headers of `*.safetensors` files (the first 8 + N bytes, see the format:
u64 little-endian header size, then a JSON map name -> {dtype, shape, data_offsets}), and the
folder's small JSON files. Torch-free.
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}
CONFIG_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_MAX_HEADER = 100 * 2**20  # the format's own limit on the JSON header
_LAYER_INDEX = re.compile(r"\.(?:layers|h|blocks|layer)\.(\d+)\.")


@dataclass
class ModelFacts:
    """What the checks learned about a model folder (None where the folder does not say)."""

    config: dict[str, Any]
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # name -> (dtype, shape)

    @property
    def n_params(self) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors.values())

    def text_config(self) -> dict[str, Any]:
        """Multimodal configs nest the language model's numbers under text_config."""
        return {**self.config, **(self.config.get("text_config") or {})}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The header of one file; ValueError naming what is wrong (truncated, not safetensors)."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is {size} bytes, too short for a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise ValueError(f"{path.name} is not a readable safetensors file (header of {length} bytes in a {size}-byte file)")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path.name} has an unreadable safetensors header ({exc})") from None
    data_bytes = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        expected = math.prod(entry["shape"]) * DTYPE_BYTES.get(entry["dtype"], 0)
        if end > data_bytes:
            raise ValueError(f"{path.name} is truncated: tensor {name} ends at byte {end} of {data_bytes} data bytes "
                             "(re-download or re-save the model)")
        if DTYPE_BYTES.get(entry["dtype"]) and end - begin != expected:
            raise ValueError(f"{path.name}: tensor {name} holds {end - begin} bytes, its shape {entry['shape']} "
                             f"needs {expected}")
    return header


def inspect_folder(folder: Path) -> tuple[ModelFacts | None, list[str]]:
    """(facts, problems) for a local model folder; problems name the file and the fix."""
    where = f"model.name_or_path: {folder}"
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, [f"{where}/config.json is not readable JSON ({exc}) (fix: re-save the model with save_pretrained)"]
    facts = ModelFacts(config)
    problems = []
    for path in _safetensors_files(folder, problems):
        try:
            header = read_safetensors_header(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{where}: {exc}")
            continue
        facts.tensors.update({k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"})
    if facts.tensors and not problems:
        problems += _shape_problems(facts, where)
    problems += _tokenizer_problems(folder, where)
    return facts, problems


def _safetensors_files(folder: Path, problems: list[str]) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return sorted(folder.glob("*.safetensors"))
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        problems.append(f"model.name_or_path: {index} is not a readable shard index ({exc}) (fix: re-save the model)")
        return []
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        problems.append(f"model.name_or_path: {folder} lacks shard(s) {', '.join(missing)} listed in {index.name} "
                        "(fix: finish the download)")
    return [folder / s for s in shards if s not in missing]


def _shape_problems(facts: ModelFacts, where: str) -> list[str]:
    """The embedding is [vocab_size, hidden_size] and there are num_hidden_layers blocks."""
    cfg = facts.text_config()
    vocab, hidden, layers = cfg.get("vocab_size"), cfg.get("hidden_size"), cfg.get("num_hidden_layers")
    problems = []
    if vocab and hidden and not any(shape == (vocab, hidden) for _, shape in facts.tensors.values()):
        found = sorted({shape for name, (_, shape) in facts.tensors.items() if "embed" in name or "wte" in name})
        problems.append(f"{where}: weights do not match config.json: no [vocab_size={vocab}, hidden_size={hidden}] "
                        f"embedding (found {', '.join(map(str, found)) or 'none'}) (fix: the config.json saved with these weights)")
    indices = {int(m.group(1)) for name in facts.tensors for m in [_LAYER_INDEX.search(name)] if m}
    if layers and indices and len(indices) != layers:
        problems.append(f"{where}: weights have {len(indices)} layers, config.json says num_hidden_layers={layers} "
                        "(fix: the config.json saved with these weights)")
    return problems


def _tokenizer_problems(folder: Path, where: str) -> list[str]:
    """The trainer pads with the pad token, or the eos token when there is none: one must exist."""
    tokens: dict[str, Any] = {}
    found = False
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / name
        if not path.exists():
            continue
        found = True
        try:
            tokens.update({k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if v})
        except (OSError, ValueError, AttributeError) as exc:
            return [f"{where}/{name} is not readable JSON ({exc}) (fix: re-save the tokenizer with save_pretrained)"]
    if not found:
        if (folder / "tokenizer.json").exists():
            return []  # special tokens live in tokenizer.json's own settings: the loader decides
        return [f"{where} has no tokenizer (tokenizer_config.json) (fix: save the tokenizer into the model folder)"]
    if not tokens.get("pad_token") and not tokens.get("eos_token"):
        return [f"{where}: the tokenizer has neither a pad nor an eos token, so batches cannot be padded "
                "(fix: set \"pad_token\" (or \"eos_token\") in tokenizer_config.json)"]
    return []


def tokenizer_load_problems(folder: Path, trust_remote_code: bool) -> list[str]:
    """Load the folder's tokenizer (its files only, never the weights): a missing `tokenizer.json`
    or vocabulary passes the JSON checks above but fails every trial after Ray and MLflow started.
    transformers is imported here only, so the header checks stay torch-free."""
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - tokenizers raise many types for missing or broken files
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        present = ", ".join(sorted(p.name for p in folder.glob("tokenizer*"))) or "none"
        return [f"model.name_or_path: {folder}: the tokenizer does not load ({type(exc).__name__}: {first}; "
                f"tokenizer files present: {present}) (fix: save the tokenizer into the folder with "
                "tokenizer.save_pretrained, e.g. tokenizer.json)"]
    return []
