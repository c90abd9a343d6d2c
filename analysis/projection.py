"""A roofline projection of a training step's time under BF16 and FP8 GEMM policies on a GPU.

Why a model at all: on CPU the FP8 backend is emulated, so measured speed says nothing about the
GPU a user will train on. The projection turns the step's real GEMM shapes (forward, dgrad and
wgrad of every linear, LoRA and lm_head included) and the casts each policy performs (bytes
read and written for amax and quantize) into time on a device profile taken from the vendor's
datasheet. Nothing in it is fitted to the published speed-ups it is checked against
(`benchmarks/projection_validation.py`): the two efficiencies below are fixed, a priori, for
every device, shape and policy, and a projection may only be shown once that check passes.

Pure Python (no torch): the report and `--best` may use it.

The model, per GEMM of shape M x K x N (tokens x in x out):
    gemm_s = max(2*M*K*N / (peak[format] * GEMM_EFFICIENCY), bytes / (hbm * BANDWIDTH_EFFICIENCY))
    + block scaling without native tensor-core support (Hopper): the per-128-K promotion of the
      partial sums, M*N*K/128 FP32 multiply-adds on the CUDA cores, not overlapped
and per FP8 operand a cast of `elements * cast_bytes` at HBM speed, where cast_bytes counts one
read of the BF16 source per pass (an amax pass for current scaling, the quantize pass) plus one
byte per FP8 copy written (Hopper's FP8 GEMM wants both operands K-major, so an operand used
both as-is and transposed is written twice). Other work of a step (attention, norms,
elementwise) is a roofline too: FLOPs on BF16 tensor cores, bytes at HBM speed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

GEMM_EFFICIENCY = 0.7  # share of the datasheet's dense peak a large cuBLAS GEMM sustains
BANDWIDTH_EFFICIENCY = 0.8  # share of datasheet HBM bandwidth a streaming elementwise kernel sustains
BF16_BYTES, FP8_BYTES = 2, 1
PROMOTION_BLOCK = 128  # K-elements between FP32 promotions of a block-scaled FP8 GEMM


@dataclass(frozen=True)
class Device:
    """Datasheet figures: dense (not sparse) tensor-core peaks, FP32 CUDA-core peak, HBM bandwidth."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    fp32_tflops: float
    hbm_tbps: float
    native_block_scaling: bool  # block-scaled FP8 in the tensor cores (Blackwell MXFP8), no promotion
    source: str


DEVICES: dict[str, Device] = {
    "H100": Device("H100 SXM", 989.4, 1978.9, 66.9, 3.35, False, "NVIDIA H100 Tensor Core GPU datasheet (SXM)"),
    "H200": Device("H200 SXM", 989.4, 1978.9, 66.9, 4.8, False, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    "H200-NVL": Device("H200 NVL", 835.5, 1670.5, 60.0, 4.8, False, "NVIDIA H200 Tensor Core GPU datasheet (NVL)"),
    "B200": Device("B200", 2250.0, 4500.0, 80.0, 8.0, True, "NVIDIA DGX/HGX B200 datasheet, per GPU"),
}


@dataclass(frozen=True)
class Cast:
    """How one GEMM operand reaches FP8. `kind`: none (stays BF16) | current | delayed | block |
    rowwise | stored (already FP8 in memory: frozen weights stored in E4M3, nothing to do per step).
    `copies`: FP8 copies written (2 = as-is and transposed); `elements` scaled by `share` (a
    weight cast once on a 1/N FSDP shard before a float8 all-gather)."""

    kind: str = "none"
    copies: int = 1
    share: float = 1.0

    def passes(self) -> int:
        """BF16 reads per element: an amax pass, then the quantize pass (delayed and block
        scaling fuse the amax into the quantize; rowwise needs its own amax+quantize per copy,
        because each use scales along a different axis)."""
        return {"none": 0, "stored": 0, "delayed": 1, "block": 1, "current": 2, "rowwise": 2 * self.copies}[self.kind]

    def bytes_per_element(self) -> float:
        if self.kind in ("none", "stored"):
            return 0.0
        return (self.passes() * BF16_BYTES + self.copies * FP8_BYTES) * self.share


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a step: C[M,N] = A[M,K] @ B[K,N], with how A and B are cast."""

    name: str
    m: int
    k: int
    n: int
    fp8: bool = False
    cast_a: Cast = Cast()
    cast_b: Cast = Cast()
    count: float = 1.0  # identical GEMMs (layers); a fraction = that share of them (recomputed GEMMs)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n * self.count


@dataclass(frozen=True)
class StepWork:
    """A step: its GEMMs plus the non-GEMM work (attention core FLOPs, elementwise bytes)."""

    gemms: tuple[Gemm, ...]
    other_flops: float = 0.0  # on BF16 tensor cores (attention QK^T and PV, fwd + bwd)
    other_bytes: float = 0.0  # streamed at HBM speed (norms, activations, residuals, optimizer)
    notes: tuple[str, ...] = field(default_factory=tuple)


def gemm_seconds(g: Gemm, device: Device) -> float:
    """The GEMM kernel alone (operands already in their format)."""
    peak = (device.fp8_tflops if g.fp8 else device.bf16_tflops) * 1e12 * GEMM_EFFICIENCY
    width = FP8_BYTES if g.fp8 else BF16_BYTES
    moved = (g.m * g.k + g.k * g.n) * width + g.m * g.n * BF16_BYTES
    one = max(2.0 * g.m * g.k * g.n / peak, moved / _bandwidth(device))
    if g.fp8 and "block" in (g.cast_a.kind, g.cast_b.kind) and not device.native_block_scaling:
        one += 2.0 * g.m * g.n * g.k / PROMOTION_BLOCK / (device.fp32_tflops * 1e12 * GEMM_EFFICIENCY)
    return one * g.count


def cast_seconds(g: Gemm, device: Device) -> float:
    """Per-step quantization of the GEMM's FP8 operands (amax + quantize traffic)."""
    if not g.fp8:
        return 0.0
    moved = g.m * g.k * g.cast_a.bytes_per_element() + g.k * g.n * g.cast_b.bytes_per_element()
    return moved * g.count / _bandwidth(device)


def step_seconds(work: StepWork, device: Device) -> dict[str, float]:
    """Projected seconds of one step, by part."""
    gemm = sum(gemm_seconds(g, device) for g in work.gemms)
    cast = sum(cast_seconds(g, device) for g in work.gemms)
    other = work.other_flops / (device.bf16_tflops * 1e12 * GEMM_EFFICIENCY) + work.other_bytes / _bandwidth(device)
    return {"gemm_s": gemm, "cast_s": cast, "other_s": other, "total_s": gemm + cast + other}


def speedup(reference: StepWork, candidate: StepWork, device: Device) -> float:
    """reference step time / candidate step time on `device` (> 1: the candidate is faster)."""
    return step_seconds(reference, device)["total_s"] / step_seconds(candidate, device)["total_s"]


def _bandwidth(device: Device) -> float:
    return device.hbm_tbps * 1e12 * BANDWIDTH_EFFICIENCY


# --- building a step's GEMMs from a linear's shape and a policy -----------------------------------

@dataclass(frozen=True)
class Fp8Plan:
    """Which operands of a linear's three GEMMs are FP8 and how they are cast. `None` = BF16 GEMMs."""

    activation: Cast  # X in fprop (and X^T in wgrad)
    weight: Cast  # W in fprop (and W^T in dgrad)
    grad: Cast  # dY in dgrad (and dY^T in wgrad)


def linear_gemms(name: str, tokens: int, k: int, n: int, plan: Fp8Plan | None, *, wgrad: bool = True,
                 count: float = 1.0, recompute_fwd: float = 0.0) -> list[Gemm]:
    """fprop (M x K x N), dgrad (M x N x K), and wgrad (K x M x N) of one linear, `count` times.

    Each operand is cast once per step and feeds two GEMMs, so its cast is charged to the first
    GEMM that uses it; `recompute_fwd` adds that share of the fprop again (activation
    checkpointing), casts included. `wgrad=False` for a frozen weight (a LoRA base linear)."""
    fp8 = plan is not None
    none = Cast()
    gemms = [Gemm(f"{name}.fprop", tokens, k, n, fp8, plan.activation if fp8 else none, plan.weight if fp8 else none, count),
             Gemm(f"{name}.dgrad", tokens, n, k, fp8, plan.grad if fp8 else none, none, count)]
    if wgrad:
        gemms.append(Gemm(f"{name}.wgrad", k, tokens, n, fp8, none, none, count))
    if recompute_fwd:
        gemms.append(replace(gemms[0], name=f"{name}.fprop(recompute)", count=count * recompute_fwd))
    return gemms
