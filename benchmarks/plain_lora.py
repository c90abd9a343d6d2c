"""The bf16 LoRA fine-tune of fp8lab's default trial, written the way a user would by hand with
PEFT + transformers (no fp8lab imports): the baseline of ``vs_plain_script.py``.

    python benchmarks/plain_lora.py --steps 400 --threads 1 --json plain.json

Same model (the embedded one), data (the embedded task's train split, ``prompt + " " + answer``
with the loss on the answer), LoRA (r=8, alpha=16, dropout 0, all linear layers), optimizer
(AdamW lr 2e-4, no weight decay, 20 warmup steps then constant, grad-norm clip 1.0), batch 16,
max 32 tokens, seed 0. It prints the loss every 10 steps (one ``.item()``) like a hand-written
loop would, and reports training tokens/s (real tokens, i.e. attention_mask.sum(), over the
loop's wall time) in the same way as fp8lab's ``train/tokens_per_s``.
"""

import argparse
import json
import time
from pathlib import Path

import torch
from datasets import load_dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

EMBEDDED = Path(__file__).resolve().parents[1] / "workloads" / "embedded" / "assets"

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default=str(EMBEDDED / "base_model"))
parser.add_argument("--data", default=str(EMBEDDED / "task" / "train.jsonl"))
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--json", help="write the figures here")
args = parser.parse_args()
started = time.perf_counter()
torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)

tokenizer = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                         target_modules="all-linear", task_type="CAUSAL_LM"))
rows = load_dataset("json", data_files=args.data, split="train")
examples = [(r["prompt"], r["choices"][r["answer"]]) for r in rows]


def collate(batch):
    enc = tokenizer([p + " " + a for p, a in batch], padding=True, truncation=True, max_length=32,
                    return_tensors="pt")
    labels = enc["input_ids"].clone()
    labels[enc["attention_mask"] == 0] = -100
    for i, (prompt, _) in enumerate(batch):
        labels[i, : len(tokenizer(prompt)["input_ids"])] = -100  # loss on the answer only
    return {**enc, "labels": labels}


params = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0)
scheduler = get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=20, num_training_steps=args.steps)
model.train()
order = torch.randperm(len(examples))
tokens, loss_value = 0, float("nan")
loop_started = time.perf_counter()
for step in range(1, args.steps + 1):
    if len(order) < args.batch_size:
        order = torch.cat([order, torch.randperm(len(examples))])
    index, order = order[: args.batch_size], order[args.batch_size:]
    batch = collate([examples[i] for i in index])
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    tokens += int(batch["attention_mask"].sum())
    if step % 10 == 0 or step == args.steps:
        loss_value = loss.item()
        print(f"step {step}/{args.steps} loss {loss_value:.4f}", flush=True)
loop_s = time.perf_counter() - loop_started

figures = {"tokens_per_s": tokens / loop_s, "train_wall_s": loop_s, "tokens": tokens, "steps": args.steps,
           "final_loss": loss_value, "process_wall_s": time.perf_counter() - started}
print(json.dumps(figures))
if args.json:
    Path(args.json).write_text(json.dumps(figures, indent=2))
