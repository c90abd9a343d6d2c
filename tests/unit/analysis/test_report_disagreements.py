"""The report lists the items where a policy and bf16 disagree, with prompt, target and both
answers (`disagreements.csv` has every one); stores whose samples hold only scores still list them."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis import ReportOptions, generate_report
from analysis.disagreements import disagreements
from tests.support.synthetic import SynthTrial, write_sweep

TASK = "fp8lab_embedded"
BF16 = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
FP8 = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # item 1: bf16 right; item 4: fp8 right; item 2: both wrong


def _text(answers: list[str]) -> list[dict]:
    return [{"prompt": f"Which number is the largest: item {i}?\nAnswer:", "target": "1", "gold": f"g{i}",
             "response": a} for i, a in enumerate(answers)]


def _trials(with_text: bool) -> list[SynthTrial]:
    bf16 = ["g0", "g1", "x2", "g3", "y4", "g5"]
    fp8 = ["g0", "z1", "w2", "g3", "g4", "g5"]  # item 2: another wrong answer
    return [SynthTrial(policy, seed, accuracy=sum(values) / 6, samples={TASK: values},
                       sample_text={TASK: _text(answers)} if with_text else {})
            for seed in (0, 1) for policy, values, answers in (("bf16", BF16, bf16), ("fp8_naive", FP8, fp8))]


@pytest.mark.parametrize("with_text", [True, False], ids=["answers", "old-store"])
def test_report_lists_the_items_a_policy_and_bf16_disagree_on(tmp_path: Path, with_text: bool) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_sweep(uri, "exp", "sweep1", _trials(with_text))
    result = generate_report(tracking_uri=uri, experiment="exp", sweep_id="sweep1", all_runs=False, out_dir=tmp_path / "report",
                             options=ReportOptions(log_to_mlflow=False))
    assert result.disagreements_csv is not None and result.disagreements_csv in result.paths
    found = pd.read_csv(result.disagreements_csv, keep_default_na=False)
    expected = {(1, "baseline right"), (4, "policy right")} | ({(2, "another answer")} if with_text else set())
    assert set(zip(found["doc_id"], found["kind"])) == expected and set(found["seed"]) == {0, 1}
    markdown = result.report_md.read_text()
    assert "## Items where a policy and bf16 disagree" in markdown
    if with_text:
        row = found[(found["doc_id"] == 1) & (found["seed"] == 0)].iloc[0]
        assert (row["target"], row["baseline_response"], row["policy_response"]) == ("g1", "g1", "z1")
        assert "item 1? Answer:" in markdown and "| z1 |" in markdown
    else:
        assert set(found["policy_response"]) == {""} and "| wrong |" in markdown


def test_no_samples_no_section() -> None:
    trials = pd.DataFrame({"run_id": ["a", "b"], "policy": ["bf16", "fp8_naive"], "seed": [0, 0], "counted": [True, True]})
    assert disagreements(trials, pd.DataFrame(), "bf16").empty
