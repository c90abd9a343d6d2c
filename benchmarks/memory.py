"""Memory per precision policy: peak memory of a trial and the weight storage of the frozen base.

    python benchmarks/memory.py              # ~1-2 min: 3 policies x (default model, hidden 1024)
    python benchmarks/memory.py --smoke      # default model, 2 steps, in this process (CI)
    python benchmarks/memory.py --json out.json

Goal: frozen base weights under fp8_protected (FP8 E4M3 + FP32 128x128 block scales) at most
0.52x their bf16 size.

Each (policy, model) runs in a fresh process (peak RSS is per process): it builds the trial the
way ``workloads.trial`` does (load, LoRA, policy; telemetry on), trains ``--steps`` steps, and
reports ``memory/peak_bytes`` exactly as a trial does on CPU (``workloads.train.memory.PeakMemory``:
growth of the peak resident set over what the process held after its imports) and
``memory/base_weight_bytes`` (``handle.base_weight_bytes()``: every frozen Linear weight, lm_head
included, FP8 scales included). ``fp8_protected/eager`` is the same policy with the compiled
casts off (``FP8LAB_FUSED_CASTS=off``): on the wide model the compiled kernels (torch.compile,
which holds on to its own memory) are part of the FP8 policies' peak. Storage is also split into the base linears that the LoRA layers
wrap (the ones a policy may store in FP8) and the output head (BF16 under fp8_protected by
design, FP8 under fp8_naive). Ratios are against bf16 on the same model in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

NAME = "memory"
GOAL = 0.52
POLICIES = ("bf16", "fp8_naive", "fp8_protected")
EAGER = "fp8_protected/eager"  # the same policy with FP8LAB_FUSED_CASTS=off: no torch.compile in the process


def child(policy: str, hidden: int | None, layers: int | None, steps: int) -> dict[str, Any]:
    """Runs in the fresh process: build, train, measure."""
    common.pin_threads(1)
    import torch
    from peft.tuners.lora import LoraLayer

    import workloads.trial  # noqa: F401 - a trial's imports are done before its baseline too
    from workloads.train.memory import PeakMemory
    from workloads.precision.linear import Fp8BaseLinear

    memory = PeakMemory(torch.device("cpu"))
    trial = common.build_trial(policy, hidden=hidden, layers=layers)
    after_setup = memory.peak_bytes()
    trial.run_chunk(steps)
    handle, model = trial.handle, trial.model
    base_linears = {"bytes": 0, "bf16_bytes": 0}
    for module in model.modules():
        if isinstance(module, LoraLayer):
            base = module.base_layer
            if isinstance(base, Fp8BaseLinear):
                base_linears["bytes"] += base.storage_bytes()
                base_linears["bf16_bytes"] += base.in_features * base.out_features * 2
            elif isinstance(base, torch.nn.Linear):
                base_linears["bytes"] += base.weight.nbytes
                base_linears["bf16_bytes"] += base.weight.numel() * 2
    head = model.get_output_embeddings()
    head_bytes = head.storage_bytes() if isinstance(head, Fp8BaseLinear) else head.weight.nbytes
    return {
        "policy": policy, "hidden": hidden or 128, "layers": layers if hidden else 4, "steps": steps,
        "peak_bytes": memory.peak_bytes(), "peak_bytes_after_setup": after_setup,
        "base_weight_bytes": int(handle.base_weight_bytes()),
        "base_linear_bytes": base_linears["bytes"], "base_linear_bf16_bytes": base_linears["bf16_bytes"],
        "lm_head_bytes": int(head_bytes),
    }


def run_child(policy: str, size: str, layers: int, steps: int) -> dict[str, Any]:
    eager = policy == EAGER
    cmd = [sys.executable, __file__, "--child", policy.split("/")[0], size, str(layers), str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if eager:
        env["FP8LAB_FUSED_CASTS"] = "off"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {policy} {size} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["policy"] = policy
    return result


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        policy, size, layers, steps = sys.argv[2:6]
        hidden = None if size == "default" else int(size)
        print(json.dumps(child(policy, hidden, int(layers) if hidden else None, int(steps))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="default model, 2 steps")
    parser.add_argument("--sizes", default="default,1024")
    parser.add_argument("--layers", type=int, default=2, help="layers of the wide model(s)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", help="where to write the figures (default benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.smoke:  # in this process: checks the code paths, the peak figures mean nothing
        args.sizes, args.steps = "default", 2
    results: dict[str, dict[str, Any]] = {}
    for size in args.sizes.split(","):
        if args.smoke:
            results[size] = {p: child(p, None, None, args.steps) for p in POLICIES}
        else:
            results[size] = {p: run_child(p, size, args.layers, args.steps) for p in (*POLICIES, EAGER)}
        ref = results[size]["bf16"]
        for p, r in results[size].items():
            r["base_weight_ratio"] = r["base_weight_bytes"] / ref["base_weight_bytes"]
            r["base_linear_ratio"] = r["base_linear_bytes"] / ref["base_linear_bytes"]
            r["peak_ratio"] = r["peak_bytes"] / ref["peak_bytes"] if ref["peak_bytes"] else float("nan")
    rows = []
    for size, by_policy in results.items():
        for p, r in by_policy.items():
            rows.append([f"{r['hidden']}x{r['layers']}L", p, r["peak_bytes"] / 2**20, f"{r['peak_ratio']:.2f}",
                         r["base_linear_bytes"] / 2**20, f"{r['base_linear_ratio']:.4f}", r["lm_head_bytes"] / 2**20,
                         r["base_weight_bytes"] / 2**20, f"{r['base_weight_ratio']:.4f}"])
    common.print_table("Memory per policy (CPU: peak RSS growth of a fresh process; storage of frozen weights)",
                       ["model", "policy", "peak MiB", "x bf16", "base linears MiB", "x bf16", "lm_head MiB",
                        "all frozen MiB", "x bf16"], rows)
    summary = {size: {"fp8_protected_base_linear_ratio": r["fp8_protected"]["base_linear_ratio"],
                      "fp8_protected_all_frozen_ratio": r["fp8_protected"]["base_weight_ratio"],
                      "peak_mib": {p: v["peak_bytes"] / 2**20 for p, v in r.items()}} for size, r in results.items()}
    path = common.write_json(args.json, NAME, {"smoke": args.smoke, "goal_ratio": GOAL, "summary": summary,
                                               "results": results, "command": "python benchmarks/memory.py"})
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
