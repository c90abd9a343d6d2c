"""The emulation's fast paths compute exactly what the plain definition computes.

Reference = torch's own ops, one at a time: ``cast(x * scale)`` with ``nan_to_num`` + ``clamp`` +
torch's float8 conversion, then torch's float8 -> FP32 decode times ``1 / scale``. The fast
paths under test: the integer decoder (large CPU tensors), the host-side finiteness shortcut,
blockwise decoding of large tensors, the compiled kernels (``formats.FUSED``, skipped without a
C++ compiler) and the plain-cast cache of ``linear.CastSite``. Inputs are every BF16 value
(NaN, Inf, subnormals, both zeros) and all 256 FP8 codes.
"""

import math

import pytest
import torch

from workloads.precision import formats
from workloads.precision.formats import E4M3, E5M2, FUSED, decode
from workloads.precision.linear import CastSite
from workloads.precision.scaling import CastSpec, Fp8Tensor, ScalingRecipe, TensorScaler, expand_blocks

EVERY_BF16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
FMTS = [E4M3, E5M2]


def assert_same(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Bit-identical, except that any NaN matches any NaN."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    g, r = got[~nan], ref[~nan]
    assert torch.equal(g, r)
    assert torch.equal(torch.signbit(g), torch.signbit(r))  # -0 stays -0


def reference(x: torch.Tensor, fmt, scale: torch.Tensor | None, dtype: torch.dtype, power_2: bool = True):
    work = x if power_2 and x.dtype in (torch.bfloat16, torch.float32) else x.float()
    scaled = work if scale is None else work * scale.to(work.dtype)
    nan = float("nan")
    q = scaled.nan_to_num(nan, nan, nan).clamp(-fmt.max, fmt.max).to(fmt.dtype)
    y = q.float() if scale is None else q.float() * scale.reciprocal()
    return q, y.to(dtype)


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setattr(FUSED, "mode", "off")


@pytest.fixture
def fused(monkeypatch):
    if not FUSED._probe():
        pytest.skip("torch.compile has no C++ compiler here")
    monkeypatch.setattr(FUSED, "mode", "auto")
    monkeypatch.setattr(FUSED, "min_numel", 0)
    monkeypatch.setattr(FUSED, "_available", True)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_integer_decoder_matches_torch_for_every_code(fmt, dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(64).view(fmt.dtype)
    assert codes.numel() >= formats.SMALL_NUMEL  # the integer path, not torch's cast
    assert_same(decode(codes, dtype), codes.to(dtype))


SCALES = {"plain": None, "pow2": torch.tensor(2.0**-3), "pow2_big": torch.tensor(2.0**40)}


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@pytest.mark.parametrize("scale", list(SCALES), ids=str)
def test_eager_quantize_dequantize_of_every_bf16_value(eager, fmt, scale):
    recipe = ScalingRecipe("none" if scale == "plain" else "delayed", amax_history_len=1)
    scaler = TensorScaler(recipe, fmt, "activation")
    if SCALES[scale] is not None:  # delayed: the history decides the scale
        scaler.observe(torch.tensor(fmt.max / SCALES[scale].item()))
    ref_scale = scaler.scale(EVERY_BF16)
    q_ref, y_ref = reference(EVERY_BF16, fmt, ref_scale, torch.bfloat16)
    q, _ = scaler.quantize(EVERY_BF16)
    assert torch.equal(q.data.view(torch.uint8), q_ref.view(torch.uint8))
    assert_same(q.dequantize(torch.bfloat16), y_ref)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_eager_finite_shortcut_gives_the_same_codes(eager, fmt):
    x = torch.randn(256, 256, dtype=torch.bfloat16) * 1e-3  # finite: the shortcut runs
    for kind in ("none", "current", "delayed"):
        scaler = TensorScaler(ScalingRecipe(kind), fmt, "grad")
        scaler.observe(x * 4)
        scale = scaler.scale(x)
        q, _ = scaler.quantize(x)
        q_ref, y_ref = reference(x, fmt, scale, torch.bfloat16)
        assert not q.may_have_nan
        assert torch.equal(q.data.view(torch.uint8), q_ref.view(torch.uint8))
        assert_same(q.dequantize(torch.bfloat16), y_ref)


def test_blockwise_decode_of_a_large_weight(eager):
    w = torch.randn(1024, 640) * 0.02
    w[3, 5], w[900, 600] = math.nan, 7.0  # a NaN code and an outlier tile
    scaler = TensorScaler(ScalingRecipe("block"), E4M3, "weight")
    q, _ = scaler.quantize(w)
    ref = (q.data.float() * expand_blocks(q.scale_inv, (128, 128), q.data.shape)).to(torch.bfloat16)
    assert_same(q.dequantize(torch.bfloat16), ref)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@pytest.mark.parametrize("kind", ["none", "current", "delayed"])
def test_compiled_quantize_dequantize_of_every_bf16_value(fused, fmt, kind):
    scaler = TensorScaler(ScalingRecipe(kind, amax_history_len=2), fmt, "activation")
    scaler.observe(torch.tensor(3.0))
    twin = TensorScaler(ScalingRecipe(kind, amax_history_len=2), fmt, "activation")
    twin.observe(torch.tensor(3.0))
    x = EVERY_BF16[torch.isfinite(EVERY_BF16)] if kind == "current" else EVERY_BF16  # current: amax must be finite
    scale = scaler.scale(x)
    _, y_ref = reference(x, fmt, scale, torch.bfloat16)
    got = scaler.quantize_dequantize(x, torch.bfloat16)
    assert_same(got, y_ref)
    twin.quantize(x)  # the two-step path leaves the same history behind
    if scaler.amax_history is not None:
        assert_same(scaler.amax_history, twin.amax_history)


def test_compiled_power_2_product_overflow_matches_bf16_arithmetic(fused):
    x = torch.tensor([3.0e38, -3.0e38, 1.0, 2.0**-130], dtype=torch.bfloat16).repeat(8)
    scaler = TensorScaler(ScalingRecipe("delayed", amax_history_len=1), E4M3, "activation")
    scaler.observe(torch.tensor(2.0**-20))  # scale 2**28: the first two overflow BF16 -> NaN
    _, y_ref = reference(x, E4M3, scaler.scale(x), torch.bfloat16)
    assert_same(scaler.quantize_dequantize(x, torch.bfloat16), y_ref)


@pytest.mark.parametrize("recipe", ["block", "current", "none"])
def test_compiled_weight_decode(fused, recipe):
    w = torch.randn(256, 384) * 0.05
    w[0, 0] = math.nan
    q, _ = TensorScaler(ScalingRecipe(recipe), E4M3, "weight").quantize(w)
    if q.scale_inv is None:
        ref = q.data.float()
    elif q.scale_inv.dim() == 0:
        ref = q.data.float() * q.scale_inv
    else:
        ref = q.data.float() * expand_blocks(q.scale_inv, (128, 128), q.data.shape)
    assert_same(Fp8Tensor(q.data, q.scale_inv, q.tile).dequantize(torch.bfloat16), ref.to(torch.bfloat16))


def test_plain_cast_is_shared_by_sites_fed_the_same_tensor():
    a = CastSite(CastSpec("e4m3"), "activation", "a", "activation", None)
    b = CastSite(CastSpec("e4m3"), "activation", "b", "activation", None)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    first = a(x, torch.bfloat16)
    assert b(x, torch.bfloat16) is first  # same tensor, same version: one cast
    assert b(x.clone(), torch.bfloat16) is not first
    x.mul_(2)  # an in-place write bumps the version: cast again
    again = a(x, torch.bfloat16)
    assert again is not first
    assert_same(again, reference(x, E4M3, None, torch.bfloat16)[1])


def test_compiled_cast_stats_match_the_eager_ones(fused, monkeypatch):
    from workloads.precision.telemetry import cast_stats

    x = torch.randn(64, 96) * 1e-3
    x[0, :5] = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf])
    scaler = TensorScaler(ScalingRecipe("current"), E5M2, "grad")
    q, saturated = scaler.quantize(x, count_saturated=True)
    x_dq = q.dequantize(torch.float32)
    got = cast_stats(x, x_dq, q.scale_inv, saturated)
    monkeypatch.setattr(FUSED, "mode", "off")
    ref = cast_stats(x, x_dq, q.scale_inv, saturated)
    exact = [0, 1, 2, 3, 4, 6]  # counts, amax, scales
    assert_same(got[exact], ref[exact])
    assert got[5].item() == pytest.approx(ref[5].item(), rel=1e-5, nan_ok=True)


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("recipe", ["current", "delayed", "none"])
def test_recorded_cast_takes_the_compiled_path_with_the_same_numbers(fused, fmt, recipe, monkeypatch):
    """A recorded cast under a per-tensor recipe runs one compiled loop for the cast and its
    statistics (``TensorScaler.quantize_dequantize_measured``): the same decoded tensor, amax
    history and telemetry row as the unfused quantize, decode and stats it replaces, saturated
    elements included (delayed scaling from a small amax, and a plain cast of values above fmax)."""
    from workloads.precision.linear import CastSite
    from workloads.precision.scaling import CastSpec
    from workloads.precision.telemetry import Fp8Telemetry

    x = (torch.randn(96, 160, generator=torch.Generator().manual_seed(1)) * 3e-3).to(torch.bfloat16)
    x[0, :3] = torch.tensor([0.0, 1e-30, 5.0])
    if recipe == "none":
        x[1, :2] = torch.tensor([1e6, -7e4])  # above E4M3's and E5M2's max: saturated
    kernels = []
    real_run = FUSED.run
    monkeypatch.setattr(FUSED, "run", lambda fn, *args, **kw: kernels.append(fn) or real_run(fn, *args, **kw))
    rows, outputs, histories = [], [], []
    for compiled in (True, False):
        tel = Fp8Telemetry(batch_below_numel=0)
        spec = CastSpec(fmt.name, ScalingRecipe(recipe, power_2_scale=False, amax_history_len=2))
        site = CastSite(spec, "activation", "l", "activation", tel)
        site.scaler.observe(torch.tensor(0.01))  # delayed: x's 5.0 saturates
        tel.begin_step(0, record=True)
        if compiled:
            x_dq, stats = site.cast_with_stats(x, torch.bfloat16)
        else:
            _, x_dq, stats = site._quantize_with_stats(x, torch.bfloat16)
        tel.record_stats("l", "activation", x.numel(), stats)
        rows.append(tel.end_step().rows[0])
        outputs.append(x_dq)
        histories.append(site.scaler.amax_history)
        if compiled:  # the cast and its statistics: one compiled loop, nothing else compiled or eager-fused
            assert [k.__name__ for k in kernels] == ["_k_qdq_stats"]
    assert_same(outputs[0], outputs[1])
    if recipe == "delayed":
        assert_same(histories[0], histories[1])
    assert math.isnan(rows[0].pop("value")) and math.isnan(rows[1].pop("value"))  # casts carry no value
    assert rows[0] == rows[1] and rows[0]["underflow_pct"] > 0
    assert (rows[0]["overflow_pct"] > 0) == (recipe != "current")


def test_a_kernel_past_its_recompile_limit_falls_back_to_eager_with_a_warning(monkeypatch):
    """``_Fused.run`` compiles a kernel once per shape up to ``RECOMPILE_LIMIT`` variants; the next
    one raises instead of silently running the kernel's Python, and the process falls back to
    the eager path (None), with a warning. Real dynamo, with its eager backend (no C++ compile)."""
    monkeypatch.setattr(formats, "RECOMPILE_LIMIT", 2)
    real_compile = formats._compile
    monkeypatch.setattr(formats, "_compile", lambda fn, dynamic: real_compile(fn, dynamic, "eager"))
    fused = formats._Fused()
    fused.mode, fused._available = "auto", True

    def kernel(x: torch.Tensor) -> torch.Tensor:  # a fresh code object: dynamo's cache is per code
        return x * 2

    for n in (3, 4):
        assert torch.equal(fused.run(kernel, (torch.ones(n),), dynamic=False), torch.full((n,), 2.0))
    with pytest.warns(RuntimeWarning, match="compiled FP8 casts disabled"):
        assert fused.run(kernel, (torch.ones(5),), dynamic=False) is None
    assert fused._available is False
