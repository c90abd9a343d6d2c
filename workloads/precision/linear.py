"""Emulated FP8 linear layers: quantize-dequantize with torch's float8 dtypes, GEMM in BF16.

- ``Fp8BaseLinear`` replaces a frozen base ``nn.Linear`` (PEFT's ``base_layer``). Its weight is
  *stored* as float8 plus FP32 scales, so base-weight memory really shrinks; every forward
  dequantizes it (O(out*in), cheap next to the O(tokens*out*in) GEMM) instead of caching a BF16
  copy, which would undo the saving. The base is frozen, so backward computes only dgrad and
  saves no activations at all.
- ``Fp8LoraLinear`` is an FP8 LoRA A/B GEMM (``lora_gemm='fp8'``, as a stock FP8 conversion
  does to every linear): a trainable ``.weight`` Parameter (PEFT and the optimizer see an
  ordinary nn.Linear), E4M3 casts of input and weight forward, an E5M2 cast of the incoming
  gradient backward (plain or per-tensor current scaling), dgrad and wgrad both from the FP8
  operands.
- ``LoraComputeLinear`` is the protected/bf16 LoRA GEMM: FP32 master weight, BF16 compute.

With ``precision.gemm=scaled_mm`` (``scaled_mm.enable_scaled_mm`` sets ``real_gemm`` on each
module) the same casts feed their FP8 codes and scales to ``torch._scaled_mm`` instead of a BF16
GEMM of the decoded values, where the shape allows (``CastSite.operand``, ``weight_operand``).

Speed (the emulation is benchmarked against BF16): tiles are reshapes/views, never Python
loops; power-of-two scales are applied in BF16 without FP32 copies; temporaries are reused in
place; E4M3 decoding avoids torch's slow CPU kernel (formats.decode_fp32) and folds the
decode factor into the scale multiply; nothing forces a device->host sync.

Caveat: with activation checkpointing the recomputed forward casts again, so delayed-scaling
histories see that micro-batch twice and telemetry counts its activations twice (percentages
are unaffected).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from workloads.precision import cpu_gemm
from workloads.precision.formats import has_nan_code
from workloads.precision.scaled_mm import Operand, ScaledMmGemm, gemm_nt, transpose_operand
from workloads.precision.scaling import CastSpec, Fp8Tensor, Role, ScalingRecipe, TensorScaler
from workloads.precision.telemetry import Fp8Telemetry, cast_stats

__all__ = [
    "CastSite",
    "Fp8BaseLinear",
    "Fp8TiedLinear",
    "Fp8LoraLinear",
    "LoraComputeLinear",
]


class CastSite:
    """One place where one tensor of one layer is cast (e.g. the input of ``layers.0.q_proj``).

    Holds the scaler state for that tensor and reports to telemetry when it is recording. In
    calibration mode it only observes amax and returns the tensor in high precision (TE's
    ``calibrating=True``).
    """

    def __init__(
        self,
        spec: CastSpec,
        role: Role,
        layer: str,
        kind: str,
        telemetry: Fp8Telemetry | None,
    ) -> None:
        self.spec = spec
        self.layer = layer
        self.kind = kind
        self.telemetry = telemetry
        self.scaler = TensorScaler(spec.recipe, spec.format, role) if spec.enabled else None

    def __call__(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        scaler = self.scaler
        if scaler is None:
            return x.to(dtype)
        if scaler.calibrating:
            scaler.observe(x)
            return x.to(dtype)
        tel = self.telemetry
        recording = tel is not None and tel.recording
        if scaler.kind.shared_cast:  # siblings fed the same x share one cast
            return _SHARED_CASTS.get(x, dtype, self, recording)
        return self.uncached(x, dtype, recording)

    def uncached(self, x: torch.Tensor, dtype: torch.dtype, recording: bool) -> torch.Tensor:
        """This site's own cast of ``x`` (reported to telemetry when ``recording``)."""
        if not recording:
            return self.scaler.quantize_dequantize(x, dtype)
        x_dq, stats = self.cast_with_stats(x, dtype)
        self.telemetry.record_stats(self.layer, self.kind, x.numel(), stats)
        _what_if(self.telemetry, self.layer, self.kind, x)
        return x_dq

    def cast_with_stats(self, x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
        """The cast of a recorded step: quantize, dequantize and the telemetry stats vector
        (or, for a small tensor, its deferred entry: ``Fp8Telemetry.measure``).

        A cast of at least ``batch_below_numel`` elements under a per-tensor recipe, where compiled
        kernels serve the device, runs one compiled loop for the cast and its statistics
        (``TensorScaler.quantize_dequantize_measured``: the codes, scales, decoded values and
        history of the unfused path, and its row; in a training step on a 2-core Xeon, ~10 ms
        less per recorded fp8_naive step than the eager quantize, decode and reductions)."""
        scaler, tel = self.scaler, self.telemetry
        if x.numel() >= tel.batch_below_numel:  # small casts are deferred and batched instead
            measured = scaler.quantize_dequantize_measured(x, dtype)
            if measured is not None:
                x_dq, row, saturated = measured
                return x_dq, tel.measured(x, x_dq, scaler.scale_inv, row, saturated)
        _, x_dq, stats = self._quantize_with_stats(x, dtype)
        return x_dq, stats

    def _quantize_with_stats(
        self, x: torch.Tensor, dtype: torch.dtype
    ) -> tuple[Fp8Tensor, torch.Tensor, Any]:
        scaler = self.scaler
        q, saturated = scaler.quantize(x, count_saturated=True)
        x_dq = q.dequantize(dtype)
        stats = self.telemetry.measure(x, x_dq, q.scale_inv, saturated, q.data, not q.may_have_nan,
                                       amax=scaler.last_amax)  # fmt: skip
        return q, x_dq, stats

    def operand(self, x: torch.Tensor, dtype: torch.dtype) -> Operand:
        """This site's GEMM operand for a real FP8 GEMM (``precision.gemm=scaled_mm``): the FP8
        codes and scales themselves, not their decoded copy; ``x`` in ``dtype`` when the site
        does not cast (disabled, or calibrating: then it only observes, as ``__call__`` does).
        Telemetry records the same row as on the emulated path."""
        scaler = self.scaler
        if scaler is None or scaler.calibrating:
            return self(x, dtype)
        tel = self.telemetry
        if tel is None or not tel.recording:
            return scaler.quantize(x)[0]
        q, _, stats = self._quantize_with_stats(x, dtype)
        tel.record_stats(self.layer, self.kind, x.numel(), stats)
        _what_if(tel, self.layer, self.kind, x)
        return q


class _SharedCastCache:
    """The last few stateless casts (plain or per-tensor current scaling), keyed by the input
    tensor itself.

    A stateless cast is a pure function of its input, format and recipe, and PEFT feeds the very
    same tensor to a base linear and its ``lora_A`` (and attention feeds one tensor to q, k and
    v): a policy that casts every GEMM input would cast one activation six times. An entry is
    valid while the input is the same live object at the same version (``_version`` counts
    in-place writes); it holds the input only weakly. A few entries, because q's ``lora_B``
    input comes between q's and k's casts of the shared input. On a hit the sibling's scaler
    gets the same ``scale_inv`` it would have computed, so its state is as without the cache.
    Unit tests compare the shared results with uncached casts bit for bit.
    """

    SIZE = 4

    def __init__(self) -> None:
        self._entries: list[tuple[tuple[Any, ...], weakref.ref, torch.Tensor, Any, Any]] = []

    def get(self, x: torch.Tensor, dtype: torch.dtype, site: CastSite, recording: bool) -> torch.Tensor:
        """``site``'s cast of ``x``; on a recorded step also its telemetry row (the shared
        cast's stats are the same numbers, so they are computed once too)."""
        scaler = site.scaler
        if x.is_inference():  # inference-mode tensors have no version counter: no sharing
            return site.uncached(x, dtype, recording)
        key = (x._version, x.shape, x.stride(), x.storage_offset(), x.dtype, dtype,
               scaler.fmt.name, scaler.recipe, recording)  # fmt: skip
        for entry_key, ref, value, scale_inv, stats in self._entries:
            if ref() is x and entry_key == key:
                scaler.scale_inv = scale_inv
                break
        else:
            if recording:
                value, stats = site.cast_with_stats(x, dtype)
            else:
                value, stats = scaler.quantize_dequantize(x, dtype), None
            self._entries = [e for e in self._entries if e[1]() is not None][-(self.SIZE - 1) :]
            self._entries.append((key, weakref.ref(x), value, scaler.scale_inv, stats))
        if recording:
            site.telemetry.record_stats(site.layer, site.kind, x.numel(), stats)
            _what_if(site.telemetry, site.layer, site.kind, x)
        return value

    def clear(self) -> None:
        self._entries.clear()


_SHARED_CASTS = _SharedCastCache()


class _FrozenCast:
    """The compute-dtype result of casting a frozen weight, kept while the weight is unchanged.

    The stock recipes cast a high-precision weight to FP8 for every GEMM; a frozen weight gives
    the same bits every time, so the emulator computes the cast once and reuses it (an
    implementation detail, see docs/policies.md: the policy still means a per-GEMM cast). The
    entry is keyed by the source tensor's identity, storage, ``_version`` (in-place writes, e.g.
    ``load_state_dict``), device and dtype, so any change recomputes it.
    """

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._value: torch.Tensor | None = None

    def get(self, source: torch.Tensor, dtype: torch.dtype, compute: Any) -> torch.Tensor:
        key = (id(source), source.data_ptr(), source._version, source.device, dtype)
        if self._value is None or self._key != key:
            self._value = compute()
            self._key = key
        return self._value


class _BaseLinearFn(torch.autograd.Function):
    """y = cast(x) @ W_q^T (+ b); backward: dx = cast_e5m2(dy) @ W_q. No wgrad: base is frozen."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mod: Fp8BaseLinear) -> torch.Tensor:
        ctx.mod = mod
        ctx.x_dtype = x.dtype
        if mod.real_gemm is not None:  # precision.gemm=scaled_mm
            x2d = x.reshape(-1, x.shape[-1])
            x_op = mod.act_cast.operand(x2d, mod.compute_dtype)
            out = gemm_nt(mod.real_gemm, x_op, mod.weight_operand(), mod.compute_dtype, "forward")
            out = out if mod.bias is None else out + mod.bias
            return out.reshape(*x.shape[:-1], out.shape[-1])
        x_c = mod.act_cast(x, mod.compute_dtype)
        return cpu_gemm.linear(x_c, mod.dequantized_weight(), mod.bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        mod: Fp8BaseLinear = ctx.mod
        if mod.real_gemm is not None:  # g [M, N] @ W [N, K]: the second operand is W^T
            g2d = grad_out.reshape(-1, grad_out.shape[-1])
            g_op = mod.dgrad_cast.operand(g2d, mod.compute_dtype)
            w_t = transpose_operand(mod.weight_operand())
            dx = gemm_nt(mod.real_gemm, g_op, w_t, mod.compute_dtype, "dgrad")
            return dx.reshape(*grad_out.shape[:-1], dx.shape[-1]).to(ctx.x_dtype), None
        g = mod.dgrad_cast(grad_out, mod.compute_dtype)
        return cpu_gemm.matmul(g, mod.dequantized_weight()).to(ctx.x_dtype), None


class Fp8BaseLinear(nn.Module):
    """A frozen linear whose weight, input and incoming gradient are cast per three CastSpecs.

    ``weight`` with ``fmt=None`` keeps a compute-dtype weight (e.g. an ablation that only casts
    activations); otherwise the weight lives in the ``weight_fp8`` buffer plus ``weight_scale_inv``
    (None for a plain cast, 0-d for per-tensor, [ceil(out/128), ceil(in/128)] for block).
    ``store_fp8=False`` is the stock recipes' storage: the compute-dtype ``weight_hp`` is the
    weight, cast to FP8 for every GEMM. The weight is frozen, so that cast is the same each time
    and is computed once: ``weight_fp8``, plus its decoded compute-dtype copy (``_FrozenCast``),
    caches that ``storage_bytes`` does not count, recomputed if ``weight_hp`` is written to.
    """

    _FIXED_DTYPE_BUFFERS = ("weight_fp8", "weight_scale_inv")
    real_gemm: ScaledMmGemm | None = None  # set by scaled_mm.enable_scaled_mm

    def __init__(
        self,
        linear: nn.Linear,
        *,
        weight: CastSpec,
        activation: CastSpec,
        dgrad: CastSpec,
        name: str = "",
        telemetry: Fp8Telemetry | None = None,
        compute_dtype: torch.dtype = torch.bfloat16,
        store_fp8: bool = True,
    ) -> None:
        super().__init__()
        self.store_fp8 = store_fp8
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.name = name
        self.compute_dtype = compute_dtype
        self.weight_spec = weight
        self.activation_spec = activation
        self.dgrad_spec = dgrad
        self._weight_tile: tuple[int, int] | None = None
        self._store_weight(linear.weight.detach(), weight, telemetry)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(compute_dtype))
        self.act_cast = CastSite(activation, "activation", name, "activation", telemetry)
        self.dgrad_cast = CastSite(dgrad, "grad", name, "dgrad", telemetry)

    def _store_weight(
        self, w: torch.Tensor, spec: CastSpec, telemetry: Fp8Telemetry | None
    ) -> None:
        if not spec.enabled or not self.store_fp8:
            self.register_buffer("weight_hp", w.to(self.compute_dtype))
            self._weight_cast = _FrozenCast()
        if not spec.enabled:
            return
        if not self.store_fp8:  # the stock recipe casts the compute-dtype weight, not its source
            w = self.weight_hp  # (an FP32 source cast directly differs where BF16 double-rounds)
        q, saturated = self._quantize_weight(w, spec)
        if telemetry is not None:  # frozen: stats once, emitted on every recorded step
            _register_weight_stats(self.name, w, q, saturated, not self._weight_has_nan, telemetry)

    def _quantize_weight(self, w: torch.Tensor, spec: CastSpec) -> tuple[Fp8Tensor, Any]:
        """Quantize ``w`` into the ``weight_fp8``/``weight_scale_inv`` buffers."""
        scaler = TensorScaler(spec.recipe, spec.format, "weight")
        q, saturated = scaler.quantize(w, count_saturated=True)
        self.register_buffer("weight_fp8", q.data)
        self.register_buffer("weight_scale_inv", q.scale_inv)
        self._weight_tile = q.tile
        # SYNC: once at conversion -- lets every later decode skip the NaN-code fix-up. Checked
        # on the codes: no decoded copy of the weight, whose size would set the peak memory.
        self._weight_has_nan = has_nan_code(q.data)
        if not self.store_fp8:  # the FP8 copy is a cast of weight_hp at this version
            self._weight_source = (weakref.ref(self.weight_hp), self.weight_hp._version)
        return q, saturated

    @property
    def weight_is_fp8(self) -> bool:
        """The weight is *stored* as FP8 (else it is kept in the compute dtype)."""
        return self.weight_spec.enabled and self.store_fp8

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight as the GEMM sees it, in ``dtype`` (default: the compute dtype).

        FP8 storage decodes it per GEMM (a cached copy would undo the memory saving); with
        ``store_fp8=False`` the frozen weight's cast is kept in the compute dtype (``_FrozenCast``).
        """
        dtype = dtype or self.compute_dtype
        if not self.weight_spec.enabled:
            return self.weight_hp.to(dtype)
        if not self.store_fp8:
            return self._weight_cast.get(self.weight_hp, dtype, lambda: self._cast_weight_hp(dtype))
        return self._decode_stored(dtype)

    def _cast_weight_hp(self, dtype: torch.dtype) -> torch.Tensor:
        """Cast ``weight_hp`` again when it changed since the FP8 copy was made, then decode."""
        self._refresh_weight_cast()
        return self._decode_stored(dtype)

    def _refresh_weight_cast(self) -> None:
        src, seen = self.weight_hp, self._weight_source
        if seen[0]() is src and seen[1] != src._version:  # written to in place: cast again
            self._quantize_weight(src, self.weight_spec)
        self._weight_source = (weakref.ref(src), src._version)  # a device move carries the codes

    def weight_operand(self) -> Operand:
        """The weight as a real FP8 GEMM takes it: codes and scales (compute dtype if not FP8)."""
        if not self.weight_spec.enabled:
            return self.weight_hp.to(self.compute_dtype)
        if not self.store_fp8:
            self._refresh_weight_cast()
        return self._stored()

    def _stored(self) -> Fp8Tensor:
        return Fp8Tensor(self.weight_fp8, self.weight_scale_inv, self._weight_tile, self._weight_has_nan)

    def _decode_stored(self, dtype: torch.dtype) -> torch.Tensor:
        return self._stored().dequantize(dtype)

    @property
    def weight(self) -> torch.Tensor:
        """Dequantized copy for code that reads ``.weight`` (PEFT, HF); costs a dequantize."""
        return self.dequantized_weight()

    def storage_bytes(self) -> int:
        """Bytes the policy holds for the weight: FP8 data + FP32 scales, or the compute-dtype
        weight (with ``store_fp8=False`` the FP8 copy is the emulation's cache of a cast that
        is the same every GEMM, as the weight is frozen; it is not counted)."""
        if not self.weight_is_fp8:
            return self.weight_hp.nbytes
        scales = self.weight_scale_inv
        return self.weight_fp8.nbytes + (0 if scales is None else scales.nbytes)

    def cast_sites(self) -> list[CastSite]:
        return [self.act_cast, self.dgrad_cast]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _BaseLinearFn.apply(x, self)

    def _apply(self, fn: Any, recurse: bool = True) -> Fp8BaseLinear:
        """Follow device moves but never dtype casts: ``model.to(bfloat16)`` must not turn the
        float8 storage or the FP32 scales into BF16 (the storage format is the policy's)."""
        fixed = {k: self._buffers.pop(k) for k in self._FIXED_DTYPE_BUFFERS if k in self._buffers}
        super()._apply(fn, recurse)
        for key, buf in fixed.items():
            if buf is not None:
                target = fn(torch.empty(0, device=buf.device)).device
                buf = buf.to(target)
            self._buffers[key] = buf
        return self

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"weight={self.weight_spec.tag}, activation={self.activation_spec.tag}, "
            f"dgrad={self.dgrad_spec.tag}, bias={self.bias is not None}"
        )


def _register_weight_stats(
    name: str, w: torch.Tensor, q: Fp8Tensor, saturated: Any, nan_free: bool, tel: Fp8Telemetry
) -> None:
    """A frozen weight's cast never changes: its stats are computed once, reported every step."""
    x_dq = q.dequantize(w.dtype if w.dtype in (torch.bfloat16, torch.float32) else torch.float32)
    stats = cast_stats(w, x_dq, q.scale_inv, saturated, q.data, nan_free)
    tel.register_static(name, "weight", stats, w.numel())
    if tel.whatif is not None:
        tel.whatif.observe_static(name, "weight", w)


def _what_if(tel: Fp8Telemetry, layer: str, kind: str, x: torch.Tensor) -> None:
    """The what-if hook of a recorded cast (``whatif.py``; off unless the trial asks for it)."""
    if tel.whatif is not None:
        tel.whatif.observe(layer, kind, x)


class Fp8TiedLinear(nn.Linear):
    """An FP8 lm_head whose weight *is* the input embedding (GPT-2, Gemma, Llama-3.2-1B ...).

    The stock-recipe way: the high-precision weight Parameter stays shared and is cast per GEMM
    (torchao's Float8Linear does the same), so the tie survives -- ``tie_weights()`` (lm-eval's
    HFLM calls it) re-assigns ``.weight`` and finds an ordinary Parameter. Same autograd
    function, casts and telemetry as ``Fp8BaseLinear``; only the weight storage differs.
    """

    def __init__(
        self,
        linear: nn.Linear,
        *,
        weight: CastSpec,
        activation: CastSpec,
        dgrad: CastSpec,
        name: str = "",
        telemetry: Fp8Telemetry | None = None,
        compute_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the shared Parameter itself
        self.bias = linear.bias
        self.name = name
        self.compute_dtype = compute_dtype
        self.weight_spec = weight
        self._weight_scaler = (
            TensorScaler(weight.recipe, weight.format, "weight") if weight.enabled else None
        )
        self._weight_cast = _FrozenCast()
        self.real_gemm: ScaledMmGemm | None = None  # set by scaled_mm.enable_scaled_mm
        self.act_cast = CastSite(activation, "activation", name, "activation", telemetry)
        self.dgrad_cast = CastSite(dgrad, "grad", name, "dgrad", telemetry)
        if telemetry is not None and self._weight_scaler is not None:
            w = self.weight.detach()
            q, saturated = self._weight_scaler.quantize(w, count_saturated=True)
            _register_weight_stats(name, w, q, saturated, False, telemetry)

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The per-GEMM cast of the shared weight; frozen, so computed once (``_FrozenCast``)."""
        w, dtype = self.weight.detach(), dtype or self.compute_dtype
        scaler = self._weight_scaler
        if scaler is None:
            return w.to(dtype)
        if self.weight.requires_grad:  # not frozen after all: cast every time
            return scaler.quantize_dequantize(w, dtype)
        return self._weight_cast.get(self.weight, dtype, lambda: scaler.quantize_dequantize(w, dtype))

    def weight_operand(self) -> Operand:
        """The per-GEMM cast of the shared weight as codes and scales (real FP8 GEMMs)."""
        scaler = self._weight_scaler
        w = self.weight.detach()
        return w.to(self.compute_dtype) if scaler is None else scaler.quantize(w)[0]

    def cast_sites(self) -> list[CastSite]:
        return [self.act_cast, self.dgrad_cast]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _BaseLinearFn.apply(x, self)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, weight={self.weight_spec.tag} cast per GEMM (tied)"


class _LoraFp8Fn(torch.autograd.Function):
    """y = q(x) @ q(W)^T; backward: dx = q(dy) @ q(W), dW = q(dy)^T @ q(x) (all plain casts)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, mod: Fp8LoraLinear
    ) -> torch.Tensor:
        cd = mod.compute_dtype
        ctx.mod, ctx.x_dtype, ctx.w_dtype = mod, x.dtype, weight.dtype
        if mod.real_gemm is not None:  # precision.gemm=scaled_mm: keep the FP8 operands
            x2d = x.reshape(-1, x.shape[-1])
            ctx.ops = (mod.act_cast.operand(x2d, cd), mod.weight_cast.operand(weight, cd))
            out = gemm_nt(mod.real_gemm, *ctx.ops, cd, "forward")
            return out.reshape(*x.shape[:-1], out.shape[-1])
        x_q = mod.act_cast(x, cd)
        w_q = mod.weight_cast(weight, cd)
        ctx.save_for_backward(x_q, w_q)
        return cpu_gemm.linear(x_q, w_q)

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        mod: Fp8LoraLinear = ctx.mod
        if mod.real_gemm is not None:
            return _LoraFp8Fn.real_backward(ctx, mod, grad_out)
        x_q, w_q = ctx.saved_tensors
        g = mod.grad_cast(grad_out, mod.compute_dtype)
        dx = cpu_gemm.matmul(g, w_q).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            g2d = g.reshape(-1, g.shape[-1])
            dw = cpu_gemm.matmul(g2d.t(), x_q.reshape(-1, x_q.shape[-1])).to(ctx.w_dtype)
        return dx, dw, None

    @staticmethod
    def real_backward(
        ctx: Any, mod: Fp8LoraLinear, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        """dx = g @ W (second operand W^T), dW = g^T @ x (second operand x^T), real FP8 GEMMs."""
        (x_op, w_op), cd, real = ctx.ops, mod.compute_dtype, mod.real_gemm
        del ctx.ops  # no reference cycle through ctx keeps the operands alive
        g_op = mod.grad_cast.operand(grad_out.reshape(-1, grad_out.shape[-1]), cd)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = gemm_nt(real, g_op, transpose_operand(w_op), cd, "dgrad")
            dx = dx.reshape(*grad_out.shape[:-1], dx.shape[-1]).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            g_t, x_t = transpose_operand(g_op), transpose_operand(x_op)
            dw = gemm_nt(real, g_t, x_t, cd, "wgrad").to(ctx.w_dtype)
        return dx, dw, None


class Fp8LoraLinear(nn.Linear):
    """An FP8 LoRA GEMM (see module docstring). Bias-free, like PEFT's lora_A/lora_B.

    ``scaling`` is the recipe kind of all three casts: ``none`` (plain) or ``current``;
    ``power_2_scale`` rounds their scales down to powers of two (False: exact fmax / amax).
    """

    real_gemm: ScaledMmGemm | None = None  # set by scaled_mm.enable_scaled_mm

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        name: str = "",
        telemetry: Fp8Telemetry | None = None,
        record_weight: bool = True,
        scaling: str = "none",
        power_2_scale: bool = True,
        compute_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.name = name
        self.compute_dtype = compute_dtype
        recipe = ScalingRecipe(scaling, power_2_scale=power_2_scale)
        e4m3, e5m2 = CastSpec("e4m3", recipe), CastSpec("e5m2", recipe)
        self.act_cast = CastSite(e4m3, "activation", name, "activation", telemetry)
        # With plain FP8 storage the weight is already E4M3-exact and its cast is the identity;
        # its rounding is reported once per step as kind 'lora_weight' instead (apply.after_step).
        self.weight_cast = CastSite(
            e4m3, "weight", name, "weight", telemetry if record_weight else None
        )
        self.grad_cast = CastSite(e5m2, "grad", name, "dgrad", telemetry)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs: Any) -> Fp8LoraLinear:
        if linear.bias is not None:
            raise ValueError("Fp8LoraLinear is for bias-free LoRA A/B matrices")
        mod = cls(linear.in_features, linear.out_features, device=linear.weight.device, **kwargs)
        with torch.no_grad():
            mod.weight.copy_(linear.weight)
        return mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LoraFp8Fn.apply(x, self.weight, self)


class LoraComputeLinear(nn.Linear):
    """A LoRA matrix with an FP32 master weight whose GEMMs run in the compute dtype (BF16).

    Autograd casts the BF16 weight gradient back to FP32 for the master. This keeps PEFT's
    ``lora_B(lora_A(x))`` in BF16 even though the parameters are FP32 (PEFT alone would upcast
    the activations and run the adapter GEMMs in FP32).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        compute_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.compute_dtype = compute_dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear, compute_dtype: torch.dtype) -> LoraComputeLinear:
        mod = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            compute_dtype=compute_dtype,
            device=linear.weight.device,
        )
        with torch.no_grad():
            mod.weight.copy_(linear.weight)
            if linear.bias is not None:
                mod.bias.copy_(linear.bias)
        return mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cd = self.compute_dtype
        bias = None if self.bias is None else self.bias.to(cd)
        return cpu_gemm.linear(x.to(cd), self.weight.to(cd), bias)
