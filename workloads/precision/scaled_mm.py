"""Real FP8 GEMMs through ``torch._scaled_mm``: the check that a policy's numbers do not depend on
fp8lab's emulator.

The emulator decodes both FP8 operands (codes times scales, one rounding to the compute dtype:
exact for power-of-two scales) and runs an ordinary BF16 GEMM. A real FP8 kernel takes the codes
and the scales themselves. ``scaled_matmul`` hands fp8lab's own codes and scales (an
``Fp8Tensor`` from the one codec) to ``torch._scaled_mm``, which on CPU (torch 2.13) accepts two
scale layouts only, tensorwise (0-d scales) and rowwise (``[M, 1]`` and ``[1, N]``):

- per-tensor or plain operands (scale 1), and per-row ones: one rowwise call, a per-tensor scale
  broadcast to a row vector. Never the tensorwise layout: its CPU kernel is ~2000x slower than the
  rowwise one (3.3 s against 1.4 ms for 512x128 @ 128x512, measured on a busy 2-core Xeon) for
  the same products and the same one FP32 multiply per output;
- block scales (1x128 activation/gradient tiles, 128x128 weight blocks): ``_scaled_mm`` has no
  block mode here ("Invalid scaling configuration"), so the GEMM is composed of per-K-block
  products. Within one 128-wide slice of the contraction dim both operands' scales vary only
  along M and N, i.e. are rowwise; each slice is one rowwise ``_scaled_mm`` into FP32, the
  slices are summed in FP32 and rounded once (DeepSeek-V3's blockwise GEMM promotes its partial
  sums to FP32 the same way).

``precision.gemm=scaled_mm`` (``enable_scaled_mm``) runs the GEMMs of fp8lab's own FP8 modules
(``linear.Fp8BaseLinear``, ``Fp8TiedLinear``, ``Fp8LoraLinear``) this way. Shapes a GPU FP8 kernel
cannot take -- contraction or output dim not a multiple of 16, e.g. a rank-8 LoRA GEMM -- and
GEMMs with an operand that is not FP8 fall back to the emulated GEMM (same casts, same codes),
logged once per module, GEMM and reason, and counted in ``ScaledMmGemm.counts``. CPU's
``_scaled_mm`` would take those shapes too; refusing them keeps the mode to what FP8 hardware runs.

Unverified on a GPU: CUDA's ``_scaled_mm`` is stricter (rowwise scales want a BF16 output, which
the per-K-block FP32 partial sums here do not use; no E5M2 x E5M2), so this mode is a CPU check.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

import torch
from torch import nn

from fp8lab_conf.contracts import GEMM_MODES
from workloads.precision import cpu_gemm
from workloads.precision.scaling import Fp8Tensor

__all__ = [
    "GEMM_MODES",
    "Operand",
    "ScaledMmGemm",
    "enable_scaled_mm",
    "gemm_problems",
    "gemm_nt",
    "scaled_matmul",
    "transpose",
    "transpose_operand",
    "unsupported",
]

log = logging.getLogger(__name__)

_ALIGN = 16  # FP8 tensor-core GEMMs (cuBLASLt, and torch._scaled_mm on CUDA) need K, N % 16


def transpose(q: Fp8Tensor) -> Fp8Tensor:
    """The same FP8 tensor, transposed (2-D): codes, per-tile scales and tile shape alike."""
    if q.rotation is not None:  # rotated along its own last dim: the transpose has no such form
        raise ValueError("scaled_mm.transpose: a Hadamard-rotated FP8 tensor cannot be transposed")
    s = q.scale_inv
    tiled = s is not None and s.dim() > 0
    return Fp8Tensor(
        q.data.t(),
        s.t() if tiled else s,
        tuple(reversed(q.tile)) if (tiled and q.tile is not None) else q.tile,
        q.may_have_nan,
    )


Operand = Fp8Tensor | torch.Tensor  # FP8 codes + scales, or a compute-dtype tensor (not cast)


def transpose_operand(op: Operand) -> Operand:
    """``transpose`` for an FP8 operand, ``.t()`` for a plain one."""
    return transpose(op) if isinstance(op, Fp8Tensor) else op.t()


def gemm_nt(real: ScaledMmGemm, a: Operand, b: Operand, dtype: torch.dtype, gemm: str) -> torch.Tensor:
    """``a [M, K] @ b [N, K]^T`` in ``dtype``: a real FP8 GEMM when both operands are FP8 and the
    shape allows, else the emulated GEMM on the very same operands (decoded by the one codec)."""
    fp8 = isinstance(a, Fp8Tensor) and isinstance(b, Fp8Tensor)
    out = real.mm(a if fp8 else None, b if fp8 else None, dtype, gemm)
    if out is None:
        out = cpu_gemm.linear(_decoded(a, dtype), _decoded(b, dtype))
    return out


def _decoded(op: Operand, dtype: torch.dtype) -> torch.Tensor:
    return op.dequantize(dtype) if isinstance(op, Fp8Tensor) else op.to(dtype)


def _k_width(q: Fp8Tensor) -> int | None:
    """How many contraction-dim columns one scale of ``q`` covers (None: all of them)."""
    s = q.scale_inv
    if s is None or s.dim() == 0 or q.tile is None:
        return None
    return q.tile[1]


def _chunk(a: Fp8Tensor, b: Fp8Tensor) -> int:
    """The K slice within which both operands' scales are constant along K."""
    widths = [w for w in (_k_width(a), _k_width(b)) if w is not None]
    k = a.data.shape[1]
    return k if not widths else min(k, math.gcd(*widths))


def unsupported(a: Fp8Tensor, b: Fp8Tensor) -> str | None:
    """Why ``a [M, K] @ b [N, K]^T`` cannot run as a real FP8 GEMM, or None when it can."""
    (_, k), (n, k_b) = a.data.shape, b.data.shape
    if k != k_b:
        raise ValueError(f"scaled_matmul: contraction dims differ ({k} vs {k_b})")
    if k % _ALIGN or n % _ALIGN:
        return f"K={k}, N={n}: both must be multiples of {_ALIGN}"
    if a.rotation is not None or b.rotation is not None:
        return "a Hadamard-rotated operand (its partner is not rotated: decoded instead)"
    chunk = _chunk(a, b)
    if chunk % _ALIGN:
        return f"scales change every {chunk} columns of K: not a multiple of {_ALIGN}"
    return None


def _row_scales(q: Fp8Tensor, k0: int) -> torch.Tensor:
    """``q``'s scales for the K slice starting at ``k0``, one per row of ``q`` (FP32)."""
    s = q.scale_inv
    device, rows = q.data.device, q.data.shape[0]
    if s is None:
        s = torch.ones((), dtype=torch.float32, device=device)
    if s.dim() == 0:
        return s.float().expand(rows)
    br, bc = q.tile
    return s[:, k0 // bc].float().repeat_interleave(br)[:rows]


def scaled_matmul(a: Fp8Tensor, b: Fp8Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``decode(a) @ decode(b)^T`` for 2-D FP8 ``a [M, K]`` and ``b [N, K]`` by ``torch._scaled_mm``
    (module docstring); tiles and scales are in each operand's own ``[rows, K]`` layout.
    Callers check ``unsupported`` first for the shapes FP8 hardware takes; this runs any shape."""
    (m, k), n = a.data.shape, b.data.shape[0]
    chunk = _chunk(a, b)
    a_data = a.data.contiguous()  # row-major A; B column-major, as cuBLASLt wants it
    b_data = b.data.contiguous()
    if chunk >= k:
        return _mm(a_data, b_data, a, b, 0, out_dtype)
    out = torch.zeros((m, n), dtype=torch.float32, device=a.data.device)
    for k0 in range(0, k, chunk):
        cols = slice(k0, k0 + chunk)
        out += _mm(a_data[:, cols].contiguous(), b_data[:, cols].contiguous(), a, b, k0, torch.float32)
    return out.to(out_dtype)


def _mm(
    a_data: torch.Tensor,
    b_data: torch.Tensor,
    a: Fp8Tensor,
    b: Fp8Tensor,
    k0: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """One rowwise ``_scaled_mm`` call on a K slice."""
    sa = _row_scales(a, k0).reshape(-1, 1).contiguous()
    sb = _row_scales(b, k0).reshape(1, -1).contiguous()
    return torch._scaled_mm(a_data, b_data.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)


class ScaledMmGemm:
    """One module's real-GEMM switch (``mod.real_gemm``): runs a GEMM through ``scaled_matmul``
    or says it falls back, logging each (GEMM, reason) once; ``counts`` tallies both."""

    def __init__(self, name: str, logged: set[tuple[str, str]] | None = None) -> None:
        self.name = name
        self.counts: Counter[str] = Counter()
        # shared by every module of one model: each (GEMM, reason) is logged once per model,
        # not once per layer (a rank-8 LoRA falls back in every adapter alike)
        self._logged = set() if logged is None else logged

    def mm(
        self, a: Fp8Tensor | None, b: Fp8Tensor | None, out_dtype: torch.dtype, gemm: str
    ) -> torch.Tensor | None:
        """``decode(a) @ decode(b)^T`` as a real FP8 GEMM, or None when the caller must run the
        emulated GEMM (an operand not FP8, or a shape FP8 hardware cannot take)."""
        reason = "an operand is not FP8" if a is None or b is None else unsupported(a, b)
        if reason is not None:
            self.fallback(gemm, reason)
            return None
        self.counts["scaled_mm"] += 1
        return scaled_matmul(a, b, out_dtype)

    def fallback(self, gemm: str, reason: str) -> None:
        self.counts["fallback"] += 1
        if (gemm, reason) not in self._logged:
            self._logged.add((gemm, reason))
            log.warning(
                "precision.gemm=scaled_mm: %s GEMM runs emulated (%s), first at %s; every module "
                "of that shape alike", gemm, reason, self.name
            )


def gemm_problems(gemm: str, policy: Any, backend: str) -> list[str]:
    """Why ``precision.gemm`` cannot be honoured for ``policy`` on ``backend`` (preflight):
    ``scaled_mm`` needs an FP8 GEMM that fp8lab itself runs, and torchao / TE run the base GEMMs
    themselves (their LoRA FP8 GEMMs, ``lora_gemm=fp8``, are still fp8lab's)."""
    if gemm not in GEMM_MODES:
        return [f"precision.gemm={gemm!r}: not one of {', '.join(GEMM_MODES)}"]
    if gemm != "scaled_mm" or policy.lora_gemm == "fp8":
        return []
    base = any(s.enabled for s in (policy.base_weight, policy.base_activation, policy.base_dgrad))
    if (base or policy.lm_head_fp8) and backend in ("emulated", "auto"):
        return []
    who = "has no FP8 GEMM" if not base else f"has its base GEMMs run by backend {backend}"
    fix = "precision.gemm=emulated" + ("" if not base else ", or precision.backend=emulated")
    return [f"precision.gemm=scaled_mm: policy {policy.name!r} {who}, so no FP8 GEMM of fp8lab's own "
            f"is left to run for real (fix: {fix})"]


def enable_scaled_mm(model: nn.Module) -> list[dict[str, Any]]:
    """Switch every fp8lab FP8 module of ``model`` to real FP8 GEMMs (``precision.gemm=scaled_mm``);
    returns one plan row per module. Refused (ValueError) when the model has none."""
    from workloads.precision.linear import Fp8BaseLinear, Fp8LoraLinear, Fp8TiedLinear

    rows: list[dict[str, Any]] = []
    logged: set[tuple[str, str]] = set()
    for name, mod in model.named_modules():
        if isinstance(mod, (Fp8BaseLinear, Fp8TiedLinear, Fp8LoraLinear)):
            mod.real_gemm = ScaledMmGemm(getattr(mod, "name", "") or name, logged)
            rows.append({"module": mod.real_gemm.name, "role": "gemm", "tensor": "all",
                         "format": "scaled_mm", "note": "torch._scaled_mm where the shape allows;"
                         " fallbacks logged"})  # fmt: skip
    if not rows:
        raise ValueError(
            "precision.gemm=scaled_mm: this policy has no FP8 GEMM of fp8lab's own to run for "
            "real; fix: precision.gemm=emulated"
        )
    return rows
