"""One generic, lazy name -> object registry (after lm-eval's ``lm_eval/api/registry.py``).

Policies, scaling kinds and FP8 backends are each a ``Registry``: registration order is kept
(it is the order users see in "available: ..."), a name may be registered as the object itself
or lazily as ``"module:attr"`` (imported on first ``get``, so torchao and Transformer Engine load
only when chosen), and an unknown name is refused with the one message every registry shares:
``unknown <what> 'x' — did you mean 'y'? available: a, b``.

Standard library only: the orchestrator (which never imports torch) reads backend names from a
registry.
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry", "UnknownNameError", "did_you_mean", "unknown_name_message"]


class UnknownNameError(ValueError):
    """A name that is not registered; the message names the close match and the choices."""


def did_you_mean(name: object, options: Iterable[str]) -> str:
    """`` — did you mean 'x'?`` for the closest of ``options``, or "" when none is close."""
    close = difflib.get_close_matches(str(name), list(options), n=1)
    return f" — did you mean {close[0]!r}?" if close else ""


def unknown_name_message(what: str, name: object, options: Iterable[str]) -> str:
    """The one wording of an unknown name: what it is, the closest choice, all choices."""
    options = list(options)
    return f"unknown {what} {name!r}{did_you_mean(name, options) or ';'} available: {', '.join(options)}"


class Registry(Generic[T]):
    """Named objects of one kind, in registration order; lazy entries load on first use."""

    def __init__(self, what: str, error: type[UnknownNameError] = UnknownNameError) -> None:
        self.what = what  # e.g. "precision policy": the subject of every message
        self._error = error
        self._items: dict[str, T | str] = {}

    def register(self, name: str, obj: T | str, *, replace: bool = False) -> T | str:
        """Add ``obj`` (or a lazy ``"module:attr"`` string) as ``name``; a second registration of
        the same name needs ``replace=True``, so two modules never silently share one name."""
        if name in self._items and not replace:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._items[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    __delitem__ = unregister

    def get(self, name: str, options: Iterable[str] | None = None) -> T:
        """The object registered as ``name`` (imported now if it was lazy), or ``error`` with the
        shared message; ``options`` overrides the choices it lists (e.g. plus ``auto``)."""
        try:
            item = self._items[name]
        except (KeyError, TypeError):
            raise self._error(unknown_name_message(self.what, name, self.names() if options is None else options)) from None
        if isinstance(item, str):
            module, _, attr = item.partition(":")
            item = getattr(importlib.import_module(module), attr)
            self._items[name] = item
        return item

    __getitem__ = get

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def values(self) -> list[T]:
        return [self.get(name) for name in self._items]

    def items(self) -> list[tuple[str, T]]:
        return [(name, self.get(name)) for name in self._items]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._items))

    def __len__(self) -> int:
        return len(self._items)
