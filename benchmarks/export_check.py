"""Does a trial's fp8-block128 export score what the trial scored? Export it (or take a folder),
load it as a transformers model on CPU with its FP8 weights decoded to BF16, score the trial's eval
task on every item, and compare with the trial's own `eval/accuracy`. The weights are decoded by
`load_fp8_checkpoint` (the export's independent reader), because transformers' own CPU loader
mis-reads partial 128-blocks (SmolLM2's 576-wide linears); with whole blocks both give the same
weights (tests/unit/workloads/export).

    python benchmarks/export_check.py RUN_ID                        # the store in ./mlflow.db
    python benchmarks/export_check.py RUN_ID --tracking-uri sqlite:////path/mlflow.db
    python benchmarks/export_check.py RUN_ID --export DIR           # an existing export of that run
    python benchmarks/export_check.py RUN_ID --partial-blocks       # SmolLM2: its 576-wide linears
    python benchmarks/export_check.py RUN_ID --merged               # also the merged BF16 export

The trial scored with its own forward (its policy's FP8 emulation, LoRA unmerged); the export is the
merged model with its linears rounded to E4M3 per 128x128 block, so the two differ by that
rounding. Exit 0 when the accuracies are within --max-diff-pts (default 1), 1 otherwise. The result
goes to benchmarks/results/export_check.json (with the load average and the CPU).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "benchmarks"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import _common as common  # noqa: E402  (the machine, load, commit)
from vllm_load import machine  # noqa: E402  (the CPU and its AMX flag)


def score_folder(folder: Path, task: str, batch_size: int, limit: int | None = None) -> dict[str, Any]:
    """Accuracy of the folder's model on `task`, as a BF16 transformers model on CPU (an
    fp8-block128 folder decoded by ``load_fp8_checkpoint``, a merged one by ``from_pretrained``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.eval.harness import evaluate_model
    from workloads.export.fp8_block import load_fp8_checkpoint

    started = time.perf_counter()
    fp8 = "quantization_config" in json.loads((folder / "config.json").read_text())
    model = (load_fp8_checkpoint(folder) if fp8
             else AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval())
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    loaded = time.perf_counter()
    out = evaluate_model(model, tokenizer, task=task, batch_size=batch_size, limit=limit)
    return {"accuracy": out["accuracy"], "accuracy_stderr": out["accuracy_stderr"], "n": out["n"],
            "load_s": loaded - started, "eval_s": time.perf_counter() - loaded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_id")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--export", type=Path, help="an existing fp8-block128 export of RUN_ID (default: export now)")
    parser.add_argument("--task", help="the lm-eval task (default: the trial's, from its eval/<task>/acc metric)")
    parser.add_argument("--partial-blocks", action="store_true", help="export with --partial-blocks (SmolLM2)")
    parser.add_argument("--merged", action="store_true",
                        help="also score the merged BF16 export, to tell the export's rounding from the forward's")
    parser.add_argument("--max-diff-pts", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "export_check.json")
    args = parser.parse_args(argv)

    from workloads.export.run import export_run
    from workloads.record.store import store_client

    run = store_client(args.tracking_uri).get_run(args.run_id)
    trial_accuracy = run.data.metrics["eval/accuracy"]
    task = args.task or next(key.split("/")[1] for key in sorted(run.data.metrics)
                             if key.count("/") == 2 and key.startswith("eval/") and key.endswith("/acc"))
    limit_param = run.data.params.get("eval.limit", "None")
    limit = None if limit_param in ("None", "null", "") else int(limit_param)  # the trial's own items
    with tempfile.TemporaryDirectory(prefix="fp8lab-export-check-") as scratch:
        folder = args.export
        notes: tuple[str, ...] = ()
        if folder is None:
            result = export_run(args.tracking_uri, args.run_id, "fp8-block128", Path(scratch) / "fp8", args.partial_blocks)
            folder, notes = result.out_dir, result.notes
            print(result.summary())
        scored = score_folder(folder, task, args.batch_size, limit)
        merged = None
        if args.merged:  # the same adapter merged in BF16: what serving it without FP8 rounding gives
            export_run(args.tracking_uri, args.run_id, "merged", Path(scratch) / "merged")
            merged = score_folder(Path(scratch) / "merged", task, args.batch_size, limit)
    diff_pts = 100 * (scored["accuracy"] - trial_accuracy)
    passed = abs(diff_pts) <= args.max_diff_pts
    report = {"run_id": args.run_id, "run_name": run.data.tags.get("mlflow.runName"), "task": task,
              "trial_accuracy": trial_accuracy, "export": scored, "diff_pts": diff_pts,
              "max_diff_pts": args.max_diff_pts, "passed": passed, "notes": list(notes), "merged_bf16": merged,
              "eval_limit": limit, "machine": machine(), "environment": common.environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['run_name']}: trial {100 * trial_accuracy:.2f}%, fp8-block128 export (BF16-decoded, CPU) "
          f"{100 * scored['accuracy']:.2f}% ({scored['n']} items): {diff_pts:+.2f} pts "
          f"({'within' if passed else 'OUTSIDE'} {args.max_diff_pts:g}); written {args.out}")
    if merged:
        print(f"  the merged BF16 export of the same adapter: {100 * merged['accuracy']:.2f}% "
              f"(fp8-block128 minus merged: {100 * (scored['accuracy'] - merged['accuracy']):+.2f} pts: the export's "
              "own rounding; merged minus trial: the trial's forward vs a BF16 forward)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
