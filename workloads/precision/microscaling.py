"""The arithmetic of Blackwell's block-scaled formats, MXFP8 and NVFP4, for the ``mx`` and
``nvfp4`` scaling kinds (``scaling.py`` registers them; this module is their maths only).

- **MX** (OCP Microscaling Formats v1.0, section 6.3): one shared scale per block of 32
  consecutive values along the reduction dim, stored as E8M0 (a bare power of two, bias 127).
  The shared exponent is ``floor(log2(amax)) - emax_elem`` (``emax_elem`` = the element format's
  largest exponent: 8 for E4M3, 15 for E5M2, 2 for E2M1), clamped to E8M0's range [-127, 127];
  elements are ``x / 2**shared_exp`` cast to the element format *saturating*: the largest value
  of a block lands in [2**emax, 2**(emax+1)), which can exceed the element's max (E4M3: 448 <
  512), and those values clamp. An all-zero block gets the smallest exponent (-127), as torchao's
  ``to_mx``. Transformer Engine's MXFP8 kernels instead round ``amax / fmax`` *up* to a power
  of two (no saturation, up to one binade less resolution): a reported deviation.
- **NVFP4** (NVIDIA; TE ``NVFP4BlockScaling``, torchao ``nvfp4_quantize``): E2M1 values, one
  E4M3 scale per 16 values and one FP32 scale per tensor. The per-tensor decode scale is
  ``amax / (448 * 6)``, so the largest block scale uses E4M3's whole range; a block's scale is
  ``block_amax / 6 / global`` rounded to E4M3 (clamped to [2**-9, 448]); values are ``x *
  ((1 / global) / block_e4m3)`` in FP32, clamped to +-6 and rounded to E2M1. Decoding multiplies
  by ``block_e4m3 * global``. Same operations in the same order as torchao's reference, so the
  codes and scales are bit-identical (unit tests).
- ``block_scale_fmt='fp32'`` (the ``fp32_block_scales`` rung) keeps each block's exact FP32
  scale ``fmax / block_amax`` instead: what the hardware scale format costs.
- **Random Hadamard transform** (TE's NVFP4 recipe): each 16-value block along the last dim is
  multiplied by ``H @ S`` (``H`` the 16x16 Sylvester-Hadamard matrix / 4, ``S`` a fixed random
  +-1 diagonal), which spreads an outlier over its block; ``H S`` is orthogonal, so a GEMM of two
  operands rotated the same way is unchanged and the emulator undoes the rotation after
  decoding (``unrotate``). TE applies it only to the operands of the weight-gradient GEMM.
- **Stochastic rounding** (TE's NVFP4 gradients): ``formats.round_to_grid(stochastic=True)``,
  noise from torch's RNG, which the trial seeds, so a run repeats.
"""

from __future__ import annotations

import math

import torch

from workloads.precision.formats import E4M3, Fp8Format

__all__ = [
    "E8M0_BIAS",
    "mx_shared_exponent",
    "mx_scales",
    "pow2",
    "nvfp4_scales",
    "exact_block_scales",
    "rotation",
    "rotate",
    "unrotate",
]

E8M0_BIAS = 127
_E4M3_TINY = float(torch.finfo(torch.float8_e4m3fn).tiny)  # 2**-6: torchao's E4M3_EPS


def mx_shared_exponent(amax: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """OCP MX shared exponent per block: ``floor(log2(amax)) - emax_elem`` in [-127, 127]
    (int32). ``frexp`` reads the exponent exactly (``log2`` in FP32 can round a value just below
    a power of two up to it); amax 0 gives -127, the smallest scale."""
    emax_elem = math.floor(math.log2(fmt.max))
    exponent = torch.frexp(amax.float())[1] - 1  # amax = m * 2**e, m in [0.5, 1): floor(log2) = e-1
    shared = torch.where(amax > 0, exponent - emax_elem, torch.full_like(exponent, -E8M0_BIAS))
    return shared.clamp(-E8M0_BIAS, E8M0_BIAS)


def mx_scales(amax: torch.Tensor, fmt: Fp8Format) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, scale_inv)`` of MX blocks with per-block ``amax``: ``2**-shared, 2**shared``
    (both exact in FP32; ``scale_inv`` is the E8M0 value, ``torch.float8_e8m0fnu`` holds it
    exactly). A non-finite amax keeps scale 1 so NaN/Inf reach the cast and show as such."""
    shared = mx_shared_exponent(amax, fmt)
    one = torch.ones_like(amax, dtype=torch.float32)
    ok = torch.isfinite(amax)
    return torch.where(ok, pow2(-shared), one), torch.where(ok, pow2(shared), one)


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """``2**exponent`` (int tensor in [-127, 127]) in FP32, built from the bits: exact, where
    ``exp2`` promises nothing; -127 is FP32's subnormal 0x00400000."""
    e = exponent.to(torch.int32)
    normal = ((e.clamp(min=-126) + 127) << 23).view(torch.float32)
    return torch.where(e < -126, torch.tensor(2.0**-127, device=e.device), normal)


def nvfp4_scales(
    block_amax: torch.Tensor, tensor_amax: torch.Tensor, fmt: Fp8Format
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, scale_inv)`` per 16-value block of NVFP4 (module docstring): ``scale`` is what
    the values are multiplied by before rounding to E2M1, ``scale_inv = block_e4m3 * global``
    what the codes are multiplied by to decode. A zero or non-finite tensor amax gives global 1."""
    amax = tensor_amax.float()
    ok = (amax > 0) & torch.isfinite(amax)
    global_dec = torch.where(ok, amax / (E4M3.max * fmt.max), torch.ones_like(amax))
    block = block_amax.float() / fmt.max / global_dec
    block_e4m3 = block.clamp(_E4M3_TINY, E4M3.max).to(E4M3.dtype).float()
    scale = (1.0 / global_dec) / block_e4m3
    return scale, block_e4m3 * global_dec


def exact_block_scales(amax: torch.Tensor, fmt: Fp8Format) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fmax / amax, amax / fmax)`` per block in FP32 (1 where amax is 0 or not finite): the
    ``fp32_block_scales`` rung, a block format without its hardware scale format."""
    amax = amax.float()
    ok = (amax > 0) & torch.isfinite(amax)
    safe = torch.where(ok, amax, torch.ones_like(amax))
    one = torch.ones_like(amax)
    return torch.where(ok, fmt.max / safe, one), torch.where(ok, safe / fmt.max, one)


_ROTATIONS: dict[tuple[int, torch.device], torch.Tensor] = {}
_SIGN_SEED = 0x5EED  # fixed: TE's sign mask is fixed too, and a run must repeat


def rotation(block: int, device: torch.device) -> torch.Tensor:
    """``H @ S`` (FP32, ``block`` x ``block``, orthogonal): Sylvester-Hadamard / sqrt(block)
    times a fixed random +-1 diagonal. ``block`` must be a power of two."""
    key = (block, torch.device(device))
    if key not in _ROTATIONS:
        if block < 1 or block & (block - 1):
            raise ValueError(f"hadamard: block size {block} must be a power of two")
        h = torch.ones(1, 1)
        while h.shape[0] < block:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        gen = torch.Generator().manual_seed(_SIGN_SEED)
        signs = torch.randint(0, 2, (block,), generator=gen).float() * 2 - 1
        _ROTATIONS[key] = (h / math.sqrt(block) * signs).to(device)
    return _ROTATIONS[key]


def rotate(x: torch.Tensor, hs: torch.Tensor) -> torch.Tensor:
    """Each block of the last dim times ``hs`` (FP32 result); the last dim must divide."""
    block = hs.shape[0]
    if x.shape[-1] % block:
        raise ValueError(
            f"hadamard: last dim {x.shape[-1]} is not a multiple of the block size {block}"
        )
    blocks = x.float().reshape(*x.shape[:-1], -1, block)
    return (blocks @ hs).reshape(x.shape)


def unrotate(y: torch.Tensor, hs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Undo ``rotate`` (times ``hs``'s transpose, its inverse) and round once to ``dtype``."""
    return rotate(y, hs.t()).to(dtype)
