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
``auto``               the backends in ``entries.auto_order()`` (TE, torchao, emulated): the first
                       that runs real FP8 here -- TE if importable and the GPU is SM 8.9+, else
                       torchao on such a GPU -- else the last, ``emulated``. auto never picks
                       torchao-with-emulation: on a CPU the emulated backend is the reference.
=====================  ===========================================================================

Each backend says whether it can run (``Backend.availability``); the names and the auto order
come from the registry (``entries.py``), so this module has no per-backend branch. The probes the
built-in backends use (``_fp8_gpu``, ``_te_importable``, ``_torchao_importable``) live here as
module-level functions so tests can monkeypatch them; each returns ``(ok, why)``. The choice and
its reason are logged at INFO.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from functools import lru_cache

import torch

from workloads.precision.backends.base import BackendChoice, load_backend
from workloads.precision.backends.entries import AUTO, auto_order, get_entry

__all__ = ["BackendChoice", "MIN_FP8_CAPABILITY", "select_backend"]

log = logging.getLogger(__name__)

MIN_FP8_CAPABILITY = (8, 9)  # Ada (8.9) and Hopper (9.0)+ have FP8 tensor cores


def select_backend(requested: str, device: torch.device | str) -> BackendChoice:
    """Resolve ``precision.backend`` for ``device`` (see module docstring). Logs the choice."""
    choice = dataclasses.replace(_select(requested, torch.device(device)), requested=requested)
    log.info(
        "precision.backend=%s -> %s (emulated=%s): %s",
        requested, choice.name, choice.emulated, choice.reason,
    )  # fmt: skip
    return choice


def _select(requested: str, device: torch.device) -> BackendChoice:
    if requested == AUTO:
        return _select_auto(device)
    backend = load_backend(get_entry(requested).name)  # unknown names: did-you-mean error
    found = backend.availability(device, auto=False)
    if not found.ok:
        raise ValueError(
            f"precision.backend={requested} cannot run here: {found.reason}. Fix: {found.fix}"
        )
    reason = "requested explicitly" + (f"; {found.reason}" if found.reason else "")
    return BackendChoice(backend.name, found.emulated, reason)


def _select_auto(device: torch.device) -> BackendChoice:
    """The first backend of ``auto_order()`` that runs real FP8 here, else the last (the
    reference): auto never picks an emulating GPU backend."""
    order = auto_order()
    passed: list[str] = []
    for name in order:
        found = load_backend(name).availability(device, auto=True)
        last = name == order[-1]
        if found.ok and not found.emulated:
            skipped = f"; {', '.join(passed)} unavailable" if passed else ""
            return BackendChoice(name, False, f"auto: {found.reason}{skipped}")
        if found.ok and last:
            why = ", ".join(passed) or found.reason
            return BackendChoice(name, found.emulated, f"auto: no real-FP8 backend here: {why}")
        passed.append(f"{name} ({found.reason})")
    raise ValueError(f"precision.backend=auto: no backend can run here: {'; '.join(passed)}")


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
