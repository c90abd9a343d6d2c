"""When the cyclic garbage collector runs in a process that imports the training stack (standard
library only, like everything in this package: the torch-free orchestrator and the workloads both
use it).

Why: torch, transformers, PEFT, lm-eval and MLflow leave millions of objects alive, and every full
collection walks all of them. Two moments pay for it with nothing to gain: importing that stack
(collections keep firing while the objects pile up) and the interpreter's exit (its final
collections walk everything still alive, for memory the OS takes back anyway). Measured in
docs/testing.md, "The garbage collector at import and at exit" (`benchmarks/garbage_collection.py`).
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Hold automatic collections for the block (a heavy import), as they were before afterwards.

    Nothing is frozen or leaked: garbage made in the block is collected at the next collection
    after it, as it would have been a few collections later. For imports only: a block that
    builds cyclic garbage for a long time (a training loop, a data file) must keep collecting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def skip_final_collection() -> None:
    """Take every object alive now out of the collector's sight, so the interpreter's exit does
    not walk them (`gc.freeze()`).

    Everything else the exit does still happens: atexit handlers (MLflow ends its runs, Ray
    disconnects, logging flushes), objects freed by reference counting (open files are flushed and
    closed), streams flushed, non-daemon threads joined, the exit code. Not done: finalizers of
    objects caught in reference cycles at exit, which Python never promised to run. Call it only
    where the process exits next: `fp8lab`'s entry point after `main`, the preflight child, the
    end of a `max_calls=1` Ray task."""
    gc.freeze()
