"""The last thing a process that has imported the training stack does before it exits (standard
library only, like everything in this package: the torch-free orchestrator and the workloads both
call it)."""
from __future__ import annotations

import gc


def skip_final_collection() -> None:
    """Take every object alive now out of the cyclic garbage collector's sight, so the interpreter's
    exit does not walk them.

    Why: at exit the interpreter runs full collections over everything still alive; with torch,
    transformers, PEFT, lm-eval and MLflow imported that is millions of objects and ~1.3-1.8 s of
    CPU per process (docs/testing.md, "The interpreter's exit"), for memory the OS takes back anyway.
    Everything else the exit does still happens: atexit handlers (MLflow ends its runs, Ray
    disconnects, logging flushes), objects freed by reference counting, streams flushed, the exit
    code. Not done: finalizers of objects caught in reference cycles at exit, which Python never
    promised to run. Call it only where the process exits next: `fp8lab`'s entry point after
    `main`, the preflight child, the end of a `max_calls=1` Ray task."""
    gc.freeze()
