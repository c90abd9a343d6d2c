"""FP8 emulation cost on CPU: step time of fp8_protected and fp8_naive vs bf16, side by side with
torchao float8 training (``emulate=True``) on the same layers.

    python benchmarks/fp8_emulation.py             # ~4 min: default model and hidden 1024
    python benchmarks/fp8_emulation.py --smoke     # seconds, for CI
    python benchmarks/fp8_emulation.py --sizes 1024 --rounds 8 --json out.json
    python benchmarks/fp8_emulation.py --sizes 1024 --policies all --json benchmarks/results/fp8_emulation_all.json
    python benchmarks/fp8_emulation.py --sizes smollm2-135m --no-torchao --rounds 6 --chunk 2   # the real model

Goals: fp8_protected and fp8_naive at most 1.5x bf16 at hidden 1024; fp8lab's emulation at
least as fast as torchao's emulation of the same policy.

Models: ``default`` is the embedded model (hidden 128, 4 layers, ~20 tokens x 16 rows per
step); ``1024`` is the same architecture at hidden 1024 (intermediate 4096, 16 heads of 64,
``--layers`` layers, random init; same tokenizer, data, LoRA r=8 on all linears, batch 16).
Each variant is its own trial built in this process the way ``workloads.trial`` builds it and
trained through ``workloads.train.loop.run_training``; telemetry is off (its cost is
``telemetry_overhead.py``'s figure), so this is the emulation alone.

Variants per model: ``bf16``, ``fp8_protected`` and ``fp8_naive`` on the emulated backend
(``precision.backend=emulated``), and the same two policies on ``precision.backend=torchao``
(CPU: torchao's own float8 casts with ``emulate=True``, i.e. FP32 matmuls; fp8_protected maps
to the rowwise recipe, fp8_naive (v2) to tensorwise with dynamic per-tensor scales; see
workloads/precision/backends/torchao_backend.py). Variants run interleaved in chunks of
``--chunk`` steps, the order rotating each round; figures are medians over rounds and ratios
are medians of per-round ratios to bf16. Torch uses one thread.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

NAME = "fp8_emulation"
GOAL_VS_BF16 = 1.5
VARIANTS = [
    ("bf16", "bf16", "emulated"),
    ("fp8_protected", "fp8_protected", "emulated"),
    ("fp8_naive", "fp8_naive", "emulated"),
    ("torchao:fp8_protected", "fp8_protected", "torchao"),
    ("torchao:fp8_naive", "fp8_naive", "torchao"),
]


def variants_for(policies: str) -> list[tuple[str, str, str]]:
    """``VARIANTS`` by default; ``all``: bf16 plus every registered policy on the emulated
    backend (the mechanism rungs included); else a comma list of policy names (emulated)."""
    if not policies:
        return VARIANTS
    if policies == "all":
        from workloads.precision.policy import available_policies

        names = list(available_policies())
    else:
        names = policies.split(",")
    names = ["bf16"] + [n for n in names if n != "bf16"]
    return [(n, n, "emulated") for n in names]


def measure(size: str, layers: int | None, rounds: int, chunk: int, with_torchao: bool,
            variants: list[tuple[str, str, str]] = VARIANTS) -> dict[str, Any]:
    hidden = int(size) if size.isdigit() else None
    model = [] if hidden or size == "default" else [f"model={size}"]  # a model config (e.g. smollm2-135m)
    built = time.perf_counter()
    trials = {}
    for name, policy, backend in variants:
        if backend == "torchao" and not with_torchao:
            continue
        trials[name] = common.build_trial(policy, hidden=hidden, layers=layers if hidden else None, overrides=model,
                                          backend=backend, telemetry=False, name=name)
    build_s = time.perf_counter() - built
    arch = next(iter(trials.values())).model.config
    for trial in trials.values():  # warm-up
        trial.run_chunk(1)
    samples = common.interleave({n: (lambda t=t: t.run_chunk(chunk)) for n, t in trials.items()}, rounds)
    out: dict[str, Any] = {"size": size, "hidden": arch.hidden_size, "layers": arch.num_hidden_layers,
                           "chunk_steps": chunk, "rounds": rounds, "build_s": build_s,
                           "variants": common.compare(samples, "bf16")}
    for name, figures in out["variants"].items():
        figures["tokens_per_step"] = trials[name].tokens / max(trials[name].step, 1)
        figures["base_weight_bytes"] = int(trials[name].handle.base_weight_bytes())
    for policy in ("fp8_protected", "fp8_naive"):
        ao = f"torchao:{policy}"
        if ao in samples:
            for clock in ("wall", "cpu"):
                out["variants"][policy][clock]["ratio_vs_torchao"] = common.summarize(
                    common.ratio_samples(samples[policy][clock], samples[ao][clock]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps, to check the script runs")
    parser.add_argument("--sizes", default="default,1024",
                        help="comma list: default (the embedded model), hidden sizes of its wide copy, or a model "
                             "option such as smollm2-135m")
    parser.add_argument("--layers", type=int, default=2, help="layers of the wide model(s)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per size (0: 10 default, 6 wide)")
    parser.add_argument("--chunk", type=int, default=0, help="steps per variant per round (0: 5 default, 2 wide)")
    parser.add_argument("--no-torchao", action="store_true", help="skip the torchao variants")
    parser.add_argument("--policies", default="",
                        help="'all' (every registered policy, emulated) or a comma list; default: "
                             "bf16, fp8_protected, fp8_naive and their torchao variants")
    parser.add_argument("--json", help="where to write the figures (default benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.layers, args.rounds, args.chunk = "default,192", 1, 2, 1
    common.pin_threads(1)
    with_torchao = not args.no_torchao and _torchao_available()
    results = []
    for size in args.sizes.split(","):
        wide = size != "default"
        rounds = args.rounds or (6 if wide else 10)
        chunk = args.chunk or (2 if wide else 5)
        results.append(measure(size, args.layers, rounds, chunk, with_torchao, variants_for(args.policies)))
        common.free_memory()
    rows = []
    for res in results:
        for name, v in res["variants"].items():
            w, c = v["wall"], v["cpu"]
            rows.append([f"{res['hidden']}x{res['layers']}L", name, w["step_s"]["median"] * 1e3, w["ratio"]["median"],
                         f"{w['ratio']['p25']:.2f}..{w['ratio']['p75']:.2f}",
                         w.get("ratio_vs_torchao", {}).get("median", float("nan")),
                         c["step_s"]["median"] * 1e3, c["ratio"]["median"],
                         c.get("ratio_vs_torchao", {}).get("median", float("nan"))])
    common.print_table("FP8 emulation cost (median of interleaved rounds, 1 thread, telemetry off; wall and CPU time)",
                       ["model", "variant", "wall ms/step", "x bf16", "IQR", "x torchao", "cpu ms/step", "x bf16",
                        "x torchao"], rows)
    summary = {str(r["hidden"]): {n: {clock: {"x_bf16": v[clock]["ratio"]["median"],
                                              "x_torchao": v[clock].get("ratio_vs_torchao", {}).get("median")}
                                      for clock in ("wall", "cpu")}
                                  for n, v in r["variants"].items() if n != "bf16"} for r in results}
    path = common.write_json(args.json, NAME, {
        "smoke": args.smoke, "goal_x_bf16_at_1024": GOAL_VS_BF16, "torchao": with_torchao,
        "summary": summary, "results": results, "command": " ".join(["python", "benchmarks/fp8_emulation.py", *(sys.argv[1:] if argv is None else argv)])})
    print(f"\nJSON: {path}")
    return 0


def _torchao_available() -> bool:
    try:
        import torchao.float8  # noqa: F401
    except Exception:  # noqa: BLE001 - optional dependency, any import failure means "skip"
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
