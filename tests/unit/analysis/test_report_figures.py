"""analysis.figures and analysis.render on small in-memory inputs: empty data, bad data, valid PNGs."""

from __future__ import annotations

import pandas as pd

from analysis.figures import FigureArtifact, all_figures, underflow_heatmaps
from analysis.options import ReportOptions
from analysis.render import Bullets, Document, Heading, Image, Para, Table, to_html, to_markdown
from analysis.summary import build_summary
from tests.support.synthetic import SynthTrial, telemetry_frame
from analysis.tidy import dedupe_trials, tidy_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trials() -> pd.DataFrame:
    rows = []
    for i, (policy, acc) in enumerate([("bf16", 0.8), ("bf16", 0.82), ("fp8_naive", 0.6), ("fp8_naive", 0.62)]):
        rows.append(
            {
                "run_id": f"r{i}",
                "mlflow_status": "FINISHED",
                "tags.fp8lab.policy": policy,
                "tags.fp8lab.seed": str(i % 2),
                "metrics.eval/accuracy": acc,
                "metrics.train/tokens_per_s": 100.0 + i,
                "metrics.memory/peak_bytes": 1e9,
            }
        )
    return dedupe_trials(tidy_runs(pd.DataFrame(rows)))[0]


def test_empty_inputs_give_no_figures() -> None:
    trials = _trials()
    summary = build_summary(trials, ReportOptions())
    figs = all_figures(trials, summary, pd.DataFrame(), pd.DataFrame(), ReportOptions())
    assert [f.name for f in figs] == ["quality_vs_throughput", "memory"]  # no history, no telemetry
    assert all(f.png.startswith(PNG_MAGIC) for f in figs)
    assert all_figures(trials.iloc[:0], summary.iloc[:0], pd.DataFrame(), pd.DataFrame(), ReportOptions()) == []


def test_heatmap_from_telemetry_frame() -> None:
    trials = _trials()
    tel = pd.concat(
        [telemetry_frame(SynthTrial("fp8_naive", s), 20, 3, 5).assign(run_id=f"r{2 + s}") for s in range(2)]
    )
    figs = underflow_heatmaps(trials, tel, ReportOptions())
    assert [f.name for f in figs] == ["underflow_fp8_naive"] and figs[0].png.startswith(PNG_MAGIC)


def test_broken_telemetry_is_a_warning_not_a_crash() -> None:
    trials = _trials()
    summary = build_summary(trials, ReportOptions())
    bad = pd.DataFrame({"run_id": ["r2"], "step": [0], "layer": ["l0"], "kind": ["weight"], "underflow_pct": ["x%"]})
    warnings: list[str] = []
    figs = all_figures(trials, summary, pd.DataFrame(), bad, ReportOptions(), warnings)
    assert {f.name for f in figs} == {"quality_vs_throughput", "memory"}
    assert any("fp8_naive could not be drawn" in w for w in warnings)


def test_markdown_and_html_render_the_same_blocks() -> None:
    fig = FigureArtifact("f1", "A <figure>", "caption with `code`", PNG_MAGIC + b"rest")
    doc = Document(
        "T | 1",
        [
            Heading("Sec"),
            Para("**bold** and `x<y`", "warning"),
            Bullets(["a", "b|c"]),
            Table(pd.DataFrame({"col|1": ["v|1", "<b>"]}), "cap"),
            Image(fig),
        ],
    )
    md = to_markdown(doc)
    assert "## Sec" in md and "> **Warning:** **bold**" in md and "| col\\|1 |" in md and "| v\\|1 |" in md
    assert "![A <figure>](figures/f1.png)" in md
    html = to_html(doc)
    assert "<strong>bold</strong>" in html and "<code>x&lt;y</code>" in html and "<td>&lt;b&gt;</td>" in html
    assert 'src="data:image/png;base64,iVBORw0KGgpyZXN0"' in html and 'alt="A &lt;figure&gt;"' in html
