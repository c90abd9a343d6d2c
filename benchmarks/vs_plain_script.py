"""fp8lab's overhead against a plain script: the default bf16 trial (`fp8lab trial`) vs the same
LoRA fine-tune written by hand with PEFT + transformers (benchmarks/plain_lora.py).

    python benchmarks/vs_plain_script.py             # ~4 min: 3 rounds of 150 steps each
    python benchmarks/vs_plain_script.py --smoke     # one short round, for CI
    python benchmarks/vs_plain_script.py --steps 400 --rounds 3 --json out.json

Goal: fp8lab's training tokens/s at least 0.95x the plain script's.

Both run as separate processes on one thread (``train.num_threads=1`` / ``--threads 1``, and
OMP_NUM_THREADS=1), same model, data, steps, batch, seed, alternating A B / B A each round. The
trial is the real CLI with its defaults (MLflow logging to a SQLite store in a temp folder,
telemetry every 10 steps, evaluation after training with ``eval.limit``); its ``train/tokens_per_s``
is real tokens over the training loop's wall time, measured the same way as the plain script's.
Whole-process wall time (imports, MLflow, evaluation included) is reported too, for the record:
the goal is about the training loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

NAME = "vs_plain_script"
GOAL = 0.95
HERE = Path(__file__).resolve().parent


def fp8lab_command() -> list[str]:
    exe = shutil.which("fp8lab", path=str(Path(sys.executable).parent)) or shutil.which("fp8lab")
    return [exe] if exe else [sys.executable, "-m", "orchestrator.cli"]


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(common.ROOT), env.get("PYTHONPATH")]))
    return env


def run_fp8lab(tmp: Path, steps: int, eval_limit: int, i: int) -> dict[str, Any]:
    out = tmp / f"trial-{i}.json"
    cmd = fp8lab_command() + [
        "trial", "precision=bf16", f"train.steps={steps}", "train.num_threads=1", f"eval.limit={eval_limit}",
        f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", f"trial.output={out}", "sweep.name=bench-vs-plain", f"seed={i % 2}",
    ]
    wall = _run(cmd, tmp)
    result = json.loads(out.read_text())
    if result["status"] != "FINISHED":
        raise RuntimeError(f"fp8lab trial {result['status']}: {result.get('reason')}")
    m = result["metrics"]
    return {"tokens_per_s": m["train/tokens_per_s"], "train_wall_s": m["train/wall_s"], "process_wall_s": wall,
            "final_loss": m["train/final_loss"]}


def run_plain(tmp: Path, steps: int, i: int) -> dict[str, Any]:
    out = tmp / f"plain-{i}.json"
    cmd = [sys.executable, str(HERE / "plain_lora.py"), "--steps", str(steps), "--threads", "1",
           "--seed", str(i % 2), "--json", str(out)]
    wall = _run(cmd, tmp)
    figures = json.loads(out.read_text())
    figures["process_wall_s"] = wall
    return figures


def _run(cmd: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=child_env(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one short round, to check the script runs")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--eval-limit", type=int, default=20)
    parser.add_argument("--json", help="where to write the figures (default benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds, args.eval_limit = 5, 1, 4
    runs: dict[str, list[dict[str, Any]]] = {"fp8lab": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="fp8lab-bench-plain-") as tmp_name:
        tmp = Path(tmp_name)
        for i in range(args.rounds):
            order = ["fp8lab", "plain"] if i % 2 == 0 else ["plain", "fp8lab"]
            for who in order:
                runs[who].append(run_fp8lab(tmp, args.steps, args.eval_limit, i) if who == "fp8lab"
                                 else run_plain(tmp, args.steps, i))
                print(f"round {i + 1}/{args.rounds} {who}: {runs[who][-1]['tokens_per_s']:.0f} tokens/s, "
                      f"process {runs[who][-1]['process_wall_s']:.1f}s", flush=True)
    tps = {k: [r["tokens_per_s"] for r in v] for k, v in runs.items()}
    ratio = common.summarize(common.ratio_samples(tps["fp8lab"], tps["plain"]))
    proc = {k: common.summarize([r["process_wall_s"] for r in v]) for k, v in runs.items()}
    common.print_table(f"fp8lab trial vs plain PEFT script ({args.steps} steps, batch 16, 1 thread, "
                       f"median of {args.rounds})", ["run", "train tokens/s", "train wall s", "process wall s"],
                       [[k, common.summarize(tps[k])["median"],
                         common.summarize([r["train_wall_s"] for r in runs[k]])["median"], proc[k]["median"]]
                        for k in runs])
    print(f"\nfp8lab / plain tokens/s: {ratio['median']:.3f} (goal >= {GOAL})")
    path = common.write_json(args.json, NAME, {
        "smoke": args.smoke, "steps": args.steps, "rounds": args.rounds, "goal_ratio": GOAL,
        "summary": {"tokens_per_s_ratio": ratio["median"],
                    "tokens_per_s": {k: common.summarize(v)["median"] for k, v in tps.items()},
                    "process_wall_s": {k: v["median"] for k, v in proc.items()}},
        "ratio": ratio, "runs": runs, "command": "python benchmarks/vs_plain_script.py"})
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
