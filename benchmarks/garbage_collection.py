"""What holding the garbage collector at import and at exit saves per process
(fp8lab_conf.garbage_collection).

Fresh processes, the variants of a case interleaved (order rotated each round), CPU of each child
(user + system, from `os.wait4`):
  import: `import workloads.entry` (a trial worker's imports) then exit: plain; `skip` (then
          `skip_final_collection()`); `paused+skip` (the import inside `collection_paused()` too,
          as the trial's Ray task does);
  trial:  a TINY `fp8lab trial` (bf16, 6 steps, 16 eval items) through `main` (plain) vs through the
          `fp8lab` entry point (`orchestrator.cli.run`: skip), each in its own empty folder (both
          import `workloads.entry` paused, in orchestrator/single_trial.py).
Figures: median CPU per variant and the median of per-round ratios to plain.

    python benchmarks/garbage_collection.py            # 5 rounds, ~4 min
    python benchmarks/garbage_collection.py --smoke    # 1 round of a stdlib import: the shape only
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from _common import ROOT, interleave, print_table, ratio_samples, summarize, write_json

SKIP = "from fp8lab_conf.garbage_collection import skip_final_collection; skip_final_collection()"
PAUSED = "from fp8lab_conf.garbage_collection import collection_paused\nwith collection_paused():\n    import {module}\n"
TINY = ["precision=bf16", "train.steps=6", "train.log_every=2", "precision.telemetry.every=2",
        "train.warmup_steps=1", "eval.limit=16", "train.num_threads=1"]
PLAIN_MAIN = "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"


def child_cpu(command: list[str], cwd: Path | None = None) -> float:
    """CPU seconds (user + system) of one child process, which must exit 0."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a chatty child never blocks
        proc = subprocess.Popen(command, cwd=cwd or ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            stderr.seek(0)
            raise SystemExit(f"{' '.join(command[:4])} ... exited {proc.returncode}: {stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def trial_cpu(entry: list[str]) -> float:
    with tempfile.TemporaryDirectory(prefix="fp8lab-gc-") as folder:
        return child_cpu([sys.executable, *entry, "trial", *TINY, f"trial.output={folder}/result.json"], Path(folder))


def pairs(module: str, with_trial: bool) -> dict[str, dict[str, Callable[[], float]]]:
    out = {"import": {"plain": lambda: child_cpu([sys.executable, "-c", f"import {module}"]),
                      "skip": lambda: child_cpu([sys.executable, "-c", f"import {module}; {SKIP}"]),
                      "paused+skip": lambda: child_cpu([sys.executable, "-c", PAUSED.format(module=module) + SKIP])}}
    if with_trial:
        out["trial"] = {"plain": lambda: trial_cpu(["-c", PLAIN_MAIN]), "skip": lambda: trial_cpu(["-m", "orchestrator.cli"])}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="1 round, a stdlib import, no trial: the shape only")
    parser.add_argument("--json", help="output file (default benchmarks/results/garbage_collection.json)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be at least 1")
    rounds = 1 if args.smoke else args.rounds
    results, rows = {}, []
    for case, variants in pairs("json" if args.smoke else "workloads.entry", not args.smoke).items():
        samples = interleave(variants, rounds)
        results[case] = {name: {"cpu_s": summarize(values), "ratio": summarize(ratio_samples(values, samples["plain"])),
                                "samples": values} for name, values in samples.items()}
        for name, figures in results[case].items():
            ratio = figures["ratio"]
            rows.append([case, name, figures["cpu_s"]["median"], ratio["median"], f"{ratio['p25']:.3f}-{ratio['p75']:.3f}"])
    print_table(f"CPU per process, median of {rounds} round(s)", ["case", "variant", "CPU s", "x plain", "IQR"], rows)
    path = write_json(args.json, "garbage_collection", {"smoke": args.smoke, "rounds": rounds, "results": results})
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
