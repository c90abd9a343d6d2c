"""generate_report against a real SQLite MLflow store with synthetic sweeps of known values."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _report_data import MAIN, NAIVE_DIVERGED, PARAMS
from mlflow.tracking import MlflowClient
from scipy import stats as st

from analysis import ReportError, ReportOptions, generate_report
from analysis.__main__ import main as cli_main


@pytest.fixture(scope="module")
def summary(main_report) -> pd.DataFrame:
    return pd.read_csv(main_report.summary_csv).set_index("policy")


def test_default_picks_latest_sweep_and_writes_everything(main_report, store) -> None:
    r = main_report
    assert r.sweep_ids == ("sw-main",) and r.experiment == "exp-a" and r.parent_run_id == store.main_parent
    for p in r.paths:
        assert p.is_file() and p.stat().st_size > 0, p
    names = {p.name for p in r.figures}
    assert {"quality_vs_throughput.png", "loss_curves.png", "memory.png"} <= names
    # one heatmap and one amax figure per FP8 policy (naive, protected, two ablations), none for bf16
    assert sum(n.startswith("underflow_") for n in names) == 4 and sum(n.startswith("amax_") for n in names) == 4
    assert not any("bf16" in n for n in names if n.startswith(("underflow_", "amax_")))
    assert not list(r.out_dir.rglob(".*.tmp"))  # atomic writes leave no temp files


def test_counts_retries_once_and_lists_incomplete(main_report) -> None:
    # 5 policies x 3 seeds + naive diverged + naive failed + protected killed = 18 trials; 2 retries superseded
    assert main_report.n_runs == 18 and main_report.n_mlflow_runs == 20
    assert main_report.n_counted == 16


def test_summary_numbers_match_hand_computation(summary: pd.DataFrame) -> None:
    base = np.array(MAIN["bf16"]["acc"]) * 100
    assert summary.loc["bf16", "n_seeds"] == 3 and summary.loc["bf16", "n_superseded"] == 2
    assert summary.loc["bf16", "acc_mean"] == pytest.approx(base.mean())  # retry 0.50 not used, FAILED retry not
    naive = np.array(MAIN["fp8_naive"]["acc"] + [NAIVE_DIVERGED["acc"]]) * 100
    row = summary.loc["fp8_naive"]
    assert row["n_seeds"] == 4 and row["n_failed"] == 1 and row["n_diverged"] == 1
    lo, hi = st.t.interval(0.95, 3, loc=naive.mean(), scale=st.sem(naive))
    assert (row["acc_mean"], row["acc_low"], row["acc_high"]) == pytest.approx((naive.mean(), lo, hi))
    ref = st.ttest_ind(naive, base, equal_var=False)
    assert row["p"] == pytest.approx(ref.pvalue) and row["method"] == "binomial + seeds"  # no stderr: Welch
    others = summary[summary.index != "bf16"]
    assert row["p_holm"] == pytest.approx(min(1.0, max(
        p * (len(others) - i) for i, p in enumerate(sorted(others["p"])) if p <= row["p"]
    )))  # fmt: skip
    assert bool(row["significant"]) == (row["p_holm"] < 0.05)
    # the final (whole-run) tokens/s, logged at step 0 after per-step readings of half that value
    assert summary.loc["bf16", "tps_mean"] == pytest.approx(np.mean(MAIN["bf16"]["tps"]))
    naive_tps = np.array(MAIN["fp8_naive"]["tps"] + [NAIVE_DIVERGED["tps"]])
    assert row["tps_ratio"] == pytest.approx(naive_tps.mean() / np.mean(MAIN["bf16"]["tps"]))
    prot = summary.loc["fp8_protected"]
    assert prot["n_incomplete"] == 1 and prot["n_seeds"] == 3
    assert prot["delta_pts"] == pytest.approx(-1.0)
    assert not prot["significant"]
    assert prot["mem_gib_mean"] == pytest.approx(np.mean(MAIN["fp8_protected"]["mem"]))
    tokens_epoch = PARAMS["data.train_size"] * PARAMS["train.max_seq_len"]
    bf = summary.loc["bf16"]
    tps = np.mean(MAIN["bf16"]["tps"])
    assert bf["tokens_per_epoch"] == tokens_epoch
    assert bf["cost_per_epoch"] == pytest.approx(2.5 * 1 / 0.8 * tokens_epoch / (tps * 3600))
    assert bf["cost_per_1m_tokens"] == pytest.approx(2.5 / 0.8 / (tps * 3600 / 1e6))


def test_report_mentions_failures_reasons_and_methods(main_report) -> None:
    md = main_report.report_md.read_text()
    assert NAIVE_DIVERGED["reason"] in md and "CUDA out of memory" in md
    assert "INCOMPLETE (MLflow KILLED)" in md
    assert "superseded" in md and "preempted" not in md.split("## Environment")[1]
    assert "Welch" in md and "delta-method" in md and "t-interval" in md
    assert "go back to BF16" in md
    assert "emulated FP8 — speed not representative of FP8 hardware" in md
    assert "2.13.0" in md and "abc1234" in md  # versions and git commit from the parent run
    for fig in main_report.figures:
        assert f"(figures/{fig.name})" in md
    assert "## Mechanisms: ladder and ablations" in md and "scaler" in md and "block_scales" in md


def test_html_is_self_contained(main_report) -> None:
    html = main_report.report_html.read_text()
    imgs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert len(imgs) == len(main_report.figures)
    assert all(src.startswith("data:image/png;base64,") for src in imgs)
    assert "<table>" in html and "</html>" in html
    assert not re.search(r'(src|href)="(?!data:|#)', html)  # nothing loaded from elsewhere


def test_ablations_csv(main_report) -> None:
    abl = pd.read_csv(main_report.ablations_csv).set_index("protection")
    prot = np.array(MAIN["fp8_protected"]["acc"]) * 100
    var = np.array(MAIN["fp8_protected-no_scaler"]["acc"]) * 100
    naive = np.array(MAIN["fp8_naive"]["acc"] + [NAIVE_DIVERGED["acc"]]) * 100
    assert abl.loc["scaler", "effect_pts"] == pytest.approx(prot.mean() - var.mean())
    assert abl.loc["scaler", "share_of_gap"] == pytest.approx((prot.mean() - var.mean()) / (prot.mean() - naive.mean()))
    assert abl.loc["block_scales", "effect_pts"] == pytest.approx(3.0)


def test_logged_to_parent_run(main_report, store) -> None:
    assert main_report.logged_to_run_id == store.main_parent
    client = MlflowClient(store.uri)
    top = {f.path for f in client.list_artifacts(store.main_parent, "report")}
    assert {"report/report.md", "report/report.html", "report/summary.csv", "report/runs.csv"} <= top
    figs = {f.path for f in client.list_artifacts(store.main_parent, "report/figures")}
    assert "report/figures/quality_vs_throughput.png" in figs


def test_a_relative_out_folder_is_logged_too(store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of a sweep passes a relative folder (fp8lab-report/<id>); the written files come back
    absolute, and logging must still find each one's place under report/."""
    from analysis import ReportOptions, generate_report

    monkeypatch.chdir(tmp_path)
    result = generate_report(store.uri, None, None, False, Path("rel-report"), ReportOptions())
    assert result.logged_to_run_id == store.main_parent and not any("not logged" in w for w in result.warnings)
    figs = {f.path for f in MlflowClient(store.uri).list_artifacts(store.main_parent, "report/figures")}
    assert "report/figures/quality_vs_throughput.png" in figs


def test_regeneration_overwrites_atomically(store, tmp_path: Path) -> None:
    opts = ReportOptions(log_to_mlflow=False, fetch_telemetry=False)
    first = generate_report(store.uri, "exp-a", "sw-main", False, tmp_path, opts)
    (tmp_path / "report.md").write_text("stale")
    second = generate_report(store.uri, "exp-a", "sw-main", False, tmp_path, opts)
    assert second.report_md.read_text().startswith("# fp8lab report")
    assert {p.name for p in first.paths} == {p.name for p in second.paths}
    assert second.logged_to_run_id is None
    assert not any(p.name.startswith("underflow_") for p in second.figures)  # telemetry skipped
    assert not list(tmp_path.rglob(".*.tmp"))


def test_mlflow_latest_would_hide_the_final_throughput(store, tmp_path: Path) -> None:
    """Why `final_from_history` exists: without it the last step's per-step reading is used."""
    opts = ReportOptions(final_from_history=(), log_to_mlflow=False, fetch_telemetry=False)
    r = generate_report(store.uri, "exp-a", "sw-main", False, tmp_path, opts)
    tps = pd.read_csv(r.summary_csv).set_index("policy").loc["bf16", "tps_mean"]
    assert tps == pytest.approx(0.5 * np.mean(MAIN["bf16"]["tps"]))


def test_regeneration_prunes_only_its_own_stale_files(main_report, store, tmp_path: Path) -> None:
    shutil.copytree(main_report.out_dir, tmp_path, dirs_exist_ok=True)  # a full report: heatmaps, ablations
    assert (tmp_path / "ablations.csv").is_file() and list((tmp_path / "figures").glob("underflow_*.png"))
    mine = tmp_path / "figures" / "my_notes.png"
    mine.write_bytes(b"not ours")
    small = generate_report(store.uri, None, "sw-axes", False, tmp_path, ReportOptions(log_to_mlflow=False))
    on_disk = {p for p in tmp_path.rglob("*") if p.is_file() and p.name != ".fp8lab-report.json"}
    assert on_disk == {*small.paths, mine}  # old heatmaps and ablations.csv gone, the user's file kept


def test_all_runs_pools_sweeps_and_does_not_log(store, tmp_path: Path) -> None:
    r = generate_report(store.uri, "exp-a", None, True, tmp_path, ReportOptions(fetch_telemetry=False))
    assert r.logged_to_run_id is None and r.parent_run_id is None
    assert set(r.sweep_ids) == {"sw-old", "sw-main"}
    # sw-old has bf16 s0 and fp8_naive s0 with the same trial ids as sw-main: counted once
    assert r.n_runs == 18 and r.n_mlflow_runs == 22
    assert "not logged to a parent run" in r.report_md.read_text()


def test_axes_sweep_by_id(store, tmp_path: Path) -> None:
    r = generate_report(store.uri, None, "sw-axes", False, tmp_path, ReportOptions(log_to_mlflow=False))
    s = pd.read_csv(r.summary_csv)
    assert s["group"].tolist() == [
        "bf16 [lora.r=8]",
        "fp8_protected [lora.r=8]",
        "bf16 [lora.r=16]",
        "fp8_protected [lora.r=16]",
    ]
    r16 = s.set_index("group").loc["fp8_protected [lora.r=16]"]
    assert r16["n_seeds"] == 1 and math.isnan(r16["p"]) and r16["delta_pts"] == pytest.approx(-1.0)
    md = r.report_md.read_text()
    assert "(1 seed, no CI)" in md and "no test" in md and "Low evidence" in md
    assert "env.json: device.cores: 2" in md and "env.json: versions.mlflow: 3.17.2" in md


def test_extended_sweep_includes_trials_reused_from_an_earlier_sweep(store, tmp_path: Path) -> None:
    r = generate_report(store.uri, "exp-c", "sw-ext", False, tmp_path, ReportOptions(log_to_mlflow=False))
    bf = pd.read_csv(r.summary_csv).set_index("policy").loc["bf16"]
    assert r.n_runs == 3 and bf["n_seeds"] == 3 and bf["acc_mean"] == pytest.approx(72.0)
    assert "2 trial(s) finished in an earlier sweep and were reused" in r.report_md.read_text()
    only_tagged = generate_report(store.uri, "exp-c", "sw-first", False, tmp_path, ReportOptions(log_to_mlflow=False))
    assert only_tagged.n_runs == 2


def test_user_errors_name_the_fix(store, tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"did you mean 'exp-a'.*--experiment"):
        generate_report(store.uri, "exp-aa", None, False, tmp_path, ReportOptions())
    with pytest.raises(ReportError, match=r"unknown sweep id 'sw-mian'.*did you mean 'sw-main'.*--sweep"):
        generate_report(store.uri, None, "sw-mian", False, tmp_path, ReportOptions())
    with pytest.raises(ReportError, match=r"no sweeps .* in experiment 'exp-empty'.*fp8lab sweep"):
        generate_report(store.uri, "exp-empty", None, False, tmp_path, ReportOptions())
    with pytest.raises(ReportError, match=r"experiment 'exp-empty' has no trial runs yet"):
        generate_report(store.uri, "exp-empty", None, True, tmp_path, ReportOptions())
    missing = tmp_path / "nowhere" / "mlflow.db"
    with pytest.raises(ReportError, match=r"no MLflow store at .*--tracking-uri"):
        generate_report(f"sqlite:///{missing}", None, None, False, tmp_path, ReportOptions())
    assert not missing.parent.exists()  # a report never creates a store
    with pytest.raises(ReportError, match="mutually exclusive"):
        generate_report(store.uri, None, "sw-main", True, tmp_path, ReportOptions())
    with pytest.raises(ReportError, match="utilization"):
        ReportOptions(utilization=0.0)
    with pytest.raises(ReportError, match="did you mean 'gpu_hour_price'"):
        ReportOptions.from_mapping({"gpu_price": 3})
    assert isinstance(ReportError("x"), ValueError)
    assert not list(tmp_path.iterdir())  # nothing written on error


def test_module_cli(store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(
        ["--tracking-uri", store.uri, "--sweep", "sw-axes", "--out", str(tmp_path), "--no-log", "--no-telemetry"]
    )
    assert rc == 0 and (tmp_path / "report.html").is_file()
    assert "report of" in capsys.readouterr().out
    rc = cli_main(["--tracking-uri", store.uri, "--sweep", "nope", "--out", str(tmp_path)])
    assert rc == 2 and "error: unknown sweep id" in capsys.readouterr().err


def test_options_from_mapping() -> None:
    o = ReportOptions.from_mapping(
        {"gpu_hour_price": 3.0, "utilization": 0.5, "n_gpu": 8, "tokens_per_epoch_params": ["a", "b"]}
    )
    assert (o.gpu_hour_price, o.utilization, o.n_gpu, o.tokens_per_epoch_params) == (3.0, 0.5, 8, ("a", "b"))
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create(
        {"report": {"gpu_hour_price": 4, "tokens_per_epoch_params": ["x", "y"], "out": None}}
    )
    o2 = ReportOptions.from_mapping(cfg.report, ignore=["out"])
    assert o2.gpu_hour_price == 4 and o2.tokens_per_epoch_params == ("x", "y")


def test_cost_uses_options(store, tmp_path: Path) -> None:
    opts = ReportOptions(gpu_hour_price=4.0, utilization=0.5, n_gpu=2, log_to_mlflow=False, fetch_telemetry=False)
    r = generate_report(store.uri, "exp-a", "sw-main", False, tmp_path, opts)
    bf = pd.read_csv(r.summary_csv).set_index("policy").loc["bf16"]
    tps = np.mean(MAIN["bf16"]["tps"])
    eff, tph = 4.0 * 2 / 0.5, tps * 3600 * 2
    assert bf["eff_cost_per_hour"] == pytest.approx(eff)
    assert bf["cost_per_1m_tokens"] == pytest.approx(eff / (tph / 1e6))
    assert bf["cost_per_epoch"] == pytest.approx(eff * PARAMS["data.train_size"] * PARAMS["train.max_seq_len"] / tph)
    assert "4.00 USD per GPU-hour, 2 GPU(s), target utilisation 50%" in r.report_md.read_text()
