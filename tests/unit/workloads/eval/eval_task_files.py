"""Tiny lm-eval tasks of each output type, written by the tests themselves (local JSONL, no hub).

Counting is in the embedded model's pretraining corpus, so it scores far above chance on these
in every output type: multiple-choice picks the next number, generation writes it, and the
rolling log-likelihood of a counting line is low."""
from __future__ import annotations

import json
from pathlib import Path

from workloads.eval.harness import embedded_paths

MC, GEN, PPL = "tiny_mc", "tiny_gen", "tiny_ppl"


def counting_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        start = 10 + 3 * i
        right = start + 4
        rows.append({"prompt": f"Count up from {start}: {start}, {start + 1}, {start + 2}, {start + 3},",
                     "choices": [str(right), str(right + 30), str(right - 9), str(right + 17)], "answer": 0,
                     "target": str(right), "text": ", ".join(str(start + k) for k in range(12))})
    return rows


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_tasks(root: Path, n: int = 6) -> Path:
    """A folder of three task YAMLs (pass as include_path): `tiny_mc` (multiple_choice: acc,
    acc_norm), `tiny_gen` (generate_until: exact_match under GSM8K-style strict / flexible
    regex filters), `tiny_ppl` (loglikelihood_rolling: perplexities)."""
    data = root / "data"
    rows = counting_rows(n)
    for split in ("train", "test"):
        _jsonl(data / f"{split}.jsonl", [{k: r[k] for k in ("prompt", "choices", "answer")} for r in rows])
    gen = _jsonl(root / "gen.jsonl", [{"question": r["prompt"], "answer": r["target"]} for r in rows])
    ppl = _jsonl(root / "ppl.jsonl", [{"text": r["text"]} for r in rows])
    tasks = root / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    template = embedded_paths().tasks_dir / "_fp8lab_mc.yaml"
    (tasks / f"{MC}.yaml").write_text(
        f"include: {template}\ntask: {MC}\nmetadata:\n  version: 1.0\n  data_dir: {data}\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n")
    (tasks / f"{GEN}.yaml").write_text(
        f"task: {GEN}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {gen}\n"
        "output_type: generate_until\ntest_split: test\n"
        "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "filter_list:\n"
        "  - name: strict-match\n    filter:\n      - function: regex\n        regex_pattern: '(\\d+)'\n"
        "      - function: take_first\n"
        "  - name: flexible-extract\n    filter:\n      - function: regex\n        group_select: -1\n"
        "        regex_pattern: '(\\d+)'\n      - function: take_first\n"
        "metadata:\n  version: 1.0\n")
    (tasks / f"{PPL}.yaml").write_text(
        f"task: {PPL}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {ppl}\n"
        "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n"
        + "".join(f"  - metric: {m}\n    aggregation: {a}\n    higher_is_better: false\n"
                  for m, a in (("word_perplexity", "weighted_perplexity"), ("byte_perplexity", "weighted_perplexity"),
                               ("bits_per_byte", "bits_per_byte")))
        + "metadata:\n  version: 1.0\n")
    return tasks
