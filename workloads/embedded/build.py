"""Build the embedded base model and downstream task from a seed.

    python -m workloads.embedded.build            # rewrites workloads/embedded/assets/
    python -m workloads.embedded.build --out /tmp/x --steps 50   # a quick smoke build

Steps (all deterministic in --seed; the model bytes also depend on the torch build and the CPU):
1. generate the synthetic pretraining corpus (synth.pretraining_corpus);
2. train a byte-level BPE tokenizer on it, wrapped in PreTrainedTokenizerFast (bos/eos/pad set,
   "<s>" prepended like Llama tokenizers do);
3. pretrain a small LlamaForCausalLM on the packed corpus (AdamW, warmup + cosine);
4. write the "largest number" task splits as JSONL (synth.make_task);
5. record seed, sizes, held-out perplexity (trained vs random init), base task accuracy,
   timing and versions in assets/BUILD_INFO.json.

The outputs are committed, so a normal user never runs this; it exists for reproducibility.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from workloads.embedded import synth

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>"}


@dataclass(frozen=True)
class BuildConfig:
    seed: int = 0
    # corpus
    n_docs: int = 60_000
    n_heldout_docs: int = 2_000
    # tokenizer
    vocab_size: int = 1024
    # model (hidden and intermediate are multiples of 128 so FP8 block scaling tiles evenly)
    hidden_size: int = 128
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    max_positions: int = 256
    vocab_multiple: int = 128  # embedding rows padded (like real checkpoints) so GEMM dims tile
    tie_embeddings: bool = False  # an independent lm_head, so precision policies can treat it alone
    # pretraining
    seq_len: int = 128
    batch_size: int = 32
    steps: int = 1000
    lr: float = 3e-3
    warmup_steps: int = 60
    weight_decay: float = 0.1
    threads: int = 1  # one thread: bitwise-reproducible on a given CPU, and immune to oversubscription
    # task
    task_sizes: tuple[tuple[str, int], ...] = (("train", 3000), ("validation", 200), ("test", 400))


def log(msg: str) -> None:
    print(f"[build {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(docs: Iterable[str], cfg: BuildConfig) -> Any:
    """Byte-level BPE (any text encodes; no unknown tokens) trained on the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    bos = SPECIAL_TOKENS["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        model_max_length=cfg.max_positions,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def pack(docs: Iterable[str], tokenizer: Any, seq_len: int) -> torch.Tensor:
    """Documents as `<s> doc </s>` back to back, cut into rows of seq_len tokens."""
    ids: list[int] = []
    for doc in docs:
        ids.extend(tokenizer(doc)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    n = len(ids) // seq_len
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


# ---------------------------------------------------------------------------------------------
# Model


def new_model(cfg: BuildConfig, tokenizer: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = -(-len(tokenizer) // cfg.vocab_multiple) * cfg.vocab_multiple
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(config)


@torch.no_grad()
def perplexity(model: Any, rows: torch.Tensor, batch_size: int = 64) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = rows[i : i + batch_size]
        loss = model(input_ids=batch, labels=batch).loss
        n = batch.numel() - batch.shape[0]
        total += float(loss) * n
        count += n
    return math.exp(total / count)


def pretrain(model: Any, rows: torch.Tensor, cfg: BuildConfig) -> list[float]:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.empty(0, dtype=torch.long)
    losses: list[float] = []
    model.train()
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        if order.numel() < cfg.batch_size:
            order = torch.cat([order, torch.randperm(len(rows), generator=gen)])
        index, order = order[: cfg.batch_size], order[cfg.batch_size :]
        batch = rows[index]
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 100 == 0 or step == cfg.steps - 1:
            log(f"pretrain step {step:5d}/{cfg.steps}  loss {losses[-1]:.3f}  lr {lr_at(step):.2e}  "
                f"{time.perf_counter() - t0:.0f}s")
    model.eval()
    return losses


@torch.no_grad()
def multiple_choice_accuracy(model: Any, tokenizer: Any, rows: list[dict], delimiter: str = " ") -> float:
    """Accuracy by summed log-likelihood of each choice after the prompt (lm-eval's `acc`)."""
    model.eval()
    correct = 0
    for row in rows:
        ctx = tokenizer(row["prompt"])["input_ids"]
        scores = []
        for choice in row["choices"]:
            full = tokenizer(row["prompt"] + delimiter + choice)["input_ids"]
            logits = model(input_ids=torch.tensor([full])).logits[0].float().log_softmax(-1)
            cont = range(len(ctx), len(full))
            scores.append(sum(float(logits[i - 1, full[i]]) for i in cont))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == row["answer"])
    return correct / len(rows)


# ---------------------------------------------------------------------------------------------
# Assets


def _portable_tokenizer_config(path: Path) -> None:
    """transformers 5 writes its new class name `TokenizersBackend`; the classic alias
    `PreTrainedTokenizerFast` loads in both transformers 4 and 5."""
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def folder_bytes(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


def versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "machine": platform.machine(), "processor": platform.processor()}


def build(cfg: BuildConfig, out: Path) -> dict[str, Any]:
    t_start = time.perf_counter()

    log(f"corpus: {cfg.n_docs} + {cfg.n_heldout_docs} held-out documents (seed {cfg.seed})")
    docs = list(synth.pretraining_corpus(cfg.seed, cfg.n_docs + cfg.n_heldout_docs))
    train_docs, heldout_docs = docs[: cfg.n_docs], docs[cfg.n_docs :]

    log(f"tokenizer: byte-level BPE, vocab {cfg.vocab_size}")
    tokenizer = train_tokenizer(train_docs, cfg)
    numbers_single = all(len(tokenizer(" " + str(n), add_special_tokens=False)["input_ids"]) == 1
                         for n in range(synth.NUMBER_MAX + 1))
    rows = pack(train_docs, tokenizer, cfg.seq_len)
    heldout = pack(heldout_docs, tokenizer, cfg.seq_len)
    log(f"packed {rows.numel():,} training tokens ({len(rows)} rows of {cfg.seq_len}); "
        f"{heldout.numel():,} held-out; every number 0..{synth.NUMBER_MAX} one token: {numbers_single}")

    model = new_model(cfg, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    ppl_random = perplexity(model, heldout)
    log(f"model: {n_params:,} parameters; random-init held-out perplexity {ppl_random:.1f}")

    t_train = time.perf_counter()
    losses = pretrain(model, rows, cfg)
    train_s = time.perf_counter() - t_train
    ppl_trained = perplexity(model, heldout)
    log(f"trained held-out perplexity {ppl_trained:.2f} (random init {ppl_random:.1f}) in {train_s:.0f}s")

    task = synth.make_task(cfg.seed, dict(cfg.task_sizes))
    base_acc = multiple_choice_accuracy(model.to(torch.bfloat16), tokenizer, task["test"])
    log(f"task 'largest': base model accuracy on test (bf16) {base_acc:.3f} (chance {1 / synth.N_CHOICES:.2f})")

    model_dir, task_dir = out / "base_model", out / "task"
    model.to(torch.float32).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    _portable_tokenizer_config(model_dir / "tokenizer_config.json")
    for split, split_rows in task.items():
        write_jsonl(task_dir / f"{split}.jsonl", split_rows)

    info = {
        "seed": cfg.seed,
        "config": dataclasses.asdict(cfg),
        "corpus": {"train_docs": len(train_docs), "heldout_docs": len(heldout_docs),
                   "train_tokens": rows.numel(), "heldout_tokens": heldout.numel(),
                   "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len},
        "tokenizer": {"vocab_size": len(tokenizer), "numbers_are_single_tokens": numbers_single},
        "model": {"parameters": n_params, "architecture": "LlamaForCausalLM", "saved_dtype": "float32",
                  "config": {k: getattr(model.config, k) for k in (
                      "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                      "tie_word_embeddings")}},
        "perplexity_heldout": {"random_init": round(ppl_random, 2), "trained": round(ppl_trained, 3)},
        "final_train_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "task": {"name": "largest", "description": "four distinct numbers 0..99 in the prompt; pick the largest",
                 "n_choices": synth.N_CHOICES,
                 "sizes": {k: len(v) for k, v in task.items()},
                 "base_accuracy_test_bf16": round(base_acc, 4)},
        "timing_s": {"pretrain": round(train_s, 1), "total": round(time.perf_counter() - t_start, 1)},
        "versions": versions(),
    }
    info["bytes"] = {"base_model": folder_bytes(model_dir), "task": folder_bytes(task_dir)}
    info["bytes"]["total"] = sum(sum(v.values()) for v in info["bytes"].values())
    (out / "BUILD_INFO.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"wrote {out} ({info['bytes']['total'] / 1e6:.2f} MB) in {info['timing_s']['total']:.0f}s")
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ASSETS_DIR, help="output folder (default: the shipped assets)")
    parser.add_argument("--seed", type=int, default=BuildConfig.seed)
    parser.add_argument("--steps", type=int, default=BuildConfig.steps, help="pretraining steps")
    parser.add_argument("--n-docs", type=int, default=BuildConfig.n_docs)
    parser.add_argument("--threads", type=int, default=BuildConfig.threads,
                        help="torch threads (more is faster on an idle machine, but changes the bits)")
    args = parser.parse_args(argv)
    cfg = BuildConfig(seed=args.seed, steps=args.steps, n_docs=args.n_docs, threads=args.threads)
    torch.set_num_threads(cfg.threads)
    build(cfg, args.out)


if __name__ == "__main__":
    main()
