"""Resource guards: refuse a trial that cannot fit before it starts (it would otherwise swap the
machine for minutes, or die of the OOM killer after Ray and MLflow started).

Three checks from the model folder's config.json and safetensors headers (`model_checks`):
`train.max_seq_len` within the model's positions, `lora.r` at most the adapted layers' smallest
dimension, and a memory estimate of one trial against the memory one trial gets.

The estimate (bytes), deliberately simple and stated in the refusal so users can check it:
- weights: parameters x bytes of `model.dtype`;
- adapters: r x (in + out) per adapted linear, x 16 (FP32 value, gradient, two Adam moments);
- activations kept for the backward pass: batch x seq x hidden x layers x 34 x (bytes/2) (the
  per-layer count of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", for 16-bit activations, without their 5 x heads x seq / hidden term for
  stored attention scores: transformers' default SDPA attention uses flash kernels, on CPU too,
  which keep no seq x seq matrix), plus the FP32 logits, their softmax and gradient:
  batch x seq x vocab x 12. It is an upper bound for LoRA (a frozen base needs fewer);
- tokenized data: rows x seq x 24 (three int64 tensors) + DATA_BYTES_FACTOR x the training file's
  bytes (the rows as Python objects while they are tokenized).
Memory one trial gets: on a GPU, the GPU's memory x `cluster.gpus_per_trial`; on CPU, the host's
RAM x `cluster.cpus_per_trial` / the CPUs the local Ray gets (the trials that run side by side
share it). Against a remote cluster (`cluster.address`) the driver cannot see the nodes'
memory and only the first two checks run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from workloads.model.checks import CONFIG_DTYPE_BYTES, ModelFacts

GIB = 2**30


# Training data in a trial's memory: the tokenized tensors (input ids, attention mask, labels:
# 3 x int64 per position of every row, padded to train.max_seq_len) plus, while tokenizing, the
# rows as `datasets` and Python objects (strings, segments, token lists): about this many times
# the training file's bytes.
DATA_BYTES_FACTOR = 10


@dataclass(frozen=True)
class Estimate:
    weights: int
    adapters: int
    activations: int
    data: int = 0  # tokenized training rows and the text they came from

    @property
    def total(self) -> int:
        return self.weights + self.adapters + self.activations + self.data

    def describe(self) -> str:
        return (f"about {_size(self.total)} (weights {_size(self.weights)}, adapters + optimizer "
                f"{_size(self.adapters)}, activations {_size(self.activations)}, tokenized data {_size(self.data)})")


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


def adapted_layers(facts: ModelFacts, target_modules: Any) -> dict[str, tuple[int, ...]]:
    """Linear weights LoRA will wrap: PEFT's all-linear (every linear in the blocks, not the
    embedding or output head) or the named modules."""
    vocab = facts.text_config().get("vocab_size")
    names = None if target_modules == "all-linear" else {target_modules} if isinstance(target_modules, str) else set(target_modules)
    layers = {}
    for name, (_, shape) in facts.tensors.items():
        if len(shape) != 2 or not name.endswith(".weight") or vocab in shape:
            continue
        module = name.rsplit(".", 2)[-2]
        if names is None or module in names:
            layers[name.removesuffix(".weight")] = shape
    return layers


def estimate(config: dict[str, Any], facts: ModelFacts, data_size: tuple[int, int] | None = None) -> Estimate:
    """`data_size`: (rows, bytes) of the training split, when known (a local JSONL file)."""
    cfg = facts.text_config()
    train, rank = config["train"], int(config["lora"]["r"])
    bytes_per = CONFIG_DTYPE_BYTES.get(config["model"]["dtype"], 4)
    hidden, layers = int(cfg.get("hidden_size", 0)), int(cfg.get("num_hidden_layers", 0))
    vocab = int(cfg.get("vocab_size", 0))
    batch, seq = int(train["batch_size"]), sequence_bound(config, facts)
    adapters = sum(rank * (a + b) for a, b in adapted_layers(facts, config["lora"]["target_modules"]).values()) * 16
    per_layer = batch * seq * hidden * 34 * bytes_per / 2
    activations = int(per_layer * layers + batch * seq * vocab * 12)
    rows, text = data_size or (0, 0)
    data = rows * seq * 3 * 8 + text * DATA_BYTES_FACTOR
    return Estimate(facts.n_params * bytes_per, adapters, activations, data)


def trial_memory(config: dict[str, Any]) -> tuple[int, str] | None:
    """(bytes one trial gets, where that figure comes from), or None when it cannot be known here."""
    cluster, device = config["cluster"], config["train"]["device"]
    if cluster.get("address"):
        return None
    if device == "cuda" or (device == "auto" and cluster.get("gpus_per_trial")):
        import torch

        if not torch.cuda.is_available():
            return None  # check_device reports it
        share = cluster.get("gpus_per_trial") or 1
        total = torch.cuda.get_device_properties(0).total_memory
        return int(total * min(share, 1)), f"{total / GIB:.1f} GiB GPU memory x cluster.gpus_per_trial={share:g}"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpus = cluster.get("num_cpus") or os.cpu_count() or 1
    per = min(1.0, cluster.get("cpus_per_trial", 1) / cpus)
    return int(ram * per), (f"{ram / GIB:.1f} GiB RAM x cluster.cpus_per_trial={cluster.get('cpus_per_trial', 1):g} "
                            f"/ {cpus:g} CPUs")


def sequence_bound(config: dict[str, Any], facts: ModelFacts) -> int:
    """`train.max_seq_len`, or while it is still null (it comes from the data: preflight resolves
    it first) the most it can become, the model's positions."""
    cfg = facts.text_config()
    return int(config["train"]["max_seq_len"] or cfg.get("max_position_embeddings") or cfg.get("n_positions") or 0)


def check_fit(config: dict[str, Any], facts: ModelFacts, data_size: tuple[int, int] | None = None) -> list[str]:
    """Every guard that fails, one line each with the fix (`data_size`: see `estimate`)."""
    cfg = facts.text_config()
    problems = []
    positions = cfg.get("max_position_embeddings") or cfg.get("n_positions")
    seq = sequence_bound(config, facts)
    if positions and seq > positions:
        problems.append(f"train.max_seq_len: {seq} is more than the model's {positions} positions "
                        f"(max_position_embeddings in config.json) (fix: train.max_seq_len={positions} or less)")
    rank = int(config["lora"]["r"])
    layers = adapted_layers(facts, config["lora"]["target_modules"])
    if layers:
        name, shape = min(layers.items(), key=lambda item: min(item[1]))
        if rank > min(shape):
            problems.append(f"lora.r: {rank} is more than the smallest adapted layer's dimension {min(shape)} "
                            f"({name}: {list(shape)}) (fix: lora.r={min(shape)} or less)")
    budget = trial_memory(config) if not problems else None
    if budget is not None:
        need = estimate(config, facts, data_size)
        if need.total > budget[0]:
            key, fix = (("data.max_train_examples", "set data.max_train_examples to use fewer rows, or lower train.max_seq_len")
                        if need.data > need.activations else
                        ("train.batch_size", "lower train.batch_size or train.max_seq_len"))
            problems.append(f"{key}: a trial needs {need.describe()} for batch {config['train']['batch_size']} x "
                            f"seq {seq}, but one trial gets {_size(budget[0])} ({budget[1]}) (fix: {fix}, "
                            "or raise cluster.cpus_per_trial / gpus_per_trial)")
    return problems
