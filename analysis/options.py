"""Knobs of the report (economics, statistics, what to call the baseline).

A frozen dataclass so a report is reproducible from its options; validated here (not with
asserts, which vanish under ``python -O``) so a bad value fails before any MLflow call.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.errors import ReportError, did_you_mean
from fp8lab_conf.contracts import METRIC_ACCURACY, METRIC_LOSS, METRIC_PEAK_BYTES, METRIC_TOKENS_PER_S


@dataclass(frozen=True)
class ReportOptions:
    """Everything that changes the numbers or the wording of a report.

    Economics follow docs/background.md §3: EffCostPerHour = price * n_gpu / utilization,
    TokensPerHour = tokens_per_s * 3600 * n_gpu.
    """

    gpu_hour_price: float = 2.5
    """USD per GPU-hour used for the cost section."""
    utilization: float = 0.8
    """Target utilisation U in (0, 1]: idle time you pay for but do not train in."""
    n_gpu: int = 1
    """GPUs per job; measured tokens/s is per GPU."""
    currency: str = "USD"
    baseline_policy: str = "bf16"
    """Policy every other policy is compared with (same values of the other sweep axes)."""
    naive_policy: str = "fp8_naive"
    protected_policy: str = "fp8_protected"
    """Ablations are variants of this policy; their gap is measured against `naive_policy`."""
    confidence: float = 0.95
    """Confidence level of every interval; the significance level is 1 - confidence."""
    equivalence_margin_pts: float = 2.0
    """"As good as the baseline" is claimed only when a TOST equivalence test against this margin
    (accuracy points, either direction) succeeds; otherwise "not distinguishable with this evidence"."""
    loss_margin_pct: float = 0.5
    """"As good as the baseline" on held-out loss needs a TOST inside this relative loss error
    (percent of the baseline's loss, either direction); block-scaled FP8 training is reported
    within 0.25% of BF16 (DeepSeek-V3), so 0.5% leaves room for emulation and short runs."""
    low_evidence_seeds: int = 3
    """Below this many seeds: per-seed values instead of t-intervals, a low-evidence note, and an
    equivalence is printed as "provisionally as good as" (the seed noise rests on < 2 df)."""
    quality_loss_rule_pts: float = 5.0
    """Source article's rule: if quality drops by more than this many points, go back to BF16."""
    accuracy_metric: str = METRIC_ACCURACY
    throughput_metric: str = METRIC_TOKENS_PER_S
    memory_metric: str = METRIC_PEAK_BYTES
    loss_metric: str = METRIC_LOSS
    """Metric whose history is plotted as loss curves (one history call per counted run)."""
    final_from_history: tuple[str, ...] = (METRIC_TOKENS_PER_S,)
    """Metrics logged per step *and* once at the end under the same key: their final value is the
    last one written (fetched from the history, one more call per run), not MLflow's 'latest',
    which is the highest step. See `analysis.tidy.last_written`."""
    tokens_per_epoch_params: tuple[str, str] = ("data.train_size", "train.max_seq_len")
    tokens_per_epoch_metric: str = "train/tokens_per_epoch"
    log_to_mlflow: bool = True
    """Log the written files as artifacts (under `report/`) of the sweep's parent run."""
    fetch_telemetry: bool = True
    """Download each FP8 run's telemetry Parquet for the heatmaps (skip to save time)."""
    max_workers: int = 8
    """Threads for per-run MLflow calls (metric histories, artifact downloads)."""
    figure_workers: int = dataclasses.field(default_factory=lambda: min(4, os.cpu_count() or 1))
    """Processes drawing the per-policy telemetry figures (drawing dominates the run time; 1 = serial)."""
    max_heatmap_layers: int = 64
    """Heatmaps with more layers than this show the layers with the highest underflow."""

    def __post_init__(self) -> None:
        errors: list[str] = []
        if not (math.isfinite(self.gpu_hour_price) and self.gpu_hour_price >= 0):
            errors.append(f"gpu_hour_price must be >= 0 (got {self.gpu_hour_price})")
        if not (0 < self.utilization <= 1):
            errors.append(f"utilization must be in (0, 1] (got {self.utilization})")
        if int(self.n_gpu) != self.n_gpu or self.n_gpu < 1:
            errors.append(f"n_gpu must be a positive integer (got {self.n_gpu})")
        if not (0 < self.confidence < 1):
            errors.append(f"confidence must be in (0, 1) (got {self.confidence})")
        if not (math.isfinite(self.equivalence_margin_pts) and self.equivalence_margin_pts > 0):
            errors.append(f"equivalence_margin_pts must be > 0 points (got {self.equivalence_margin_pts})")
        if not (math.isfinite(self.loss_margin_pct) and self.loss_margin_pct > 0):
            errors.append(f"loss_margin_pct must be > 0 percent (got {self.loss_margin_pct})")
        if int(self.low_evidence_seeds) != self.low_evidence_seeds or self.low_evidence_seeds < 2:
            errors.append(f"low_evidence_seeds must be an integer >= 2 (got {self.low_evidence_seeds})")
        if self.quality_loss_rule_pts < 0:
            errors.append(f"quality_loss_rule_pts must be >= 0 (got {self.quality_loss_rule_pts})")
        if self.figure_workers < 1:
            errors.append(f"figure_workers must be >= 1 (got {self.figure_workers})")
        if self.max_workers < 1:
            errors.append(f"max_workers must be >= 1 (got {self.max_workers})")
        if self.max_heatmap_layers < 1:
            errors.append(f"max_heatmap_layers must be >= 1 (got {self.max_heatmap_layers})")
        if errors:
            raise ReportError("invalid report options: " + "; ".join(errors))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, ignore: Iterable[str] = ()) -> ReportOptions:
        """Build from a config mapping (e.g. Hydra's `report:` group); unknown keys fail loudly.

        `ignore` names keys that belong to the caller (e.g. the CLI's `out`). Lists become tuples so
        the dataclass stays hashable.
        """
        skip = set(ignore)
        values = {k: v for k, v in dict(values or {}).items() if k not in skip}
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in values if k not in fields]
        if unknown:
            raise ReportError(f"unknown report option {unknown[0]!r}{did_you_mean(unknown[0], fields)}")
        for key, val in list(values.items()):
            if isinstance(val, Sequence) and not isinstance(val, (str, bytes)):  # list, OmegaConf ListConfig
                values[key] = tuple(val)
        return cls(**values)

    @property
    def alpha(self) -> float:
        """Significance level matching the confidence of the intervals."""
        return 1.0 - self.confidence
