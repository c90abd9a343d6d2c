"""workloads.eval.harness.evaluate_tasks: several lm-eval tasks of every output type in one call,
on the embedded model, with task YAMLs and data the tests write themselves."""
from __future__ import annotations

import json
import math

import lm_eval
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.unit.workloads.eval.eval_task_files import GEN, MC, PPL, write_tasks
from workloads.eval.metrics import primary_figure
from workloads.eval.harness import evaluate_tasks
from workloads.embedded.paths import embedded_paths


@pytest.fixture(scope="module")
def tiny():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: one thread is as fast, and immune to oversubscription
    tokenizer = AutoTokenizer.from_pretrained(embedded_paths().model_dir)
    model = AutoModelForCausalLM.from_pretrained(embedded_paths().model_dir, dtype=torch.bfloat16)
    yield model, tokenizer
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("eval_tasks"))


@pytest.fixture(scope="module")
def three(tiny, task_dir):
    model, tokenizer = tiny
    return evaluate_tasks(model, tokenizer, [MC, GEN, PPL], include_path=task_dir, batch_size=8)


def test_multiple_choice_reports_acc_and_acc_norm(three):
    mc = three["tasks"][MC]
    assert mc["primary"] == "acc" and mc["n"] == 6 and mc["higher_is_better"]
    assert set(mc["metrics"]) == {f"eval/{MC}/acc", f"eval/{MC}/acc_stderr", f"eval/{MC}/acc_norm", f"eval/{MC}/acc_norm_stderr"}
    assert mc["value"] > 0.8  # counting is in the pretraining corpus: far above 25% chance
    assert [r["doc_id"] for r in mc["samples"]] == list(range(6))
    assert sum(r["value"] for r in mc["samples"]) / 6 == pytest.approx(mc["value"])


def test_generate_until_scores_through_the_tasks_filters(three):
    """Strict match takes the first number generated (the next count), flexible the last one:
    lm-eval's regex filters give them different scores on the same generations."""
    gen = three["tasks"][GEN]
    assert gen["primary"] == "exact_match.strict-match"  # first metric, first filter of the YAML
    strict = gen["metrics"][f"eval/{GEN}/exact_match.strict-match"]
    flexible = gen["metrics"][f"eval/{GEN}/exact_match.flexible-extract"]
    assert f"eval/{GEN}/exact_match.flexible-extract_stderr" in gen["metrics"]
    assert strict == gen["value"] > 0.8 and flexible < strict
    assert {r["metric"] for r in gen["samples"]} == {"exact_match.strict-match"}
    assert len(gen["samples"]) == 6  # one row per document, not one per filter
    assert sum(r["value"] for r in gen["samples"]) / 6 == pytest.approx(strict)


def test_loglikelihood_rolling_reports_perplexities(three):
    ppl = three["tasks"][PPL]
    assert ppl["primary"] == "word_perplexity" and not ppl["higher_is_better"]
    assert {f"eval/{PPL}/word_perplexity", f"eval/{PPL}/byte_perplexity", f"eval/{PPL}/bits_per_byte"} <= set(ppl["metrics"])
    assert 1.0 < ppl["value"] < 1000.0
    items = [r["value"] for r in ppl["samples"]]
    assert len(items) == 6 and all(math.isfinite(v) and v > 1.0 for v in items)
    # the corpus perplexity is a word-weighted geometric mean of the items': between their extremes
    assert min(items) <= ppl["value"] <= max(items)


def test_primary_figure_and_results_json(three):
    tasks = {k: three["tasks"][k] for k in (MC, GEN)}
    mean, stderr = primary_figure(tasks, "mean")
    assert mean == pytest.approx((tasks[MC]["value"] + tasks[GEN]["value"]) / 2)
    assert primary_figure(tasks, GEN) == (tasks[GEN]["value"], tasks[GEN]["stderr"])
    with pytest.raises(ValueError, match="lower-is-better"):
        primary_figure(three["tasks"], "mean")
    results = three["results"]
    json.dumps(results)
    assert set(results["results"]) == {MC, GEN, PPL} and "samples" not in results


def test_fewshot_and_chat_template_reach_lm_eval(tiny, task_dir, monkeypatch):
    """The prompts lm-eval built carry the chat template, the system instruction and two shots."""
    model, tokenizer = tiny
    seen = {}
    real = lm_eval.simple_evaluate

    def spy(**kwargs):
        seen["out"] = real(**kwargs)
        return seen["out"]

    monkeypatch.setattr(lm_eval, "simple_evaluate", spy)
    chat = tokenizer.__class__.from_pretrained(embedded_paths().model_dir)
    chat.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    out = evaluate_tasks(model, chat, [MC], include_path=task_dir, limit=2, num_fewshot=2,
                         apply_chat_template=True, fewshot_as_multiturn=True, system_instruction="Be exact.")
    assert out["tasks"][MC]["n"] == 2 and out["results"]["n-shot"][MC] == 2
    prompt = seen["out"]["samples"][MC][0]["arguments"][0][0]
    assert prompt.startswith("<system>Be exact.\n") and prompt.count("<user>") == 3 and "<assistant>" in prompt


class _Recorder:
    """Stands in for MlflowTrialLogger under the TrialRecorder: what the trial writes to its run."""

    def __init__(self):
        self.tags, self.files = {}, {}

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_text(self, text, path):
        self.files[path] = text

    def log_dict(self, data, path):
        self.files[path] = json.dumps(data)


def test_trial_evaluation_names_metrics_and_writes_samples(tiny, task_dir):
    """The trial's eval step: eval/accuracy is the named task's primary, every task's metrics are
    logged (under eval/base/ before training), samples and tags go to the run."""
    from workloads.eval.metrics import eval_aggregate
    from workloads.eval.score import score_tasks
    from workloads.record.recorder import TrialRecorder

    model, tokenizer = tiny
    ev = {"task": None, "tasks": [MC, GEN], "metrics": None, "primary": GEN, "include_path": str(task_dir),
          "limit": 3, "batch_size": 8, "num_fewshot": None, "apply_chat_template": False,
          "fewshot_as_multiturn": False, "system_instruction": None}
    config = {"eval": ev, "data": {"path": "embedded"}}
    recorder = _Recorder()
    final, out = score_tasks(model, tokenizer, config["eval"], config["data"]["path"], torch.device("cpu"))
    TrialRecorder("unused", "run", logger=recorder).eval(out, eval_aggregate(config["eval"]))
    assert final["eval/accuracy"] == final[f"eval/{GEN}/exact_match.strict-match"] and final["eval/n"] == 6
    assert {f"eval/{MC}/acc", f"eval/{MC}/acc_norm", f"eval/{GEN}/exact_match.flexible-extract"} <= set(final)
    assert json.loads(recorder.tags["fp8lab.eval_primary"]) == {MC: "acc", GEN: "exact_match.strict-match"}
    assert recorder.tags["fp8lab.eval_aggregate"] == GEN
    assert set(recorder.files) == {f"eval/samples/{MC}.jsonl", f"eval/samples/{GEN}.jsonl", "eval/results.json"}
    assert len(recorder.files[f"eval/samples/{GEN}.jsonl"].splitlines()) == 3
    base, _ = score_tasks(model, tokenizer, config["eval"], config["data"]["path"], torch.device("cpu"), prefix="eval/base_")
    assert "eval/base_accuracy" in base and f"eval/base/{MC}/acc" in base and not any(k.startswith("eval/tiny") for k in base)
