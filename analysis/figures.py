"""Figures as PNG bytes, drawn with matplotlib's object API on the Agg canvas.

No pyplot: pyplot keeps global figure state and picks a GUI backend; `Figure` + `FigureCanvasAgg`
is headless, leaks nothing between calls and needs no `matplotlib.use`. Each function takes
tidy frames and returns `FigureArtifact`s (or none when there is nothing to draw), so a sweep
without telemetry or histories still gets a report.
"""

from __future__ import annotations

import io
import logging
import math
import multiprocessing
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from scipy import stats as _st

from analysis import fmt
from fp8lab_conf.contracts import WHATIF_RECIPES
from analysis.options import ReportOptions
from analysis.summary import EMULATED_NOTE, Group, groups_of
from analysis.tidy import axis_columns, natural_key

log = logging.getLogger(__name__)

DPI = 100
KIND_ORDER = ("activation", "weight", "dgrad", "wgrad", "lora_weight")
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
_FIXED_COLORS = {"bf16": "#1f77b4", "fp8_naive": "#d62728", "fp8_protected": "#2ca02c"}
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
_CYCLE = [
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#c5b0d5",
]


@dataclass(frozen=True)
class FigureArtifact:
    """One rendered figure: `name` is the file stem (figures/<name>.png)."""

    name: str
    title: str
    caption: str
    png: bytes


def policy_colors(policies: Sequence[str], options: ReportOptions) -> dict[str, str]:
    """Stable colours: the three named policies fixed, others from a cycle in sorted order."""
    fixed = {
        options.baseline_policy: _FIXED_COLORS["bf16"],
        options.naive_policy: _FIXED_COLORS["fp8_naive"],
        options.protected_policy: _FIXED_COLORS["fp8_protected"],
    }
    out, i = {}, 0
    for p in sorted(set(policies), key=natural_key):
        if p in fixed:
            out[p] = fixed[p]
        else:
            out[p] = _CYCLE[i % len(_CYCLE)]
            i += 1
    return out


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _slug(text: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)
    return keep.strip("_")[:80] or "x"


def _group_slug(policy: str, axes: Sequence[tuple[str, str]]) -> str:
    return _slug(policy + "".join(f"__{k.removeprefix('axis.')}-{v}" for k, v in axes if v != ""))


def _speed_note(summary: pd.DataFrame) -> str:
    return f" ({EMULATED_NOTE})" if bool(summary.get("emulated", pd.Series(dtype=bool)).any()) else ""


# --------------------------------------------------------------------------- quality vs throughput


def quality_vs_throughput(
    summary: pd.DataFrame, options: ReportOptions, trials: pd.DataFrame | None = None
) -> list[FigureArtifact]:
    """Accuracy vs tokens/s per group, CI error bars, Pareto front, the article's 5-point line.

    Groups with fewer than `low_evidence_seeds` seeds get their per-seed accuracies as small
    hollow points instead of a t-interval (which two seeds cannot support).
    """
    if summary.empty:
        return []
    ok = summary[np.isfinite(summary["acc_mean"].astype(float)) & np.isfinite(summary["tps_mean"].astype(float))]
    if ok.empty:
        return []
    colors = policy_colors(summary["policy"].tolist(), options)
    axes = [c for c in summary.columns if c.startswith("axis.")]
    combos = sorted(
        {tuple(str(r[a]) for a in axes) for _, r in ok.iterrows()}, key=lambda k: tuple(natural_key(v) for v in k)
    )
    markers = {c: _MARKERS[i % len(_MARKERS)] for i, c in enumerate(combos)}
    fig = Figure(figsize=(8.5, 5.8), layout="constrained")
    ax = fig.add_subplot()
    for _, r in ok.iterrows():
        x, y = float(r["tps_mean"]), float(r["acc_mean"])
        xerr = [[x - r["tps_low"]], [r["tps_high"] - x]] if fmt.ok(r["tps_low"]) else None
        few = int(r["n_seeds"]) < options.low_evidence_seeds
        yerr = [[y - r["acc_low"]], [r["acc_high"] - y]] if fmt.ok(r["acc_low"]) and not few else None
        if few and trials is not None:
            seeds = seed_values(trials, r, "accuracy") * 100.0
            ax.plot([x] * len(seeds), seeds, "o", mfc="none", ms=5, color=colors[r["policy"]], alpha=0.8)
        marker = markers[tuple(str(r[a]) for a in axes)]
        ax.errorbar(
            x,
            y,
            xerr=xerr,
            yerr=yerr,
            fmt=marker,
            ms=8 if r["pareto"] else 6,
            capsize=3,
            color=colors[r["policy"]],
            mec="black" if r["pareto"] else colors[r["policy"]],
            mew=1.5,
        )
        ax.annotate(r["group"], (x, y), textcoords="offset points", xytext=(6, 5), fontsize=7)
    front = ok[ok["pareto"].astype(bool)].sort_values("tps_mean")
    if len(front):
        ax.plot(
            front["tps_mean"],
            front["acc_mean"],
            "--",
            color="black",
            lw=1,
            drawstyle="steps-pre",
            label="Pareto front (black-edged points)",
        )
    rule = options.quality_loss_rule_pts
    bases = ok[ok["policy"] == options.baseline_policy]
    for i, (_, b) in enumerate(bases.iterrows()):
        ax.axhline(
            float(b["acc_mean"]) - rule,
            color=colors[options.baseline_policy],
            ls=":",
            lw=1,
            label=(
                f"{options.baseline_policy} − {rule:g} pts: below it, go back to BF16 (article rule)"
                if i == 0
                else None
            ),
        )
    for p, c in colors.items():
        ax.plot([], [], "o", color=c, label=p)
    if len(combos) > 1:
        for combo, m in markers.items():
            ax.plot(
                [],
                [],
                m,
                color="0.5",
                label=", ".join(f"{a.removeprefix('axis.')}={v}" for a, v in zip(axes, combo, strict=True)),
            )
    ax.set_xlabel("throughput, tokens/s per device" + (" — emulated FP8" if _speed_note(summary) else ""))
    ax.set_ylabel("accuracy, %")
    ax.set_title("Quality vs throughput" + _speed_note(summary), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    cap = (
        f"Means over seeds with {options.confidence:.0%} t-intervals (clipped to [0, 100]); with fewer than "
        f"{options.low_evidence_seeds} seeds, hollow points are the single seeds instead; dashed: Pareto front (no "
        "other configuration is both faster and more accurate)."
    ) + _speed_note(summary)
    return [FigureArtifact("quality_vs_throughput", "Quality vs throughput", cap, _png(fig))]


# --------------------------------------------------------------------------- loss curves


def seed_values(trials: pd.DataFrame, row: pd.Series, col: str) -> np.ndarray:
    """The counted per-seed values of `col` for the summary row's group (policy + axis values)."""
    sel = trials[trials["counted"] & (trials["policy"] == row["policy"])]
    for a in axis_columns(trials):
        if a in row:
            sel = sel[sel[a].astype(str) == str(row[a])]
    v = sel[col].to_numpy(float)
    return v[np.isfinite(v)]


LOSS_FLOOR = 0.0
"""A training loss (cross-entropy) is never negative: no band goes below it."""


def _band(stats: pd.DataFrame, confidence: float, min_seeds: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """t-interval band where at least `min_seeds` seeds logged the step, clipped at the loss floor."""
    n = stats["count"].to_numpy(float)
    sd = stats["std"].to_numpy(float)
    mean = stats["mean"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(n >= max(min_seeds, 2), _st.t.ppf(0.5 + confidence / 2, np.maximum(n - 1, 1)), np.nan)
        h = t * sd / np.sqrt(n)
    return np.maximum(mean - h, LOSS_FLOOR), mean + h


def loss_curves(trials: pd.DataFrame, history: pd.DataFrame, options: ReportOptions) -> list[FigureArtifact]:
    """Mean training loss per policy with a t-interval band over seeds; one panel per axis setting."""
    if history.empty or trials.empty:
        return []
    counted = trials[trials["counted"]]
    axes = axis_columns(trials)
    h = history.merge(counted[["run_id", "policy", *axes]], on="run_id", how="inner")
    h = h[np.isfinite(h["value"].astype(float))]
    if h.empty:
        return []
    colors = policy_colors(trials["policy"].tolist(), options)
    panels = [
        tuple(k) if isinstance(k, tuple) else (k,)
        for k in (h.groupby(axes, sort=False).groups.keys() if axes else [()])
    ]
    panels = sorted(set(panels), key=lambda k: tuple(natural_key(v) for v in k))
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.2 * ncols, 3.6 * nrows), layout="constrained")
    diverged = trials[(trials["status"] == "DIVERGED") & np.isfinite(trials["diverged_step"])]
    for i, key in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        sel = h
        for col, val in zip(axes, key, strict=True):
            sel = sel[sel[col] == val]
        order = sorted(sel["policy"].unique(), key=lambda p: (0 if p == options.baseline_policy else 1, natural_key(p)))
        for pol in order:
            st = sel[sel["policy"] == pol].groupby("step")["value"].agg(["mean", "std", "count"]).sort_index()
            n_runs = sel.loc[sel["policy"] == pol, "run_id"].nunique()
            ax.plot(st.index, st["mean"], color=colors[pol], lw=1.2, label=f"{pol} (n={n_runs})")
            lo, hi = _band(st, options.confidence, options.low_evidence_seeds)
            if np.isfinite(hi).any():
                ax.fill_between(st.index, lo, hi, color=colors[pol], alpha=0.2, lw=0)
            if n_runs < options.low_evidence_seeds:  # too few seeds for a band: show each seed
                for _, one in sel[sel["policy"] == pol].groupby("run_id"):
                    one = one.sort_values("step")
                    ax.plot(one["step"], one["value"], color=colors[pol], lw=0.6, alpha=0.5, ls="--")
            dv = diverged[diverged["policy"] == pol]
            for col, val in zip(axes, key, strict=True):
                dv = dv[dv[col] == val]
            if len(dv):
                ymax = float(np.nanmax(st["mean"])) if len(st) else 0.0
                ax.plot(dv["diverged_step"], [ymax] * len(dv), "x", color=colors[pol], ms=8, label=f"{pol} diverged")
        title = ", ".join(f"{c.removeprefix('axis.')}={v}" for c, v in zip(axes, key, strict=True) if v != "")
        if title:
            ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(options.loss_metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Training loss: mean over seeds, band = {options.confidence:.0%} t-interval", fontsize=10)
    cap = (
        f"`{options.loss_metric}` per optimizer step, mean over the counted seeds of each policy; shaded band: "
        f"{options.confidence:.0%} t-interval (never below a loss of 0) where at least {options.low_evidence_seeds} "
        f"seeds logged the step; with fewer seeds, dashed lines are the single seeds; x: divergence step."
    )
    return [FigureArtifact("loss_curves", "Training loss curves", cap, _png(fig))]


# --------------------------------------------------------------------------- telemetry


def _short_layers(layers: Sequence[str]) -> dict[str, str]:
    """Drop the common dotted prefix ('base_model.model.model.layers.') so labels stay readable."""
    names = [str(x) for x in layers]
    if len(names) < 2:
        return {n: n for n in names}
    parts = [n.split(".") for n in names]
    k = 0
    while all(len(p) > k + 1 and p[k] == parts[0][k] for p in parts):
        k += 1
    return {n: ".".join(p[k:]) for n, p in zip(names, parts, strict=True)}


def _kinds(frame: pd.DataFrame) -> list[str]:
    present = [str(k) for k in frame["kind"].dropna().unique()]
    return [k for k in KIND_ORDER if k in present] + sorted(k for k in present if k not in KIND_ORDER)


def _tick_fontsize(n_labels: int) -> float:
    return 7.0 if n_labels <= 24 else 5.5


def _panel_figure(
    n: int, n_rows_per_panel: int, labels: Sequence[str], title: str, colorbar: bool = False
) -> tuple[Figure, list[Axes], Axes | None]:
    """A figure with `n` panels laid out by hand (in inches) instead of a layout engine.

    Constrained layout measures every tick label and doubles the render time of these many-panel
    figures (the bulk of a report's run time); the sizes here come from the label lengths.
    Returns (figure, axes, colorbar axes or None).
    """
    ncols = min(n, 3 if n_rows_per_panel <= 24 else 2)
    nrows = math.ceil(n / ncols)
    fs = _tick_fontsize(n_rows_per_panel)
    label_w = 0.25 + 0.6 * fs / 72 * max((len(x) for x in labels), default=4)
    plot_w, gap = 4.2, 0.25
    plot_h = min(max(0.13 * n_rows_per_panel + 0.5, 1.6), max(8.0, 0.11 * n_rows_per_panel))  # >= 8 pt per row
    top, title_h, bottom_h = 0.45, 0.3, 0.5
    cbar_w = 1.0 if colorbar else 0.15
    width = 0.1 + ncols * (label_w + plot_w) + gap * (ncols - 1) + cbar_w
    height = top + nrows * (title_h + plot_h + bottom_h)
    fig = Figure(figsize=(width, height))
    axes = []
    for i in range(n):
        r, c = divmod(i, ncols)
        x0 = 0.1 + c * (label_w + plot_w + gap) + label_w
        y0 = height - top - r * (title_h + plot_h + bottom_h) - title_h - plot_h
        axes.append(fig.add_axes((x0 / width, y0 / height, plot_w / width, plot_h / height)))
    cax = None
    if colorbar:
        h = min(height - top - 0.6, 4.0)
        cax = fig.add_axes(((width - cbar_w + 0.1) / width, (height - top - h) / height, 0.15 / width, h / height))
    fig.suptitle(title, fontsize=10, y=1 - 0.15 / height, va="top")
    return fig, axes, cax


def _label_ticks(ax: Axes, labels: Sequence[str], axis: str = "y", max_labels: int = 40) -> None:
    """Tick labels, thinned to at most `max_labels` (layer axes pass their length: every row named)."""
    k = max(1, math.ceil(len(labels) / max(max_labels, 1)))
    pos = list(range(0, len(labels), k))
    fs = _tick_fontsize(len(labels))
    if axis == "y":
        ax.set_yticks(pos, [labels[i] for i in pos], fontsize=fs)
    else:
        ax.set_xticks(pos, [labels[i] for i in pos], fontsize=fs)


def _plain_log_ticks(ax: Axes, lo: float, hi: float) -> None:
    """Plain-text log ticks (mathtext labels are slow to lay out); label 2x and 5x only on short ranges."""
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    short = lo > 0 and hi / lo < 100
    ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.xaxis.set_minor_formatter(plain if short else NullFormatter())
    ax.tick_params(axis="x", which="both", labelsize=7)


def _telemetry_by_group(trials: pd.DataFrame, telemetry: pd.DataFrame, options: ReportOptions):
    """Yield (group, telemetry of its counted runs) for every non-baseline group with data.

    Counted = FINISHED and DIVERGED, as in the statistics; a diverged run's telemetry up to the
    divergence is exactly what the heatmap should show.
    """
    if telemetry.empty or "kind" not in telemetry or "layer" not in telemetry:
        return
    by_run = {rid: frame for rid, frame in telemetry.groupby("run_id", sort=False)}
    for g, sub in groups_of(trials, options).items():
        if g.policy == options.baseline_policy:
            continue
        parts = [by_run[r] for r in sub.loc[sub["counted"], "run_id"] if r in by_run]
        if parts:
            yield g, pd.concat(parts, ignore_index=True)


HEATMAP_COLUMNS = ["step", "layer", "kind", "underflow_pct"]
AMAX_COLUMNS = ["layer", "kind", "amax"]


def _heatmap_one(
    g: Group, tel: pd.DataFrame, options: ReportOptions, vmax: float | None = None
) -> FigureArtifact | None:
    """Layer x step heatmap of underflow % (mean over seeds) for one group, one panel per tensor kind."""
    tel = tel[np.isfinite(tel["underflow_pct"].astype(float))]
    kinds = _kinds(tel)
    if not kinds:
        return None
    all_layers = sorted(tel["layer"].astype(str).unique(), key=natural_key)
    short = _short_layers(all_layers)
    n_show = min(len(all_layers), options.max_heatmap_layers)
    fig, axes, cax = _panel_figure(
        len(kinds), n_show, list(short.values()), f"Underflow % per layer and step — {g.label}", colorbar=True
    )
    vmax = vmax if vmax is not None and np.isfinite(vmax) else max(float(tel["underflow_pct"].max()), 1.0)
    img = None
    truncated = False
    for ax, kind in zip(axes, kinds, strict=True):
        k = tel[tel["kind"] == kind]
        piv = k.pivot_table(index="layer", columns="step", values="underflow_pct", aggfunc="mean")
        piv = piv.reindex(sorted(piv.index.astype(str), key=natural_key))
        if len(piv) > options.max_heatmap_layers:
            truncated = True
            top = set(piv.mean(axis=1).nlargest(options.max_heatmap_layers).index)
            piv = piv.loc[[x for x in piv.index if x in top]]
        img = ax.imshow(
            piv.to_numpy(float),
            aspect="auto",
            interpolation="nearest",
            cmap="magma",
            norm=PowerNorm(0.5, vmin=0.0, vmax=vmax),
        )
        _label_ticks(ax, [short.get(str(x), str(x)) for x in piv.index], "y", max_labels=len(piv))
        steps = list(piv.columns)
        xt: list[int] = (
            np.linspace(0, len(steps) - 1, num=min(6, len(steps))).round().astype(int).tolist() if steps else []
        )
        ax.set_xticks(xt, [str(steps[j]) for j in xt], fontsize=7)
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel("step", fontsize=8, labelpad=1)
    if img is not None and cax is not None:
        fig.colorbar(img, cax=cax, label="underflow % (mean over seeds)")
    cap = (
        "Elements flushed to zero by the FP8 cast (non-zero before, zero after) as a share of all elements "
        "of the tensor (TE LogFp8TensorStats underflows%), "
        "mean over seeds; one square-root colour scale for every policy, so the heatmaps compare and small "
        "values stay visible."
        + (
            f" Only the {options.max_heatmap_layers} layers with the highest mean underflow are shown."
            if truncated
            else ""
        )
    )
    return FigureArtifact(
        f"underflow_{_group_slug(g.policy, g.axes)}", f"Underflow heatmap — {g.label}", cap, _png(fig)
    )


# x-axis label of each amax panel: the FP8 cast kinds show the amax the scale is computed from;
# the LoRA-health kinds are FP32 tensors that are never cast (their "amax" is max |x|).
AMAX_XLABEL = "pre-cast amax (log scale)"
UNCAST_XLABELS = {"lora_weight_std": "max |LoRA weight|, FP32, not cast (log scale)",
                  "lora_grad_norm": "max |LoRA gradient|, FP32, not cast (log scale)"}
FP8_MAX_LINES = ((E4M3_MAX, "E4M3 max"), (E5M2_MAX, "E5M2 max"))


def _amax_one(g: Group, tel: pd.DataFrame, options: ReportOptions) -> FigureArtifact | None:
    """Per-layer amax range over steps and seeds for one group (min–max line, IQR bar, median dot)."""
    drawn = amax_figure(g, tel, options)
    if drawn is None:
        return None
    fig, cap = drawn
    return FigureArtifact(f"amax_{_group_slug(g.policy, g.axes)}", f"amax distribution — {g.label}", cap, _png(fig))


def amax_figure(g: Group, tel: pd.DataFrame, options: ReportOptions) -> tuple[Figure, str] | None:
    """(figure, caption) of the amax distribution; the caption names only the FP8-max lines that
    were drawn (a line is drawn where the axis reaches within 10x of it)."""
    amax = tel["amax"].astype(float)
    tel = tel[np.isfinite(amax) & (amax > 0)]
    kinds = _kinds(tel)
    if not kinds:
        return None
    all_layers = sorted(tel["layer"].astype(str).unique(), key=natural_key)
    short = _short_layers(all_layers)
    n_layers = min(len(all_layers), options.max_heatmap_layers)
    fig, axes, _ = _panel_figure(
        len(kinds), n_layers, list(short.values()), f"amax per layer over steps and seeds — {g.label}"
    )
    truncated, lines = False, set()
    for ax, kind in zip(axes, kinds, strict=True):
        q = tel[tel["kind"] == kind].groupby("layer")["amax"].quantile(np.array([0.0, 0.25, 0.5, 0.75, 1.0])).unstack()
        q = q.reindex(sorted(q.index.astype(str), key=natural_key))
        if len(q) > options.max_heatmap_layers:
            truncated = True
            top = set(q[1.0].nlargest(options.max_heatmap_layers).index)
            q = q.loc[[x for x in q.index if x in top]]
        y = np.arange(len(q))
        ax.hlines(y, q[0.0], q[1.0], color="0.55", lw=1)
        ax.hlines(y, q[0.25], q[0.75], color="#1f77b4", lw=4)
        ax.plot(q[0.5], y, "o", color="black", ms=2.5)
        ax.set_xscale("log")
        _plain_log_ticks(ax, float(q[0.0].min()), float(q[1.0].max()))
        if kind not in UNCAST_XLABELS:
            lines |= _fp8_max_lines(ax, float(q[1.0].max()))
        _label_ticks(ax, [short.get(str(x), str(x)) for x in q.index], "y", max_labels=len(q))
        ax.set_ylim(len(q) - 0.5, -0.5)  # first layer on top
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel(UNCAST_XLABELS.get(kind, AMAX_XLABEL), fontsize=8, labelpad=1)
        ax.grid(alpha=0.3, axis="x")
    cap = (
        "Per layer: grey line min–max, blue bar 25–75th percentile, dot median of the amax over "
        "logged steps and seeds. " + _fp8_lines_caption(lines)
        + (f" Only the {options.max_heatmap_layers} layers with the largest amax are shown." if truncated else "")
    )
    return fig, cap


def _fp8_max_lines(ax: Axes, top: float) -> set[str]:
    """Draw the largest finite value of each FP8 format the axis comes within 10x of; their names."""
    drawn = set()
    for val, name in FP8_MAX_LINES:
        if top * 10 >= val:
            ax.axvline(val, color="#d62728", ls=":", lw=1)
            ax.text(val, 0.98, name, fontsize=6, color="#d62728", ha="right", va="top", rotation=90,
                    transform=ax.get_xaxis_transform())
            drawn.add(name)
    return drawn


def _fp8_lines_caption(drawn: set[str]) -> str:
    if not drawn:
        return (f"No FP8-max line is drawn: every amax stays more than 10x below E4M3's largest value "
                f"({E4M3_MAX:g}), so nothing here comes near saturating.")
    names = [name for _, name in FP8_MAX_LINES if name in drawn]
    return "Red dotted line(s): " + " and ".join(names) + ", the largest finite value of the format."


Job = tuple[Callable[..., "FigureArtifact | None"], Group, pd.DataFrame, ReportOptions, dict[str, Any]]


def _telemetry_jobs(trials: pd.DataFrame, telemetry: pd.DataFrame, options: ReportOptions) -> list[Job]:
    """One job per (FP8 group, figure kind), each with only the columns it draws (cheap to ship to a worker)."""
    jobs: list[Job] = []
    groups = list(_telemetry_by_group(trials, telemetry, options))
    if "underflow_pct" in telemetry:
        under = (
            pd.to_numeric(pd.concat([tel["underflow_pct"] for _, tel in groups]), errors="coerce") if groups else None
        )
        top = float(under.max()) if under is not None and under.notna().any() else 1.0
        shared = {"vmax": max(top, 1.0)}
        jobs += [(_heatmap_one, g, tel[HEATMAP_COLUMNS], options, shared) for g, tel in groups]
    if "amax" in telemetry:
        jobs += [(_amax_one, g, tel[AMAX_COLUMNS], options, {}) for g, tel in groups]
    return jobs


def _call(job: Job) -> tuple[FigureArtifact | None, str]:
    fn, g, tel, options, kwargs = job
    try:
        return fn(g, tel, options, **kwargs), ""
    except Exception as exc:  # reported by the caller; the other figures still get drawn
        return None, f"figure for {g.label} could not be drawn ({type(exc).__name__}: {exc})."


def _can_fork() -> bool:
    """Forking is only safe (and only fast) from a single-threaded process on a platform that has it."""
    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


def run_jobs(jobs: Sequence[Job], workers: int, warnings: list[str] | None = None) -> list[FigureArtifact]:
    """Draw the jobs, in worker processes when there are enough of them to pay for the fork.

    Matplotlib is single-threaded (the GIL) and drawing dominates a report's run time, so separate
    processes are the only way to use more cores; results keep the jobs' order.
    """
    if workers > 1 and len(jobs) >= 4 and _can_fork():
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as ex:
            results = list(ex.map(_call, jobs))
    else:
        results = [_call(j) for j in jobs]
    out = []
    for fig, err in results:
        if fig is not None:
            out.append(fig)
        elif err:
            log.warning("%s", err)
            if warnings is not None:
                warnings.append(err)
    return out


def underflow_heatmaps(
    trials: pd.DataFrame, telemetry: pd.DataFrame, options: ReportOptions, warnings: list[str] | None = None
) -> list[FigureArtifact]:
    """Per FP8 group: layer x step heatmap of underflow % (mean over seeds), one panel per tensor kind."""
    jobs = [j for j in _telemetry_jobs(trials, telemetry, options) if j[0] is _heatmap_one]
    return run_jobs(jobs, 1, warnings)


def amax_distributions(
    trials: pd.DataFrame, telemetry: pd.DataFrame, options: ReportOptions, warnings: list[str] | None = None
) -> list[FigureArtifact]:
    """Per FP8 group: per-layer amax range over steps and seeds (min–max line, IQR bar, median dot)."""
    jobs = [j for j in _telemetry_jobs(trials, telemetry, options) if j[0] is _amax_one]
    return run_jobs(jobs, 1, warnings)


# --------------------------------------------------------------------------- memory


def whatif_heatmaps(summary: pd.DataFrame, options: ReportOptions) -> list[FigureArtifact]:
    """Per policy: one panel per what-if recipe, layer x tensor kind, coloured by log10 MSE of
    the round trip (``analysis.whatif.whatif_summary``), one colour scale for all panels."""
    out = []
    for policy, frame in summary.groupby("policy", sort=True):
        recipes = [r for r in WHATIF_RECIPES if r in set(frame["recipe"])]
        layers = sorted(frame["layer"].astype(str).unique(), key=natural_key)[: options.max_heatmap_layers]
        short = _short_layers(layers)
        kinds = _kinds(frame)
        fig, axes, cax = _panel_figure(len(recipes), len(layers), list(short.values()),
                                       f"What each recipe would do: log10 MSE per layer and tensor — {policy}",
                                       colorbar=True)  # fmt: skip
        lo, hi = float(frame["log10_mse"].min()), float(frame["log10_mse"].max())
        img = None
        for ax, recipe in zip(axes, recipes, strict=True):
            piv = frame[frame["recipe"] == recipe].pivot_table(index="layer", columns="kind", values="log10_mse")
            piv = piv.reindex(index=layers, columns=kinds)
            img = ax.imshow(piv.to_numpy(float), aspect="auto", interpolation="nearest", cmap="viridis",
                            vmin=lo, vmax=hi)  # fmt: skip
            _label_ticks(ax, [short[x] for x in layers], "y")
            ax.set_xticks(range(len(kinds)), kinds, fontsize=7)
            ax.set_title(recipe, fontsize=9)
        if img is not None and cax is not None:
            fig.colorbar(img, cax=cax, label="log10 MSE (mean over steps and seeds)")
        cap = ("The same tensors under each recipe (what-if telemetry): darker is closer to the tensor. "
               "A layer dark in one panel and bright in another is where the recipe choice matters.")
        out.append(FigureArtifact(f"whatif_{_slug(str(policy))}", f"What each recipe would do — {policy}", cap,
                                  _png(fig)))
    return out


def memory_bars(summary: pd.DataFrame, options: ReportOptions) -> list[FigureArtifact]:
    """Peak memory per group (GiB, mean with CI) with its ratio to the baseline written on the bar."""
    if summary.empty:
        return []
    ok = summary[np.isfinite(summary["mem_gib_mean"].astype(float))]
    if ok.empty:
        return []
    colors = policy_colors(summary["policy"].tolist(), options)
    fig = Figure(figsize=(max(5.0, 0.8 * len(ok) + 2), 4.4), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(ok))
    means = ok["mem_gib_mean"].to_numpy(float)
    lo = np.nan_to_num(means - ok["mem_gib_low"].to_numpy(float), nan=0.0)
    hi = np.nan_to_num(ok["mem_gib_high"].to_numpy(float) - means, nan=0.0)
    ax.bar(x, means, color=[colors[p] for p in ok["policy"]], yerr=[lo, hi], capsize=3)
    for xi, top, (_, r) in zip(x, means + hi, ok.iterrows(), strict=True):
        if fmt.ok(r["mem_ratio"]):
            ax.annotate(
                f"{float(r['mem_ratio']):.2f}x",
                (xi, top),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(x, ok["group"].tolist(), rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("peak memory, GiB")
    ax.set_title(f"Peak memory per policy (ratio to {options.baseline_policy} on the bars)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    devices = ", ".join(sorted({d for d in summary["device"] if d})) or "unknown device"
    cap = f"`{options.memory_metric}` mean over seeds with {options.confidence:.0%} t-interval; measured on {devices}."
    return [FigureArtifact("memory", "Peak memory", cap, _png(fig))]


def all_figures(
    trials: pd.DataFrame,
    summary: pd.DataFrame,
    history: pd.DataFrame,
    telemetry: pd.DataFrame,
    options: ReportOptions,
    warnings: list[str] | None = None,
) -> list[FigureArtifact]:
    """Every figure of the report, in reading order.

    A figure that fails to draw (unexpected data) is skipped with a note in `warnings`, so one bad
    telemetry table never costs the user the rest of the report.
    """
    builders: list[tuple[str, Callable[[], list[FigureArtifact]]]] = [
        ("quality vs throughput", lambda: quality_vs_throughput(summary, options, trials)),
        ("loss curves", lambda: loss_curves(trials, history, options)),
        ("memory", lambda: memory_bars(summary, options)),
    ]
    out: list[FigureArtifact] = []
    for name, build in builders:
        try:
            out += build()
        except Exception as exc:
            log.exception("figure %r failed", name)
            if warnings is not None:
                warnings.append(f"figure '{name}' could not be drawn ({type(exc).__name__}: {exc}).")
    try:
        jobs = _telemetry_jobs(trials, telemetry, options)
    except Exception as exc:
        log.exception("telemetry figures failed")
        if warnings is not None:
            warnings.append(f"telemetry figures could not be drawn ({type(exc).__name__}: {exc}).")
        jobs = []
    return out + run_jobs(jobs, options.figure_workers, warnings)
