"""What the telemetry figures say matches what they draw (issue 28, item 7): every layer row is
named, a panel of an uncast FP32 tensor does not claim to show an amax, and the caption names only
the FP8-max lines that are on the axes."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.figures import AMAX_XLABEL, amax_figure, _telemetry_by_group
from analysis.options import ReportOptions
from tests.unit.analysis.test_report_figures import _trials

N_LAYERS = 48  # more than the old 40-label limit: every second row lost its name


def _telemetry(amax_scale: float, kinds: tuple[str, ...] = ("activation", "weight", "lora_weight_std")) -> pd.DataFrame:
    rows = []
    for run in ("r2", "r3"):
        for step in (0, 2, 4):
            for layer in range(N_LAYERS):
                for kind in kinds:
                    rows.append({"run_id": run, "step": step, "layer": f"base_model.model.layers.{layer}.mlp.down_proj",
                                 "kind": kind, "amax": amax_scale * (1 + layer) * (1 + step),
                                 "underflow_pct": np.nan if kind == "lora_weight_std" else 1.0})
    return pd.DataFrame(rows)


def _figure(amax_scale: float):
    [(group, tel)] = list(_telemetry_by_group(_trials(), _telemetry(amax_scale), ReportOptions()))
    return amax_figure(group, tel, ReportOptions())


def test_every_layer_row_of_the_amax_plot_is_labelled() -> None:
    fig, _ = _figure(0.01)
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert len(labels) == N_LAYERS and all(labels), ax.get_title()
        assert labels[1] == "1.mlp.down_proj"


def test_uncast_lora_panel_is_not_labelled_amax() -> None:
    fig, _ = _figure(0.01)
    xlabels = {ax.get_title(): ax.get_xlabel() for ax in fig.axes}
    assert xlabels["activation"] == AMAX_XLABEL
    assert "amax" not in xlabels["lora_weight_std"] and "not cast" in xlabels["lora_weight_std"]


def _red_lines(fig) -> int:
    return sum(1 for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == ":")


def test_caption_promises_no_fp8_max_line_when_none_is_drawn() -> None:
    fig, caption = _figure(0.01)  # largest amax ~2.4: far below E4M3 max 448
    assert _red_lines(fig) == 0
    assert "No FP8-max line is drawn" in caption and "Red dotted" not in caption


def test_caption_names_the_lines_that_are_drawn() -> None:
    fig, caption = _figure(1.0)  # largest amax 240: within 10x of E4M3 max, far from E5M2's 57344
    assert _red_lines(fig) == 2  # E4M3 on the two cast panels, none on the uncast LoRA panel
    assert "E4M3 max" in caption and "E5M2" not in caption


def test_underflow_events_column_names_its_threshold() -> None:
    """0 events is right (no cast reached the 10% threshold) but read as 'no underflow' beside
    heatmaps of ~3%: the column must say what it counts."""
    from analysis.document import quality_table
    from analysis.summary import build_summary
    from analysis.tidy import dedupe_trials, tidy_runs

    rows = [{"run_id": f"r{i}", "mlflow_status": "FINISHED", "tags.fp8lab.policy": policy, "tags.fp8lab.seed": str(i % 2),
             "metrics.eval/accuracy": 0.8, "metrics.train/tokens_per_s": 100.0, "metrics.underflow/events": 0.0,
             "params.precision.telemetry.underflow_threshold_pct": "10.0"}
            for i, policy in enumerate(["bf16", "bf16", "fp8_naive", "fp8_naive"])]
    trials = dedupe_trials(tidy_runs(pd.DataFrame(rows)))[0]
    table = quality_table(build_summary(trials, ReportOptions()), ReportOptions())
    assert "underflow events (casts ≥10% flushed)" in table.columns
    assert "underflow events" not in table.columns
