"""`fp8lab bench`: the paired speed probe (workloads/bench.py) on any config.

The sweep's policies (`sweep.axes.precision`, same grammar as `fp8lab sweep`: `precision=a,b`)
are timed back to back in this process on the same model and batch shape, interleaved over
`--rounds` rounds of `--chunk` steps; each policy's step-time ratio to bf16 is printed with its
CI, next to the machine's load average at start and end. Nothing is written to MLflow.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from orchestrator.errors import UserInputError


def add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="paired speed probe: the sweep's policies interleaved in one process, ratios to bf16")
    bench.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. precision=bf16,fp8_protected lora.r=16")
    bench.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    bench.add_argument("--chunk", type=int, default=5, help="steps per policy per round (default 5)")
    bench.add_argument("--json", dest="json_path", help="also write the figures to this JSON file")
    bench.add_argument("--config-dir", help="your own config folder, searched before fp8lab's")


def probe_policies(config: dict[str, Any]) -> list[str]:
    """bf16 first (the reference), then the sweep's other policies in their order."""
    axis = (config.get("sweep", {}).get("axes") or {}).get("precision") or [config["precision"]["policy"]]
    names = [str(p) for p in axis]
    return ["bf16"] + [p for p in names if p != "bf16"]


def probe_configs(policies: list[str], overrides: list[str], config_dir: str | None = None) -> dict[str, dict[str, Any]]:
    """Each policy's composed config: the base `overrides` (without sweep axes or a precision
    choice) plus `precision=<policy>`, composed as a trial of that cell would be."""
    from orchestrator.config_loader import compose_config, to_container

    base = [o for o in overrides if not o.lstrip("+~").startswith(("sweep.", "precision="))]
    return {p: to_container(compose_config([*base, f"precision={p}"], config_dir)) for p in policies}


def run_bench(args: argparse.Namespace, config: dict[str, Any]) -> int:
    """`config`: composed from `args.overrides` after the sweep grammar rewrote them into axes."""
    if args.rounds < 2 or args.chunk < 1:
        raise UserInputError("--rounds/--chunk: at least 2 rounds of 1 step (fix: --rounds 6 --chunk 5)")
    configs = probe_configs(probe_policies(config), args.overrides, args.config_dir)
    from workloads.bench import ProbeSettings, run_probe  # the training stack: needed from here on

    result = run_probe(configs, ProbeSettings(rounds=args.rounds, chunk=args.chunk))
    print(format_probe(result))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def format_probe(result: dict[str, Any]) -> str:
    """The probe as a small table: step time and paired ratio to bf16 (CI), wall and CPU clocks."""
    conf = f"{result['confidence']:.0%}"
    lines = [f"paired speed probe: {result['rounds']} interleaved rounds x {result['chunk']} steps; "
             f"load average {result['loadavg_start']:.2f} -> {result['loadavg_end']:.2f} on {result['cpu_count']} cores",
             f"{'policy':<28} {'wall s/step':>12} {'x bf16 [' + conf + ' CI]':>24} {'CPU s/step':>11} {'x bf16 (CPU)':>13}"]
    for policy, clocks in result["policies"].items():
        w, c = clocks["wall"], clocks["cpu"]
        ratio = f"{w['ratio']['median']:.2f}x [{w['ratio']['low']:.2f}, {w['ratio']['high']:.2f}]"
        lines.append(f"{policy:<28} {w['step_s']['median']:>12.4f} {ratio:>24} {c['step_s']['median']:>11.4f} "
                     f"{c['ratio']['median']:>12.2f}x")
    lines.append("step-time ratios: > 1 = slower than bf16. On CPU the FP8 policies are emulated: these are the "
                 "emulator's costs, not FP8 hardware speed.")
    return "\n".join(lines)
