"""The report's evidence end to end: per-item samples, several tasks, the mechanism ladder, backend
deviations, runs overruled in MLflow and lost metrics — on a real SQLite store with known values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import ReportOptions, generate_report
from analysis.compare import Evidence
from analysis.summary import build_summary, verdict_lines
from tests.support.synthetic import SynthTrial, write_sweep
from analysis.tidy import dedupe_trials, tidy_runs

N_ITEMS = 400
SEEDS = (0, 1, 2)
TASK, TASK2 = "fp8lab_embedded", "gsm8k_tiny"
DEVIATION = "torchao runs rowwise scaling instead of 128-blocks; E4M3 gradients"


def _items(seed: int, p: float, key: int) -> np.ndarray:
    return (np.random.default_rng(1000 * key + seed).random(N_ITEMS) < p).astype(float)


def _bf16(seed: int) -> np.ndarray:
    return _items(seed, 0.8, 1)


def _close_to_bf16(seed: int) -> np.ndarray:
    v = _bf16(seed).copy()
    v[seed * 3 : seed * 3 + 2] = 1 - v[seed * 3 : seed * 3 + 2]  # two items answered differently
    return v


def _trial(policy: str, seed: int, items: np.ndarray, second: np.ndarray | None = None, **kw) -> SynthTrial:
    acc = float(items.mean())
    samples = {TASK: items.tolist()}
    metrics = {
        f"eval/{TASK}/acc": acc,
        f"eval/{TASK}/acc_stderr": float(np.sqrt(acc * (1 - acc) / N_ITEMS)),
        "eval/accuracy_stderr": float(np.sqrt(acc * (1 - acc) / N_ITEMS)),
        "eval/n": float(N_ITEMS),
    }
    if second is not None:
        samples[TASK2] = second.tolist()
        metrics[f"eval/{TASK2}/exact_match_strict-match"] = float(second.mean())
    metrics.update(kw.pop("metrics", {}))
    return SynthTrial(policy, seed, accuracy=acc, samples=samples, metrics=metrics, **kw)


def _ladder(direction: str, base: str, mech: str, desc: str) -> dict[str, str]:
    return {"fp8lab.ladder": direction, "fp8lab.ladder_base": base, "fp8lab.mechanism": mech,
            "fp8lab.mechanism_desc": desc}  # fmt: skip


FROZEN = {
    "train/lora_weight_std_min": 0.0,
    "telemetry/dgrad/underflow_pct": 27.5,
    "telemetry/wgrad/underflow_pct": 3.0,
    "telemetry/activation/underflow_pct": 0.1,
    "telemetry/activation/overflow_pct": 0.0,
}


def evidence_trials() -> list[SynthTrial]:
    out = []
    for s in SEEDS:
        gsm = _items(s, 0.3, 7)
        out.append(_trial("bf16", s, _bf16(s), gsm))
        out.append(_trial("fp8_protected", s, _close_to_bf16(s), gsm, tags={"fp8lab.deviations": DEVIATION}))
        out.append(_trial("fp8_naive", s, _items(s, 0.19, 2), _items(s, 0.05, 8), metrics=FROZEN))
        up = _ladder("up", "fp8_naive", "fp32_master", "LoRA adapters keep FP32 master weights")
        out.append(_trial("fp8_naive+fp32_master", s, _close_to_bf16(s), gsm, tags=up))
        for mech in ("no_calibration", "no_block_scales"):
            down = _ladder("down", "fp8_protected", mech, f"{mech} removed")
            out.append(_trial(f"fp8_protected-{mech}", s, _close_to_bf16(s), gsm, tags=down))
    # someone marked a finished bf16 run FAILED in MLflow: not a result
    out.append(_trial("bf16", 3, np.ones(N_ITEMS), mlflow_status="FAILED"))
    # a finished fp8_protected seed whose metrics were lost: disclosed, not silently dropped
    out.append(SynthTrial("fp8_protected", 3, accuracy=None))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("evidence")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    write_sweep(uri, "exp-ev", "sw-ev", evidence_trials(), n_steps=4, per_step_metrics=1, telemetry=False)
    r = generate_report(uri, "exp-ev", "sw-ev", False, root / "out", ReportOptions(log_to_mlflow=False))
    return r, pd.read_csv(r.summary_csv).set_index("policy"), r.report_md.read_text()


def test_paired_comparison_uses_items_and_seeds(report) -> None:
    _, s, md = report
    prot = s.loc["fp8_protected"]
    assert prot["method"] == "seeds x items t" and bool(prot["paired_seeds"]) and prot["items"] == N_ITEMS
    expected = np.mean([_close_to_bf16(k).mean() - _bf16(k).mean() for k in SEEDS]) * 100
    assert prot["delta_pts"] == pytest.approx(expected)
    assert bool(prot["equivalent"]) and -2 < prot["tost_low"] and prot["tost_high"] < 2
    assert "fp8_protected: as good as bf16 within ±2 points" in md
    assert "seeds x items t over 3 seed(s) x 400 items" in md


def test_equivalence_needs_the_interval_inside_the_margin(report) -> None:
    """The same runs without per-item results: binomial noise is too wide for the 2-point margin."""
    trials = dedupe_trials(tidy_runs(_raw(evidence_trials())))[0]
    with_items = build_summary(trials, ReportOptions(), evidence=Evidence.of(_samples(evidence_trials())))
    without = build_summary(trials, ReportOptions())
    a, b = (f.set_index("policy").loc["fp8_protected"] for f in (with_items, without))
    assert a["method"] == "seeds x items t" and bool(a["equivalent"])
    assert b["method"] == "binomial + seeds" and not b["equivalent"]
    assert not (-2 < b["tost_low"] and b["tost_high"] < 2)  # the interval is not inside the margin
    assert b["delta_high"] - b["delta_low"] > 3 * (a["delta_high"] - a["delta_low"])


def test_naive_verdict_names_mechanism_and_recovering_rung(report) -> None:
    _, s, md = report
    assert bool(s.loc["fp8_naive", "significant"]) and s.loc["fp8_naive", "delta_pts"] < -50
    line = next(x for x in md.splitlines() if x.startswith("- fp8_naive:"))
    assert "adapters frozen at init" in line and "underflow at the end of training: dgrad 27.5%, wgrad 3.0%" in line
    assert "no saturation" in line
    assert "adding fp32_master (LoRA adapters keep FP32 master weights) recovers" in line


def test_shares_that_sum_to_zero_are_noticed(report) -> None:
    r, _, md = report
    abl = pd.read_csv(r.ablations_csv).set_index("mechanism")
    assert set(abl.index) == {"fp32_master", "no_calibration", "no_block_scales"}
    assert abs(abl.loc["no_calibration", "share_of_gap"]) < 0.05
    assert abl.loc["fp32_master", "share_of_gap"] > 0.9 and abl.loc["fp32_master", "method"] == "seeds x items t"
    assert (abl["p_holm"] >= abl["p"]).all() and (abl["holm_m"] == 3).all()
    assert "none of these switches explains the gap" in md
    assert "adding fp32_master alone to fp8_naive recovers" in md


def test_deviations_in_row_and_verdict(report) -> None:
    _, s, md = report
    assert s.loc["fp8_protected", "deviations"] == DEVIATION
    line = next(x for x in md.splitlines() if x.startswith("- fp8_protected:"))
    assert "backend changed the policy: " + DEVIATION in line
    assert "| backend deviations |" in md.replace("backend deviations |", "backend deviations |")


def test_failed_in_mlflow_and_lost_metrics(report) -> None:
    r, s, md = report
    assert s.loc["bf16", "n_seeds"] == 3 and s.loc["bf16", "n_failed"] == 1  # the 100% run is not counted
    assert s.loc["bf16", "acc_mean"] == pytest.approx(np.mean([_bf16(k).mean() for k in SEEDS]) * 100)
    assert "marked FAILED in MLflow" in md
    assert float(s.loc["fp8_protected", "missing_acc_seeds"]) == 3
    assert "FINISHED seed(s) 3 logged no `eval/accuracy`" in md


def test_a_column_per_task(report) -> None:
    _, s, md = report
    col = f"task.{TASK2}/exact_match_strict-match"
    assert s.loc["bf16", f"{col}.mean"] == pytest.approx(np.mean([_items(k, 0.3, 7).mean() for k in SEEDS]) * 100)
    assert s.loc["fp8_protected", f"{col}.delta"] == pytest.approx(0.0)
    assert s.loc["fp8_naive", f"{col}.method"] == "seeds x items t"
    header = next(x for x in md.splitlines() if x.startswith("| configuration | seeds | accuracy %"))
    assert f"| {TASK}/acc |" in header and f"| {TASK2}/exact_match_strict-match |" in header


def _raw(trials: list[SynthTrial]) -> pd.DataFrame:
    """The raw search_runs-style frame of synthetic trials, without MLflow."""
    rows = []
    for i, t in enumerate(trials):
        mlflow_status = t.mlflow_status or "FINISHED"
        row = {"run_id": f"r{i}", "run_name": t.run_name(), "mlflow_status": mlflow_status, "start_time": i,
               "tags.fp8lab.policy": t.policy, "tags.fp8lab.seed": str(t.seed), "tags.fp8lab.status": t.status,
               "tags.fp8lab.trial_id": t.resolved_trial_id(), **{f"tags.{k}": v for k, v in t.tags.items()},
               **{f"metrics.{k}": v for k, v in t.metrics.items()}}  # fmt: skip
        if t.accuracy is not None:
            row["metrics.eval/accuracy"] = t.accuracy
        rows.append(row)
    return pd.DataFrame(rows)


def _samples(trials: list[SynthTrial]) -> pd.DataFrame:
    parts = [
        pd.DataFrame({"run_id": f"r{i}", "task": task, "doc_id": np.arange(len(v)), "metric": "acc", "value": v})
        for i, t in enumerate(trials)
        for task, v in t.samples.items()
    ]
    return pd.concat(parts, ignore_index=True)


def test_report_on_40_runs_x_400_items_takes_seconds(tmp_path: Path) -> None:
    """Speed of the statistics alone (no MLflow): 8 policies x 5 seeds x 400 items."""
    import time

    trials = [
        _trial(p, s, _items(s, 0.5 + 0.05 * k, k))
        for k, p in enumerate(["bf16", "fp8_naive", "fp8_protected", *[f"fp8_protected-x{j}" for j in range(5)]])
        for s in range(5)
    ]
    trials = [t if "-x" not in t.policy else SynthTrial(**{**t.__dict__, "ablation": t.policy[-2:]}) for t in trials]
    tidy = dedupe_trials(tidy_runs(_raw(trials)))[0]
    ev = Evidence.of(_samples(trials))
    t0 = time.perf_counter()
    s = build_summary(tidy, ReportOptions(), evidence=ev)
    assert (s.loc[s["policy"] != "bf16", "method"] == "seeds x items t").all()
    assert time.perf_counter() - t0 < 20.0


def test_aggregate_that_is_the_mean_of_two_tasks_is_paired_on_both() -> None:
    trials = []
    for s in SEEDS:
        for policy, a, b in (("bf16", _bf16(s), _items(s, 0.3, 7)), ("fp8_protected", _close_to_bf16(s), _items(s, 0.3, 7))):
            t = _trial(policy, s, a, b)
            trials.append(SynthTrial(**{**t.__dict__, "accuracy": (a.mean() + b.mean()) / 2}))  # eval.primary=mean
    tidy = dedupe_trials(tidy_runs(_raw(trials)))[0]
    s = build_summary(tidy, ReportOptions(), evidence=Evidence.of(_samples(trials))).set_index("policy")
    prot = s.loc["fp8_protected"]
    assert prot["method"] == "seeds x items t" and prot["items"] == 2 * N_ITEMS
    expected = np.mean([(_close_to_bf16(k).mean() - _bf16(k).mean()) / 2 for k in SEEDS]) * 100
    assert prot["delta_pts"] == pytest.approx(expected)
    assert f"task.{TASK2}/exact_match_strict-match.mean" in s.columns


def test_malformed_sample_lines_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from analysis.load import read_samples

    path = tmp_path / "t.jsonl"
    path.write_text('{"doc_id": 0, "metric": "acc", "value": 1.0}\nnot json\n{"doc_id": 1}\n\n'
                    '{"doc_id": "2", "metric": "acc", "value": 0}\n', encoding="utf-8")  # fmt: skip
    frame = read_samples(path)
    assert frame["doc_id"].tolist() == [0, 2] and frame["value"].tolist() == [1.0, 0.0]
    assert "2 malformed line(s) skipped" in caplog.text


def test_identical_answers_on_40_items_are_not_called_equivalent() -> None:
    """`experiment=quick` after 20 steps: every policy still answers like the base model (2 seeds x 40 items)."""
    answers = (np.random.default_rng(5).random(40) < 0.19).astype(float)
    trials = [
        SynthTrial(p, s, accuracy=float(answers.mean()), samples={TASK: answers.tolist()},
                   metrics={f"eval/{TASK}/acc": float(answers.mean())})
        for p in ("bf16", "fp8_naive") for s in (0, 1)
    ]  # fmt: skip
    tidy = dedupe_trials(tidy_runs(_raw(trials)))[0]
    options = ReportOptions()
    s = build_summary(tidy, options, evidence=Evidence.of(_samples(trials)))
    naive = s.set_index("policy").loc["fp8_naive"]
    assert naive["method"] == "seeds x items t" and naive["discordant"] == 0 and naive["delta_pts"] == 0.0
    assert not naive["equivalent"] and not naive["significant"] and naive["tost_p"] > 0.2
    line = next(x for x in verdict_lines(s, options) if x.startswith("fp8_naive"))
    assert "not distinguishable" in line and "x 40 items (0 discordant)" in line and "as good as" not in line


def test_an_equivalence_at_two_seeds_is_only_provisional() -> None:
    """2 seeds x 2000 items, 1 item answered differently per seed: equivalent within ±2 points,
    but the seed noise rests on 1 df, so the verdict says "provisionally" and how many seeds."""
    answers = (np.random.default_rng(9).random(2000) < 0.9).astype(float)
    trials = []
    for p in ("bf16", "fp8_naive"):
        for s in (0, 1):
            a = answers.copy()
            if p == "fp8_naive":
                a[s] = 1.0 - a[s]
            trials.append(SynthTrial(p, s, accuracy=float(a.mean()), samples={TASK: a.tolist()},
                                     metrics={f"eval/{TASK}/acc": float(a.mean())}))  # fmt: skip
    tidy = dedupe_trials(tidy_runs(_raw(trials)))[0]
    options = ReportOptions()
    s = build_summary(tidy, options, evidence=Evidence.of(_samples(trials)))
    naive = s.set_index("policy").loc["fp8_naive"]
    assert bool(naive["equivalent"]) and naive["discordant"] == 2
    line = next(x for x in verdict_lines(s, options) if x.startswith("fp8_naive"))
    assert "provisionally as good as bf16 (2 seeds) within ±2 points" in line
    assert "fp8_naive: as good as" not in line
