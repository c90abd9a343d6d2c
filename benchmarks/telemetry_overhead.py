"""Telemetry overhead: trial step time with fp8lab's telemetry vs telemetry off (goal: <= 3%).

    python benchmarks/telemetry_overhead.py            # ~10 min: bf16 (the default trial), fp8_protected, fp8_naive
    python benchmarks/telemetry_overhead.py --hidden 1024 --rounds 8 --max-rounds 12   # the wide model
    python benchmarks/telemetry_overhead.py --model smollm2-135m --rounds 8 --max-rounds 8 --cycles 1 --no-control   # ~45 min
    python benchmarks/telemetry_overhead.py --variants off,default,every_step,item_loop   # the reference points too
    python benchmarks/telemetry_overhead.py --smoke    # seconds, for CI

One trial of each policy (embedded model, LoRA, policy, data, seed), built in this process exactly
as ``workloads.trial`` builds it and trained through ``workloads.train.loop.run_training`` with a
real ``MlflowTrialLogger`` on a temporary SQLite store (so the extra metrics telemetry logs are
written like in a trial; ``--logger null`` drops them). The variants are that one trial trained
with different monitoring (``InProcessTrial.with_monitoring``), not copies of it: two copies of a
model with identical settings differed by up to ~2% in step time (where each copy's memory lies),
as much as the cost being measured.

- ``off``: telemetry off, as ``precision.telemetry.enabled=false`` builds it, and no health signals;
- ``off_again``: ``off`` once more, the control: its ratio to ``off`` is what the method reads when
  nothing differs (printed under each verdict; ``--no-control`` leaves it out, for models whose
  steps take seconds);
- ``default``: the shipped config (telemetry every 10 steps: every tensor kind, LoRA grad norms
  and weight stds, one device->host transfer per recorded step) plus the health signals every
  logged step computes (adapter movement, smallest LoRA std: docs/health.md), so the overhead is
  all the monitoring a trial does;
- ``every_step`` (on request): telemetry on every step (the worst case of the config), health signals too;
- ``item_loop`` (on request): telemetry off, plus the per-parameter monitor of docs/background.md §1
  the way the article writes it: after backward, for every LoRA parameter, grad norm, grad max-min
  range, E5M2 round-trip loss and weight std, each read with ``.item()``, every step. This is
  the reference that fp8lab's batched telemetry replaces.

How a round is timed: a *pass* draws ``--chunk`` batches and trains every variant one chunk on
those same batches, in an order that rotates each pass; a round is ``--cycles`` x (number of
variants) passes, so within a round every variant holds every place equally often, and a
variant's figure for the round is its mean time per step over the round's passes. Short passes
side by side put the variants next to each other many times a round, so a drift of the machine's
speed (seconds long) hits them alike. A chunk of 10 holds exactly one recorded step of
``default``; the step count restarts with each chunk, so a chunk that is not a multiple of
``precision.telemetry.every`` is refused (it would hold none, or the wrong share). The overhead
is the median over rounds of the per-round ratio to ``off``. Torch uses one thread.

The verdict (``verdict``) is on the ``--clock`` (default ``cpu``: this process's CPU time, which
moves least when other processes share the cores; on an idle machine it equals the wall clock):
per policy, the per-round ratios of ``default`` to ``off`` give the median, the quartiles (IQR)
and the distribution-free 95% CI of the median. ``pass`` when the IQR lies at or below the goal
(1.03), ``fail`` when it lies above it, ``not decidable`` when it straddles the goal or is wider
than +-3% (too noisy to say). Rounds are adaptive: after ``--rounds``, blocks of 4 more run while
a policy is not decidable, up to ``--max-rounds``. The control's median, IQR and CI are printed
under each verdict: a control far from 1.00 says the rounds were not comparable. The load average
at the start and the end is printed with the verdicts and written to the JSON: a busy machine is
a reason to rerun.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

from workloads.bench import median_ci  # noqa: E402  (the speed probe's CI of the median: one implementation)
from workloads.train.step_clock import load_average  # noqa: E402

NAME = "telemetry_overhead"
GOAL_PCT = 3.0
TOLERANCE_PCT = 3.0  # the IQR of the ratio must lie within median +- this to decide anything
EXTRA_ROUNDS = 4  # rounds added at a time while a verdict is not decidable (a multiple of the 4 variants)
MIN_ROUNDS = 8  # fewer per-round ratios decide nothing (their quartiles are two or three samples)


def verdict(ratios: list[float], goal_pct: float = GOAL_PCT, tolerance_pct: float = TOLERANCE_PCT) -> dict[str, Any]:
    """The goal's verdict on per-round ratios (with monitoring / without): ``pass``, ``fail`` or
    ``not decidable``, with the median, quartiles and 95% CI of the median it rests on.

    A pass needs the whole IQR at or below ``1 + goal`` (a median under the goal with a quartile
    above it is a coin toss, not a pass), a fail the whole IQR above it, and either needs the IQR
    within median +- ``tolerance`` (a wider one says the machine was too noisy to measure 3%)."""
    stats = common.summarize(ratios)
    low, high = median_ci(ratios)
    goal = 1.0 + goal_pct / 100.0
    half_width = max(stats["median"] - stats["p25"], stats["p75"] - stats["median"])
    if len(ratios) < MIN_ROUNDS:
        outcome, why = "not decidable", f"{len(ratios)} rounds, fewer than {MIN_ROUNDS}"
    elif half_width * 100.0 > tolerance_pct:
        outcome, why = "not decidable", f"IQR wider than +-{tolerance_pct:g}% (noisy machine: rerun when quiet)"
    elif stats["p75"] <= goal:
        outcome, why = "pass", f"IQR at or below {goal:.2f}"
    elif stats["p25"] > goal:
        outcome, why = "fail", f"IQR above {goal:.2f}"
    else:
        outcome, why = "not decidable", f"IQR straddles {goal:.2f}"
    return {"verdict": outcome, "why": why, "median": stats["median"], "p25": stats["p25"], "p75": stats["p75"],
            "ci95": [low, high], "rounds": stats["n"], "overhead_pct": (stats["median"] - 1.0) * 100.0}


class ItemLoopMonitor:
    """docs/background.md §1's per-LoRA-parameter diagnostics, one ``.item()`` per number."""

    def __init__(self, model: Any) -> None:
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.rows: list[tuple[str, float, float, float, float]] = []
        self.active = False  # the variants share one handle: only the item_loop variant turns it on

    def __call__(self) -> None:
        import torch

        if not self.active:
            return
        with torch.no_grad():
            for name, p in self.params:
                g = p.grad
                if g is None:
                    continue
                grad_norm = g.norm().item()
                grad_range = (g.max() - g.min()).item()
                g8 = g.to(torch.float8_e5m2).float()
                mean_abs = g.abs().mean().item()
                rt_loss = (g8 - g).abs().mean().item() / mean_abs if mean_abs else 0.0
                w_std = p.detach().float().std().item()
                self.rows.append((name, grad_norm, grad_range, rt_loss, w_std))
        if len(self.rows) > 10_000:
            self.rows.clear()


def attach_item_loop(trial: common.InProcessTrial) -> ItemLoopMonitor:
    """Run the monitor right after ``handle.prepare_step`` (grads unscaled, before the step)."""
    monitor = ItemLoopMonitor(trial.model)
    handle = trial.handle
    prepare = handle.prepare_step

    def prepare_and_monitor(optimizer: Any) -> bool:
        ok = prepare(optimizer)
        monitor()
        return ok

    handle.prepare_step = prepare_and_monitor
    return monitor


VARIANTS = ("off", "off_again", "default", "every_step", "item_loop")
CONTROL = "off_again"  # "off" measured twice: the ratio of two identical variants is the method's noise floor


def build_variants(policy: str, logger_kind: str, store: Path, hidden: int | None = None,
                   layers: int = 2, model: str | None = None,
                   names: tuple[str, ...] = VARIANTS) -> dict[str, tuple[common.InProcessTrial, Any]]:
    """One trial of ``policy`` (its model, policy, telemetry collector and data), and each variant
    as that trial with its own monitoring settings (``InProcessTrial.with_monitoring``), each with
    a hook that turns what only it runs on and off around its chunks. Variants on two copies of a
    model differed by up to ~2% with identical settings (where each copy's memory lies); on one
    model they differ only in the monitoring."""
    size = {"hidden": hidden, "layers": layers if hidden else None,
            "overrides": [f"model={model}"] if model else None}
    trial = common.build_trial(policy, health=True, **size)
    every, health = trial.settings.telemetry_every, trial.health
    settings = {"off": (None, None), "off_again": (None, None), "default": (every, health),
                "every_step": (1, health), "item_loop": (None, None)}
    monitor = attach_item_loop(trial) if "item_loop" in names else None
    variants: dict[str, tuple[common.InProcessTrial, Any]] = {}
    for name in VARIANTS:
        if name not in names:
            continue
        variant = trial.with_monitoring(*settings[name])
        if logger_kind == "mlflow":
            variant.logger_factory = mlflow_logger_factory(store, f"{policy}-{name}")
        variants[name] = (variant, monitor if name == "item_loop" else None)
    return variants


def run_variant(variant: common.InProcessTrial, monitor: ItemLoopMonitor | None, chunk: int,
                batches: list[Any]) -> dict[str, float]:
    """One chunk of ``variant`` on ``batches``, with its item-loop monitor (if any) on meanwhile."""
    if monitor is not None:
        monitor.active = True
    try:
        return variant.run_chunk(chunk, batches)
    finally:
        if monitor is not None:
            monitor.active = False


def mlflow_logger_factory(store: Path, run_name: str) -> Any:
    """One MLflow run per variant on a SQLite store in ``store``; each chunk logs into it."""
    from mlflow.tracking import MlflowClient

    from workloads.record.logger import MlflowTrialLogger

    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("bench") or client.get_experiment(client.create_experiment(
        "bench", artifact_location=str(store / "artifacts")))
    run = client.create_run(exp.experiment_id, run_name=run_name)
    logger = MlflowTrialLogger(uri, run.info.run_id)
    return lambda: logger


def measure(policy: str, rounds: int, chunk: int, logger_kind: str, store: Path,
            hidden: int | None = None, layers: int = 2, max_rounds: int | None = None,
            clock: str = "cpu", model: str | None = None, names: tuple[str, ...] = VARIANTS,
            cycles: int = 2) -> dict[str, Any]:
    """Rounds of ``cycles`` x (number of variants) passes; a pass draws ``chunk`` batches and
    trains every variant on them, in an order rotating each pass (so over a round each variant
    holds each place equally often: the first after the draw, the one after a slow variant);
    a round's figure per variant is the mean of its passes.
    ``rounds`` at least, then blocks of ``EXTRA_ROUNDS`` while the verdict on ``clock`` is not
    decidable, up to ``max_rounds``."""
    variants = build_variants(policy, logger_kind, store, hidden, layers, model, names)
    passes = cycles * len(variants)
    trial = next(iter(variants.values()))[0]
    pass_batches: list[Any] = []
    for variant, monitor in variants.values():  # warm-up: first-call allocations, lazy imports
        run_variant(variant, monitor, chunk, trial.next_batches(chunk))

    def draw() -> None:
        pass_batches[:] = trial.next_batches(chunk)

    run = {n: (lambda v=v, m=m: _per_step(run_variant(v, m, chunk, pass_batches), passes))
           for n, (v, m) in variants.items()}
    load_start = load_average()
    samples = common.interleave(run, rounds, passes, draw)
    while verdict(_ratios(samples, clock))["verdict"] == "not decidable" \
            and len(_ratios(samples, clock)) < (max_rounds or rounds):
        more = common.interleave(run, min(EXTRA_ROUNDS, (max_rounds or rounds) - len(_ratios(samples, clock))),
                                 passes, draw)
        for name, clocks in more.items():
            for key, values in clocks.items():
                samples[name][key] += values
    out: dict[str, Any] = {"policy": policy, "hidden": hidden or model or 128, "chunk_steps": chunk,
                           "passes": passes, "rounds": len(_ratios(samples, clock)),
                           "variants": common.compare(samples, "off"),
                           "verdict": {"clock": clock, **verdict(_ratios(samples, clock))},
                           "control": {"clock": clock, **verdict(_ratios(samples, clock, CONTROL))} if CONTROL in samples else None,
                           "loadavg_start": load_start, "loadavg_end": load_average()}
    for figures in out["variants"].values():
        for figure in figures.values():
            figure["overhead_pct"] = (figure["ratio"]["median"] - 1.0) * 100.0
    return out


def _per_step(figures: dict[str, float], passes: int) -> dict[str, float]:
    """A chunk's seconds per step, divided by the passes of a round: their sum is the round's mean."""
    return {clock: value / passes for clock, value in figures.items()}


def _ratios(samples: dict[str, Any], clock: str, variant: str = "default") -> list[float]:
    """Per-round ratios of ``variant`` to ``off`` on ``clock``."""
    return common.ratio_samples(samples[variant][clock], samples["off"][clock])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps, to check the script runs")
    parser.add_argument("--rounds", type=int, default=12, help="rounds at least")
    parser.add_argument("--max-rounds", type=int, default=24,
                        help="rounds at most: more run while a verdict is not decidable")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="the clock the verdict is on")
    parser.add_argument("--chunk", type=int, default=10, help="steps per variant per pass")
    parser.add_argument("--cycles", type=int, default=2,
                        help="a round is this many cycles of passes, one pass per variant (a pass trains every "
                             "variant one chunk on the same batches; over a cycle each variant is first once)")
    parser.add_argument("--policies", default="bf16,fp8_protected,fp8_naive")
    parser.add_argument("--hidden", type=int, default=None,
                        help="the wide model of fp8_emulation.py at this width (default: the embedded model)")
    parser.add_argument("--layers", type=int, default=2, help="layers of the wide model")
    parser.add_argument("--model", help="a model option instead of the embedded model, e.g. smollm2-135m")
    parser.add_argument("--variants", default="off,default",
                        help=f"comma list of variants ({', '.join(VARIANTS)}); off, {CONTROL} and default are always measured")
    parser.add_argument("--no-control", action="store_true",
                        help=f"leave out {CONTROL} (a third fewer chunks: for models whose steps take seconds); "
                             "the verdicts then have no control beside them")
    parser.add_argument("--logger", choices=["mlflow", "null"], default="mlflow")
    parser.add_argument("--json", help="where to write the figures (default benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.max_rounds, args.cycles, args.policies = 1, 1, 1, "bf16"
    if problem := common.chunk_problem(args.chunk, args.policies.split(",")):
        parser.error(problem)
    if unknown := sorted(set(args.variants.split(",")) - set(VARIANTS)):
        parser.error(f"--variants: unknown {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    if args.no_control and CONTROL in args.variants.split(","):
        parser.error(f"--no-control leaves out {CONTROL}, which --variants asks for: drop one of the two")
    if args.cycles < 1:
        parser.error(f"--cycles {args.cycles}: must be at least 1")
    common.pin_threads(1)
    results = []
    with tempfile.TemporaryDirectory(prefix="fp8lab-bench-") as tmp:
        for policy in args.policies.split(","):
            results.append(measure(policy, args.rounds, args.chunk, args.logger, Path(tmp), args.hidden, args.layers,
                                   max(args.max_rounds, args.rounds), args.clock, args.model,
                                   tuple({"off", "default", *args.variants.split(","),
                                          *(() if args.no_control else (CONTROL,))}), args.cycles))
    rows = []
    for res in results:
        for name, v in res["variants"].items():
            w, c = v["wall"], v["cpu"]
            rows.append([res["policy"], name, w["step_s"]["median"] * 1e3, f"{w['overhead_pct']:+.1f}%",
                         f"{w['ratio']['p25']:.3f}..{w['ratio']['p75']:.3f}", c["step_s"]["median"] * 1e3,
                         f"{c['overhead_pct']:+.1f}%", f"{c['ratio']['p25']:.3f}..{c['ratio']['p75']:.3f}"])
    common.print_table(f"Telemetry overhead vs off (median of per-round ratios; a round: {results[0]['passes']} passes "
                       f"of {args.chunk} steps per variant, one model, the same batches in a pass; 1 thread; wall "
                       "clock and process CPU time)",
                       ["policy", "variant", "wall ms/step", "overhead", "IQR of ratio", "cpu ms/step", "overhead",
                        "IQR of ratio"], rows)
    summary = {"goal_overhead_pct": GOAL_PCT, "clock": args.clock, "passes": results[0]["passes"], "chunk": args.chunk,
               "verdicts": {r["policy"]: r["verdict"] for r in results},
               "controls": {r["policy"]: r["control"] for r in results},
               "default_overhead_pct": {r["policy"]: {k: r["variants"]["default"][k]["overhead_pct"]
                                                      for k in ("wall", "cpu")} for r in results},
               **{f"{name}_overhead_pct": {r["policy"]: {k: r["variants"][name][k]["overhead_pct"]
                                                          for k in ("wall", "cpu")} for r in results}
                  for name in ("every_step", "item_loop") if all(name in r["variants"] for r in results)}}
    path = common.write_json(args.json, NAME, {"smoke": args.smoke, "logger": args.logger,
                                               "summary": summary, "results": results,
                                               "command": " ".join(["python", "benchmarks/telemetry_overhead.py",
                                                                    *(sys.argv[1:] if argv is None else argv)])})
    line = ", ".join(f"{p}: wall {v['wall']:+.1f}% / cpu {v['cpu']:+.1f}%" for p, v in summary["default_overhead_pct"].items())
    print(f"\ndefault telemetry overhead: {line} (goal <= {GOAL_PCT:.0f}%)")
    for res in results:
        print(verdict_line(res))
    env = common.environment()
    print(f"load average (1/5/15 min) at start {_load(env['loadavg_at_start'])}, at end {_load(env['loadavg_at_end'])} "
          f"({os.cpu_count()} cores)\nJSON: {path}")
    return 0


def verdict_line(res: dict[str, Any]) -> str:
    """Per policy: verdict, median overhead, IQR and CI of the ratio, rounds, load; then the control
    (``off_again`` vs ``off``: what the method reads when nothing differs)."""
    v, c = res["verdict"], res["control"]
    control = (f"{c['overhead_pct']:+.1f}%, ratio IQR {c['p25']:.3f}..{c['p75']:.3f}, 95% CI of the median "
               f"{c['ci95'][0]:.3f}..{c['ci95'][1]:.3f}") if c else "not measured (--no-control)"
    return (f"{res['policy']} (hidden {res['hidden']}): {v['verdict'].upper()} ({v['why']}) - {v['clock']} overhead "
            f"{v['overhead_pct']:+.1f}%, ratio IQR {v['p25']:.3f}..{v['p75']:.3f}, 95% CI of the median "
            f"{v['ci95'][0]:.3f}..{v['ci95'][1]:.3f}, {v['rounds']} rounds, load {_load(res['loadavg_start'])} -> "
            f"{_load(res['loadavg_end'])}\n  control ({CONTROL} vs off, identical): {control}")


def _load(values: Any) -> str:
    """A load average (1-minute) or the three of ``os.getloadavg()``, printed."""
    if values is None or values != values:
        return "n/a"
    return "/".join(f"{x:.1f}" for x in values) if isinstance(values, (list, tuple)) else f"{values:.1f}"


if __name__ == "__main__":
    sys.exit(main())
