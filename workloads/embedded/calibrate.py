"""Calibrate the embedded task: how fast does a plain BF16 LoRA fine-tune learn it?

    python -m workloads.embedded.calibrate --steps 100 200 300 --batch-size 16 --threads 1

A self-contained plain PEFT LoRA fine-tune (no fp8lab precision code): the base in bfloat16,
LoRA adapters (all linears except lm_head) with FP32 master weights, AdamW, loss on the answer
tokens of `prompt + " " + choices[answer]` only. At each step budget it prints test accuracy
(summed log-likelihood of each choice, i.e. lm-eval's `acc`), elapsed time and steps/s; with
--lm-eval it also scores the final model through workloads.eval.harness.evaluate_model.
Used to pick the default `train.*`/`lora.*` values; not part of a trial.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def encode(tokenizer: Any, prompt: str, answer: str, max_len: int) -> tuple[list[int], int]:
    ids = tokenizer(prompt + " " + answer)["input_ids"]
    n_prompt = len(tokenizer(prompt)["input_ids"])
    return ids[-max_len:], max(0, n_prompt - max(0, len(ids) - max_len))


def pad_batch(seqs: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (seq, n_prompt) in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, n_prompt : len(seq)] = ids[i, n_prompt : len(seq)]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@torch.no_grad()
def accuracy(model: Any, tokenizer: Any, rows: list[dict], max_len: int, batch_size: int = 64) -> float:
    """lm-eval's `acc`: argmax over choices of the summed log-prob of the choice tokens."""
    model.eval()
    seqs, owners = [], []
    for r, row in enumerate(rows):
        for choice in row["choices"]:
            seqs.append(encode(tokenizer, row["prompt"], choice, max_len))
            owners.append(r)
    scores = torch.empty(len(seqs))
    for i in range(0, len(seqs), batch_size):
        batch = pad_batch(seqs[i : i + batch_size], tokenizer.pad_token_id)
        logp = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float().log_softmax(-1)
        labels = batch["labels"][:, 1:]
        tok = logp[:, :-1].gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        scores[i : i + len(labels)] = (tok * (labels != -100)).sum(1)
    model.train()
    correct = 0
    n_choices = [len(row["choices"]) for row in rows]
    start = 0
    for row, k in zip(rows, n_choices):
        correct += int(int(scores[start : start + k].argmax()) == row["answer"])
        start += k
    return correct / len(rows)


def main(argv: list[str] | None = None) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.eval.harness import embedded_paths, evaluate_model

    paths = embedded_paths()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=paths.model_dir)
    ap.add_argument("--data-dir", type=Path, default=paths.data_dir)
    ap.add_argument("--steps", type=int, nargs="+", default=[100, 200, 300, 400], help="step budgets to report")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--warmup", type=int, default=0, help="linear warmup steps")
    ap.add_argument("--grad-clip", type=float, default=None, help="max LoRA grad norm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--lm-eval", action="store_true", help="also score the final model with lm-eval")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype))
    train = load_rows(args.data_dir / "train.jsonl")
    test = load_rows(args.data_dir / "test.jsonl")[: args.test_limit]
    t_load = time.perf_counter() - t0
    base_acc = accuracy(model, tokenizer, test, args.max_seq_len)
    print(f"load {t_load:.1f}s; base accuracy {base_acc:.3f} on {len(test)} test rows")

    torch.manual_seed(args.seed)
    model = get_peft_model(model, LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()  # FP32 master weights; the matmuls autocast to BF16 below
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    encoded = [encode(tokenizer, r["prompt"], r["choices"][r["answer"]], args.max_seq_len) for r in train]
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.empty(0, dtype=torch.long)
    model.train()
    report, train_s, losses = [], 0.0, []
    for step in range(1, max(args.steps) + 1):
        t = time.perf_counter()
        if order.numel() < args.batch_size:
            order = torch.cat([order, torch.randperm(len(encoded), generator=gen)])
        index, order = order[: args.batch_size], order[args.batch_size :]
        batch = pad_batch([encoded[i] for i in index], tokenizer.pad_token_id)
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, step / args.warmup) if args.warmup else args.lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            loss = model(**batch).loss
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        train_s += time.perf_counter() - t
        if step in args.steps:
            t = time.perf_counter()
            acc = accuracy(model, tokenizer, test, args.max_seq_len)
            entry = {"steps": step, "accuracy": round(acc, 4), "loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
                     "train_s": round(train_s, 1), "steps_per_s": round(step / train_s, 2),
                     "eval_s": round(time.perf_counter() - t, 1)}
            report.append(entry)
            print(json.dumps(entry), flush=True)
    if args.lm_eval:
        t = time.perf_counter()
        result = evaluate_model(model, tokenizer, batch_size=32, limit=args.test_limit)
        print(f"lm-eval: accuracy {result['accuracy']:.4f} ± {result['accuracy_stderr']:.4f} "
              f"(n={result['n']}) in {time.perf_counter() - t:.1f}s")
    print(f"total {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
