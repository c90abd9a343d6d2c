"""Tokens/s and peak memory of one LoRA training step per (policy, backend): BF16 vs FP8.

    python benchmarks/h200_backends.py                 # H200 (any SM 8.9+ GPU): ~1B Llama, seq 2048
    python benchmarks/h200_backends.py --smoke         # CPU, tiny model, 2 steps (CI)
    python benchmarks/h200_backends.py --configs bf16:emulated,fp8_protected:torchao:tensorwise

Model: a randomly initialised Llama (transformers ``LlamaConfig``: hidden 2048, 16 layers, 32
heads, 8 KV heads, intermediate 5632, vocab 32000 -> ~1.1B params), PEFT LoRA r=16 on all
linears, batch ``--batch`` x seq ``--seq`` random tokens. Each config builds a fresh model (same
seed), applies the policy through the backend (``select_backend`` + ``apply_backend``, as a
trial does), runs ``--warmup`` steps, then times ``--steps`` steps of exactly the trial's step
(forward, ``scale_loss().backward()``, ``prepare_step``, ``optimizer.step``, ``after_step``).

A config is ``policy:backend[:recipe][:stock]``:

- ``backend`` in emulated | torchao | transformer_engine | auto;
- ``recipe`` forces a torchao recipe (tensorwise | rowwise | rowwise_with_gw_hp) instead of the
  one derived from the policy;
- ``stock`` keeps torchao's own ``Float8Linear`` (which also computes the frozen weight's
  discarded gradient) instead of fp8lab's frozen-base module, to measure what skipping it buys.

Peak memory is ``torch.cuda.max_memory_allocated`` from just before the first step (weights,
LoRA optimizer state, activations); ``n/a`` on CPU. Results print as a table with ratios to the
first ``bf16`` row and go to JSON (``--out``, else ``$OUT/h200_backends.json``, else
``./h200_backends.json``). A config that fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

DEFAULT_CONFIGS = (
    "bf16:emulated",
    "fp8_naive:emulated",
    "fp8_protected:emulated",
    "fp8_naive:torchao",
    "fp8_protected:torchao",
    "fp8_protected:torchao:tensorwise",
    "fp8_protected:torchao:rowwise:stock",
)
SMOKE_CONFIGS = (
    "bf16:emulated",
    "fp8_naive:emulated",
    "fp8_naive:torchao",
    "fp8_protected:torchao",
    "fp8_protected:torchao:tensorwise:stock",
)
MODEL_1B = dict(
    hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
)  # fmt: skip
MODEL_TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=128, max_position_embeddings=128,
)  # fmt: skip
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


def parse_config(spec: str) -> dict[str, Any]:
    parts = spec.split(":")
    if len(parts) < 2:
        raise SystemExit(f"config {spec!r}: want policy:backend[:recipe][:stock]")
    out: dict[str, Any] = {"spec": spec, "policy": parts[0], "backend": parts[1], "options": {}}
    for extra in parts[2:]:
        if extra in RECIPES:
            out["options"]["recipe"] = extra
        elif extra == "stock":
            out["options"]["skip_frozen_wgrad"] = False
        else:
            raise SystemExit(f"config {spec!r}: unknown part {extra!r} (recipe name or 'stock')")
    return out


def build_model(model_cfg: dict[str, Any], lora_r: int, device: torch.device) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**model_cfg)
    with torch.device(device):  # initialise on the GPU: a 1B model on CPU takes a while
        model = LlamaForCausalLM(cfg)
    lora = LoraConfig(
        r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, target_modules="all-linear"
    )
    return get_peft_model(model, lora)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # SYNC: timing boundary


def run_config(cfg: dict[str, Any], args: argparse.Namespace, device: torch.device) -> dict:
    from workloads.precision.backends import apply_backend, select_backend
    from workloads.precision.telemetry import Fp8Telemetry

    model = build_model(args.model_cfg, args.lora_r, device)
    telemetry = Fp8Telemetry() if args.telemetry_every else None
    choice = select_backend(cfg["backend"], device)
    handle = apply_backend(model, cfg["policy"], telemetry, choice, **cfg["options"])
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(1)
    vocab = args.model_cfg["vocab_size"]
    batches = [
        torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)
        for _ in range(min(4, args.warmup + args.steps))
    ]

    def step(i: int) -> torch.Tensor:
        ids = batches[i % len(batches)]
        if telemetry is not None:
            telemetry.begin_step(i, record=i % args.telemetry_every == 0)
        loss = model(input_ids=ids, labels=ids).loss
        handle.scale_loss(loss).backward()
        if handle.prepare_step(opt):
            opt.step()
            handle.after_step()
        opt.zero_grad(set_to_none=True)
        if telemetry is not None:
            telemetry.end_step()
        return loss.detach()

    for i in range(args.warmup):
        step(i)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    sync(device)
    elapsed = time.perf_counter() - start
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    tokens = args.batch * args.seq * args.steps
    return {
        "config": cfg["spec"],
        "policy": cfg["policy"],
        "backend": handle.backend,
        "emulated": bool(handle.emulated),
        "reason": choice.reason,
        "recipe": getattr(handle, "recipe", None),
        "converted_linears": len(getattr(handle, "converted", [])),
        "deviations": list(getattr(handle, "deviations", ())),
        "tokens_per_s": tokens / elapsed,
        "step_ms": 1000.0 * elapsed / args.steps,
        "peak_bytes": peak,
        "base_weight_bytes": int(handle.base_weight_bytes()),
        "final_loss": float(loss),  # SYNC: once, after timing
    }


def add_ratios(results: list[dict]) -> None:
    base = next((r for r in results if r.get("policy") == "bf16" and "error" not in r), None)
    for r in results:
        if base is None or "error" in r:
            continue
        r["tokens_per_s_vs_bf16"] = r["tokens_per_s"] / base["tokens_per_s"]
        if r["peak_bytes"] and base["peak_bytes"]:
            r["peak_bytes_vs_bf16"] = r["peak_bytes"] / base["peak_bytes"]


def print_table(results: list[dict]) -> None:
    head = f"{'config':42} {'backend':9} {'emu':>4} {'recipe':10} {'tok/s':>10} {'x bf16':>7}"
    head += f" {'peak GiB':>9} {'x bf16':>7} {'step ms':>9} {'loss':>7}"
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['config']:42} FAILED: {r['error'].splitlines()[-1][:100]}")
            continue
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f}"
        mem_ratio = r.get("peak_bytes_vs_bf16")
        print(
            f"{r['config']:42} {r['backend'][:9]:9} {'y' if r['emulated'] else 'n':>4}"
            f" {str(r['recipe'] or '-'):10} {r['tokens_per_s']:10.1f}"
            f" {r.get('tokens_per_s_vs_bf16', float('nan')):7.2f} {peak:>9}"
            f" {'n/a' if mem_ratio is None else f'{mem_ratio:.2f}':>7}"
            f" {r['step_ms']:9.1f} {r['final_loss']:7.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU (CI)")
    p.add_argument("--configs", help="comma-separated policy:backend[:recipe][:stock]")
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--telemetry-every", type=int, default=0, help="record telemetry every k steps")
    p.add_argument("--out", default=None, help="JSON path (default $OUT/h200_backends.json)")
    args = p.parse_args(argv)

    if args.smoke:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        args.model_cfg = MODEL_TINY
        defaults = {"seq": 32, "batch": 2, "steps": 2, "warmup": 1}
        configs = args.configs.split(",") if args.configs else list(SMOKE_CONFIGS)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU: run with --smoke for the CPU check")
        device = torch.device("cuda")
        args.model_cfg = MODEL_1B
        defaults = {"seq": 2048, "batch": 1, "steps": 10, "warmup": 3}
        configs = args.configs.split(",") if args.configs else list(DEFAULT_CONFIGS)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    parsed = [parse_config(c) for c in configs]

    cuda = device.type == "cuda"
    meta = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "capability": list(torch.cuda.get_device_capability(device)) if cuda else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "model": args.model_cfg,
        "lora_r": args.lora_r,
        "seq": args.seq,
        "batch": args.batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "telemetry_every": args.telemetry_every,
        "smoke": args.smoke,
    }
    try:
        import torchao

        meta["torchao"] = torchao.__version__
    except Exception:  # noqa: BLE001
        meta["torchao"] = None
    print(
        f"# {meta['device']} torch {meta['torch']} torchao {meta['torchao']}; seq {args.seq}"
        f" x batch {args.batch}, {args.warmup} warmup + {args.steps} timed steps",
        flush=True,
    )

    results = []
    for cfg in parsed:
        started = time.perf_counter()
        try:
            row = run_config(cfg, args, device)
        except Exception:  # noqa: BLE001 - record and go on with the other configs
            row = {"config": cfg["spec"], "policy": cfg["policy"], "error": traceback.format_exc()}
        row["wall_s"] = time.perf_counter() - started
        results.append(row)
        status = "FAILED" if "error" in row else f"{row['tokens_per_s']:.1f} tok/s"
        print(f"  {cfg['spec']}: {status} ({row['wall_s']:.1f}s)", flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    add_ratios(results)
    print()
    print_table(results)

    out = args.out or str(Path(os.environ.get("OUT", ".")) / "h200_backends.json")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\nwrote {out}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
