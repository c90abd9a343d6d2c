"""The registry of FP8 backends: one entry per backend, torch-free.

An entry names a backend and the module that implements it; the module is imported only when
that backend is chosen, probed or checked (``registry.load``), so torchao and Transformer Engine
load only when used. This module imports nothing outside the standard library: the orchestrator
(which never imports torch) reads the names from here to validate ``precision.backend``.

``precision.backend`` accepts every registered name plus ``auto``. ``auto`` tries the entries in
the order of their ``auto_rank`` (lowest first) and takes the first backend that runs real FP8
GEMMs on the trial's device; the last one in that order is the fallback that always runs (the
emulated backend, the reference implementation). Adding a backend is one module with a
``BACKEND`` object (``base.Backend``) plus one ``register_backend`` call here (or, from outside
the product, e.g. a test, at run time).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.registry import Registry, UnknownNameError

__all__ = [
    "AUTO",
    "BackendEntry",
    "UnknownBackendError",
    "auto_order",
    "backend_names",
    "backend_object",
    "get_entry",
    "register_backend",
    "requestable_names",
    "unregister_backend",
]

AUTO = "auto"


class UnknownBackendError(UnknownNameError):
    """A ``precision.backend`` value that is neither ``auto`` nor a registered backend."""


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend lives and where it stands in ``auto``'s order (None: never by auto)."""

    name: str
    module: str  # import path of the module defining the backend object
    attr: str = "BACKEND"  # the backend object's name in that module
    auto_rank: int | None = None
    summary: str = ""


_ENTRIES: Registry[BackendEntry] = Registry("FP8 backend (precision.backend)", UnknownBackendError)
# The backend objects, registered lazily as "module:attr": a module is imported on first use.
_OBJECTS: Registry[object] = Registry("FP8 backend (precision.backend)", UnknownBackendError)


def register_backend(entry: BackendEntry, *, replace: bool = False) -> BackendEntry:
    """Make ``entry`` selectable by its name; re-registering a name needs ``replace=True``."""
    if entry.name == AUTO:
        raise ValueError(f"{AUTO!r} is reserved: it picks one of the registered backends")
    _OBJECTS.register(entry.name, f"{entry.module}:{entry.attr}", replace=replace)
    return _ENTRIES.register(entry.name, entry, replace=replace)


def unregister_backend(name: str) -> None:
    """Remove a backend (tests that register a toy backend clean up with this)."""
    _ENTRIES.unregister(name)
    _OBJECTS.unregister(name)


def backend_names() -> tuple[str, ...]:
    """Registered backends, in registration order."""
    return _ENTRIES.names()


def requestable_names() -> tuple[str, ...]:
    """What ``precision.backend`` accepts: the default backend, ``auto``, then the others."""
    names = backend_names()
    return (*names[:1], AUTO, *names[1:])


def auto_order() -> tuple[str, ...]:
    """The backends ``auto`` tries, best first; the last one is the fallback that always runs."""
    ranked = [e for e in _ENTRIES.values() if e.auto_rank is not None]
    return tuple(e.name for e in sorted(ranked, key=lambda e: e.auto_rank))


def get_entry(name: str) -> BackendEntry:
    """The entry registered as ``name``, or UnknownBackendError with a did-you-mean hint."""
    return _ENTRIES.get(name, options=requestable_names())


def backend_object(name: str) -> object:
    """The backend object registered as ``name``, its module imported now if it was not yet."""
    return _OBJECTS.get(name, options=requestable_names())


_PKG = "workloads.precision.backends"
register_backend(BackendEntry(
    "emulated", f"{_PKG}.emulated_backend", auto_rank=100,
    summary="quantize-dequantize with torch's float8 dtypes; runs anywhere (the reference)",
))  # fmt: skip
register_backend(BackendEntry(
    "torchao", f"{_PKG}.torchao_backend", auto_rank=20,
    summary="torchao float8 training GEMMs (real FP8 on SM 8.9+, emulate=True elsewhere)",
))  # fmt: skip
register_backend(BackendEntry(
    "transformer_engine", f"{_PKG}.te_backend", auto_rank=10,
    summary="Transformer Engine te.Linear + autocast recipes (CUDA, SM 8.9+)",
))  # fmt: skip
