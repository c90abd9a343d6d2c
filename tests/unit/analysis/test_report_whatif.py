"""The report section "What each recipe would do here", from what-if telemetry rows."""

from __future__ import annotations

import pandas as pd

from analysis.figures import whatif_heatmaps
from analysis.options import ReportOptions
from analysis.render import Heading, Table
from analysis.whatif import disagreement, whatif_blocks, whatif_summary
from fp8lab_conf.contracts import WHATIF_RECIPES


def _rows() -> pd.DataFrame:
    """Two steps of one run: layer a's activation is easy for everyone (MSE 1e-6), layer b's
    only for the block formats (1e-6) and hard per tensor (1e-2)."""
    rows = []
    for step in (10, 20):
        for layer, per_tensor in (("m.layers.0.a", 1e-6), ("m.layers.0.b", 1e-2)):
            for recipe in WHATIF_RECIPES:
                mse = per_tensor if recipe == "tensorwise" else 1e-6
                rows.append({"run_id": "r1", "step": step, "layer": layer, "kind": "activation", "recipe": recipe,
                             "underflow_pct": 5.0 if recipe == "tensorwise" else 0.0, "overflow_pct": 0.0,
                             "mse": mse, "numel": 64})  # fmt: skip
    return pd.DataFrame(rows)


def test_summary_and_the_layers_where_recipes_disagree_most():
    summary = whatif_summary(_rows(), pd.DataFrame({"run_id": ["r1"], "policy": ["fp8_naive"]}))
    assert len(summary) == 2 * len(WHATIF_RECIPES)
    top = disagreement(summary)
    first = top.iloc[0]
    assert first["layer"] == "m.layers.0.b" and first["worst"] == "tensorwise"
    assert abs(first["spread"] - 4.0) < 1e-9  # 1e-2 vs 1e-6: four decades
    assert top.iloc[1]["spread"] == 0.0
    eight_bit = disagreement(summary, recipes=("tensorwise", "rowwise", "block", "mxfp8"))
    assert "nvfp4" not in eight_bit.columns and eight_bit.iloc[0]["best"] in ("rowwise", "block", "mxfp8")


def test_section_and_heatmap_appear_only_with_whatif_rows():
    trials = pd.DataFrame({"run_id": ["r1"], "policy": ["fp8_naive"]})
    summary = whatif_summary(_rows(), trials)
    blocks = whatif_blocks(summary)
    assert isinstance(blocks[0], Heading) and blocks[0].text == "What each recipe would do here"
    tables = [b for b in blocks if isinstance(b, Table)]
    per_recipe = tables[0].frame
    assert list(per_recipe["recipe"].astype(str)) == list(WHATIF_RECIPES)
    assert per_recipe.set_index(per_recipe["recipe"].astype(str)).loc["tensorwise", "underflow %"] == "5.000"
    (fig,) = whatif_heatmaps(summary, ReportOptions())
    assert fig.name == "whatif_fp8_naive" and fig.png.startswith(b"\x89PNG")
    assert whatif_blocks(whatif_summary(pd.DataFrame(), trials)) == []
