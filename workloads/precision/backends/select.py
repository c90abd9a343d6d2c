"""Which FP8 backend runs a trial: ``precision.backend`` -> a ``BackendChoice`` (docs/policies.md).

Requested value and what runs:

=====================  ===========================================================================
``emulated``           always the emulated backend (quantize-dequantize with torch's float8 dtypes).
``torchao``            torchao float8 training. On a CUDA GPU with compute capability 8.9+ its
                       GEMMs are real FP8 (``torch._scaled_mm``); anywhere else it runs with
                       ``emulate=True`` (the same FP8 casts, the GEMM in FP32) and the choice says
                       ``emulated=True``. Fails if torchao cannot be imported.
``transformer_engine`` Transformer Engine. Needs TE importable *and* an SM 8.9+ CUDA device;
                       otherwise a ValueError that names ``precision.backend`` and the fix (TE
                       has no emulation mode).
``auto``               TE if importable and the GPU is SM 8.9+, else torchao on such a GPU, else
                       ``emulated``. auto never picks torchao-with-emulation: on a CPU the
                       emulated backend is the reference implementation.
=====================  ===========================================================================

The three probes (``_fp8_gpu``, ``_te_importable``, ``_torchao_importable``) are module-level
functions so tests can monkeypatch them; each returns ``(ok, why)``. The choice and its reason are
logged at INFO.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["BACKENDS", "BackendChoice", "MIN_FP8_CAPABILITY", "select_backend"]

log = logging.getLogger(__name__)

BACKENDS = ("emulated", "auto", "torchao", "transformer_engine")
MIN_FP8_CAPABILITY = (8, 9)  # Ada (8.9) and Hopper (9.0)+ have FP8 tensor cores


@dataclass(frozen=True)
class BackendChoice:
    """The backend that will run (never ``auto``), whether FP8 is emulated, and why."""

    name: str
    emulated: bool
    reason: str
    requested: str = ""  # what precision.backend said; 'auto' lets apply_backend fall back


def select_backend(requested: str, device: torch.device | str) -> BackendChoice:
    """Resolve ``precision.backend`` for ``device`` (see module docstring). Logs the choice."""
    choice = dataclasses.replace(_select(requested, torch.device(device)), requested=requested)
    log.info(
        "precision.backend=%s -> %s (emulated=%s): %s",
        requested, choice.name, choice.emulated, choice.reason,
    )  # fmt: skip
    return choice


def _select(requested: str, device: torch.device) -> BackendChoice:
    if requested not in BACKENDS:
        close = difflib.get_close_matches(str(requested), BACKENDS, n=1)
        hint = f" — did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"precision.backend={requested!r} is not a backend{hint} available: "
            + ", ".join(BACKENDS)
        )
    if requested == "emulated":
        return BackendChoice("emulated", True, "requested explicitly")

    gpu_ok, gpu_why = _fp8_gpu(device)
    if requested == "transformer_engine":
        te_ok, te_why = _te_importable()
        problems = [why for ok, why in ((te_ok, te_why), (gpu_ok, gpu_why)) if not ok]
        if problems:
            raise ValueError(
                "precision.backend=transformer_engine cannot run here: "
                + "; ".join(problems)
                + ". Fix: install the extra (pip install 'fp8lab[te]') on a machine with CUDA and"
                " an SM 8.9+ GPU (Ada/Hopper) and use train.device=cuda, or set"
                " precision.backend=auto (falls back to torchao/emulated) or"
                " precision.backend=emulated."
            )
        return BackendChoice("transformer_engine", False, f"requested explicitly; {gpu_why}")

    ao_ok, ao_why = _torchao_importable()
    if requested == "torchao":
        if not ao_ok:
            raise ValueError(
                f"precision.backend=torchao cannot run here: {ao_why}. Fix: pip install"
                " 'fp8lab[torchao]', or set precision.backend=emulated."
            )
        if gpu_ok:
            return BackendChoice("torchao", False, f"requested explicitly; {gpu_why}")
        return BackendChoice(
            "torchao",
            True,
            f"requested explicitly, but {gpu_why}: torchao float8 runs with emulate=True"
            " (real FP8 casts, GEMMs in FP32)",
        )

    # auto
    if not gpu_ok:
        return BackendChoice("emulated", True, f"auto: {gpu_why}")
    te_ok, te_why = _te_importable()
    if te_ok:
        return BackendChoice("transformer_engine", False, f"auto: {gpu_why} and {te_why}")
    if ao_ok:
        return BackendChoice(
            "torchao", False, f"auto: {gpu_why}; transformer_engine unavailable ({te_why})"
        )
    return BackendChoice(
        "emulated",
        True,
        f"auto: {gpu_why}, but neither transformer_engine ({te_why}) nor torchao ({ao_why})"
        " can be imported",
    )


# -- probes (monkeypatched in tests) ---------------------------------------------------------
def _fp8_gpu(device: torch.device) -> tuple[bool, str]:
    """Is ``device`` a CUDA GPU with FP8 tensor cores (compute capability >= 8.9)?"""
    if device.type != "cuda":
        return False, f"device is {device.type}, not a CUDA GPU"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU is visible"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if (major, minor) < MIN_FP8_CAPABILITY:
        return False, f"{name} has compute capability {major}.{minor} < 8.9 (no FP8 tensor cores)"
    return True, f"{name} has compute capability {major}.{minor} (FP8 tensor cores)"


@lru_cache(maxsize=1)
def _te_importable() -> tuple[bool, str]:
    """TE's import itself loads CUDA libraries, so 'installed' is not enough: really import it."""
    try:
        te = importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # noqa: BLE001 - ImportError, OSError (missing libcuda), RuntimeError
        return False, f"transformer_engine.pytorch does not import ({type(exc).__name__}: {exc})"
    if not hasattr(te, "Linear"):
        return False, "transformer_engine.pytorch imports but has no Linear"
    version = getattr(importlib.import_module("transformer_engine"), "__version__", "?")
    return True, f"transformer_engine {version} imports"


@lru_cache(maxsize=1)
def _torchao_importable() -> tuple[bool, str]:
    try:
        importlib.import_module("torchao.float8")
    except Exception as exc:  # noqa: BLE001 - a broken install should fall back, not crash auto
        return False, f"torchao.float8 does not import ({type(exc).__name__}: {exc})"
    version = getattr(importlib.import_module("torchao"), "__version__", "?")
    return True, f"torchao {version} imports"
