"""The report section "What each recipe would do here": the what-if telemetry
(``precision.telemetry.whatif``, ``telemetry/whatif.parquet``) of the sweep's runs, as a
per-layer table for each recipe and the layers where the recipes disagree most.

Every number is the mean over recorded steps (and seeds) of the run's own tensors quantized
under each recipe, by the telemetry's definitions: underflow % (non-zero values flushed to
zero, as a share of all elements), saturation % (``|x * scale| > fmax``) and MSE of the round
trip. *Disagreement* of a (layer, tensor) is the spread of ``log10 MSE`` across recipes: the
orders of magnitude between the recipe that suits that tensor best and the one that suits it
worst.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.render import Heading, Para, Table
from fp8lab_conf.contracts import WHATIF_RECIPES

__all__ = ["whatif_summary", "disagreement", "whatif_blocks"]

_KEYS = ["policy", "layer", "kind", "recipe"]


def whatif_summary(whatif: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Mean underflow %, saturation % and log10 MSE per (policy, layer, kind, recipe)."""
    if whatif.empty:
        return pd.DataFrame(columns=[*_KEYS, "underflow_pct", "overflow_pct", "log10_mse"])
    frame = whatif.merge(trials[["run_id", "policy"]], on="run_id", how="inner")
    frame = frame.assign(log10_mse=np.log10(frame["mse"].astype(float).clip(lower=1e-30)))
    return frame.groupby(_KEYS, as_index=False)[["underflow_pct", "overflow_pct", "log10_mse"]].mean()


FP8_RECIPES = tuple(r for r in WHATIF_RECIPES if r != "nvfp4")  # the 8-bit ones


def disagreement(summary: pd.DataFrame, top: int = 8, recipes: tuple[str, ...] = WHATIF_RECIPES) -> pd.DataFrame:
    """The ``top`` (policy, layer, kind) rows with the widest spread of log10 MSE across
    ``recipes``, one column per recipe (its log10 MSE), the best and worst recipe and the spread."""
    if summary.empty:
        return pd.DataFrame()
    wide = summary.pivot_table(index=["policy", "layer", "kind"], columns="recipe", values="log10_mse")
    wide = wide[[r for r in recipes if r in wide.columns]]
    out = wide.assign(best=wide.idxmin(axis=1), worst=wide.idxmax(axis=1), spread=wide.max(axis=1) - wide.min(axis=1))
    return out.sort_values("spread", ascending=False).head(top).reset_index()


def _display(table: pd.DataFrame) -> pd.DataFrame:
    shown = table.copy()
    for col in [*WHATIF_RECIPES, "spread"]:
        if col in shown:
            shown[col] = shown[col].map(lambda v: f"{v:.2f}")
    return shown.rename(columns={"spread": "spread (decades)"})


def _per_recipe(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (policy, recipe): underflow, saturation and log10 MSE over all layers."""
    agg = summary.groupby(["policy", "recipe"], as_index=False)[["underflow_pct", "overflow_pct", "log10_mse"]].mean()
    agg["recipe"] = pd.Categorical(agg["recipe"], WHATIF_RECIPES, ordered=True)
    agg = agg.sort_values(["policy", "recipe"])
    return agg.assign(underflow_pct=agg["underflow_pct"].map(lambda v: f"{v:.3f}"),
                      overflow_pct=agg["overflow_pct"].map(lambda v: f"{v:.3f}"),
                      log10_mse=agg["log10_mse"].map(lambda v: f"{v:.2f}"))  # fmt: skip


def whatif_blocks(summary: pd.DataFrame) -> list[Heading | Para | Table]:
    """The section, or nothing when no run logged what-if telemetry."""
    if summary.empty:
        return []
    return [
        Heading("What each recipe would do here"),
        Para(
            "The tensors each FP8 policy cast, at every recorded telemetry step, also quantized (on the side, "
            f"training unchanged) under every recipe: {', '.join(WHATIF_RECIPES)} (tensorwise: TE "
            "Float8CurrentScaling / torchao tensorwise, E5M2 gradients; rowwise: torchao rowwise; block: TE "
            "Float8BlockScaling; mxfp8: TE MXFP8BlockScaling; nvfp4: TE NVFP4BlockScaling, nearest rounding). "
            "Same definitions as the telemetry above. Off by default (precision.telemetry.whatif=true): it "
            "quantizes every cast tensor five more times on each recorded step."
        ),
        Table(_display_recipes(summary), "Mean over layers, tensors, recorded steps and seeds: underflow % "
              "(flushed to zero), saturation % (clamped at the format's max), log10 of the round trip's MSE."),
        Table(_display(disagreement(summary)), "Where the recipes disagree most: log10 MSE of each (layer, tensor) "
              "under each recipe, the best and worst recipe, and the spread in decades."),
        Table(_display(disagreement(summary, recipes=FP8_RECIPES)), "The same among the 8-bit recipes only "
              "(NVFP4's 4 bits are the worst almost everywhere, which hides where the FP8 scalings differ)."),
    ]


def _display_recipes(summary: pd.DataFrame) -> pd.DataFrame:
    return _per_recipe(summary).rename(columns={"underflow_pct": "underflow %", "overflow_pct": "saturation %",
                                                "log10_mse": "log10 MSE"})
