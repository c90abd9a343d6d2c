"""Number formatting shared by verdicts, tables and figures (one place, one style).

NaN prints as "n/a" so a missing metric shows up as missing, never as 0 or a crash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

NA = "n/a"


def ok(x: object) -> bool:
    """True for a finite real number."""
    try:
        return x is not None and not isinstance(x, bool) and math.isfinite(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def num(x: object, digits: int = 1, signed: bool = False) -> str:
    if not ok(x):
        return NA
    return f"{float(x):+.{digits}f}" if signed else f"{float(x):.{digits}f}"  # type: ignore[arg-type]


def pm(mean: object, low: object, high: object, digits: int = 1, signed: bool = False) -> str:
    """'m ± h' from an interval; just 'm' when there is no interval."""
    if not ok(mean):
        return NA
    if ok(low) and ok(high):
        return f"{num(mean, digits, signed)} ± {num((float(high) - float(low)) / 2, digits)}"  # type: ignore[arg-type]
    return num(mean, digits, signed)


def spread(mean: object, low: object, high: object, n: int, per_seed: str, min_seeds: int, digits: int = 1) -> str:
    """A mean over seeds as the evidence allows: per-seed values below `min_seeds`, 'm ± h' for a
    symmetric interval, 'm [lo, hi]' for one clipped to the metric's range, and an explicit
    'zero variance over n seeds' instead of a bare '± 0.0'."""
    if not ok(mean):
        return NA
    if n < min_seeds:
        return f"{per_seed} (1 seed, no CI)" if n == 1 else f"{per_seed} (per seed, {n} seeds: too few for a t-interval)"
    if not (ok(low) and ok(high)):
        return num(mean, digits)
    lo, hi, m = float(low), float(high), float(mean)  # type: ignore[arg-type]
    if hi - lo == 0:
        return f"{num(m, digits)} ± {num(0.0, digits)} (zero variance over {n} seeds)"
    if abs((hi - m) - (m - lo)) > 1e-9 * max(1.0, abs(m)):
        return f"{num(m, digits)} [{num(lo, digits)}, {num(hi, digits)}]"
    return f"{num(m, digits)} ± {num((hi - lo) / 2, digits)}"


def interval(low: object, high: object, digits: int = 2) -> str:
    """'[a, b]' or '' when absent."""
    if ok(low) and ok(high):
        return f"[{num(low, digits)}, {num(high, digits)}]"
    return ""


def ratio(x: object, low: object = None, high: object = None, digits: int = 2) -> str:
    """'0.97x [0.93, 1.01]'."""
    if not ok(x):
        return NA
    ci = interval(low, high, digits)
    return f"{num(x, digits)}x" + (f" {ci}" if ci else "")


def pvalue(p: object) -> str:
    if not ok(p):
        return NA
    p = float(p)  # type: ignore[arg-type]
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def p_eq(p: object) -> str:
    """'p=0.028' / 'p<0.001' for prose."""
    text = pvalue(p)
    return f"p{text}" if text.startswith("<") else f"p={text}"


def si(x: object, digits: int = 1) -> str:
    """Human throughput: 1234 -> '1.2k'."""
    if not ok(x):
        return NA
    v = float(x)  # type: ignore[arg-type]
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.{digits}f}{unit}"
    return f"{v:.{digits}f}"


def money(x: object, currency: str = "USD") -> str:
    if not ok(x):
        return NA
    v = float(x)  # type: ignore[arg-type]
    digits = 2 if abs(v) >= 0.1 else 4
    return f"{v:,.{digits}f} {currency}"


def group_label(policy: str, axes: Mapping[str, str]) -> str:
    """'fp8_protected [lora.r=16]' — the policy plus the values of the other sweep axes."""
    shown = [f"{k}={v}" for k, v in axes.items() if v != ""]
    return policy + (f" [{', '.join(shown)}]" if shown else "")
