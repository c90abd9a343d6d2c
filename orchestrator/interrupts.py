"""Ctrl-C and SIGTERM for the driver and `fp8lab trial`: both interrupt like Ctrl-C, and none is lost.

Python raises a signal handler's exception in the main thread at the next bytecode it runs,
wherever that is. Some places cannot pass it on: a finalizer (a `__del__`, a generator or a
progress bar the garbage collector closes while a large file is read) only prints "Exception
ignored in", and library code may catch it or replace it in a `finally`. A SIGTERM'd trial then
trained to its end. So an interrupt that is neither unwinding nor done a second after it was
raised is sent again (by a watchdog thread; the handler still runs in the main thread).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

RESEND_AFTER_S = 1.0  # an interrupt not unwinding this long after it was raised was lost


class Interrupted(KeyboardInterrupt):
    """SIGTERM reached the process. A KeyboardInterrupt on purpose: Ray's blocking calls
    (ray.wait/ray.get) turn only KeyboardInterrupt raised by a signal handler into a clean
    interrupt; any other exception comes out as a SystemError and the sweep would crash
    instead of marking its runs KILLED."""


def _interrupt_for(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signum)


def _main_thread_unwinds_interrupt() -> bool:
    """The main thread is propagating or handling a KeyboardInterrupt (in an except or finally)."""
    active = sys._current_exceptions().get(threading.main_thread().ident)
    active = active[1] if isinstance(active, tuple) else active  # (type, value, tb) before Python 3.12
    return isinstance(active, KeyboardInterrupt)


class interrupts_raise:
    """For the block, SIGTERM raises `Interrupted` and Ctrl-C `KeyboardInterrupt` (unless Ctrl-C is
    ignored, as in a pytest-xdist worker), and an interrupt that got lost is sent again. Handle
    the interrupt outside the block: inside it, cleanup slower than a second would be interrupted."""

    def __enter__(self) -> None:
        self._last: int | None = None
        self._raised_at = 0.0
        self._done = threading.Event()
        self._watchdog: threading.Thread | None = None
        handled = [signal.SIGTERM]
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            handled.append(signal.SIGINT)
        self._old = {sig: signal.signal(sig, self._raise) for sig in handled}

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        try:  # the watchdog must not send a signal once the old handlers are back (SIG_DFL would kill)
            if self._watchdog is not None:
                self._watchdog.join()
        finally:
            for sig, handler in self._old.items():
                signal.signal(sig, handler)

    def _raise(self, signum: int, frame: Any) -> None:
        self._last, self._raised_at = signum, time.monotonic()
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._resend_lost, name="fp8lab-interrupt-watchdog", daemon=True)
            self._watchdog.start()
        raise _interrupt_for(signum)

    def _resend_lost(self) -> None:
        while not self._done.wait(RESEND_AFTER_S / 4):
            if _main_thread_unwinds_interrupt():
                self._raised_at = time.monotonic()
            elif time.monotonic() - self._raised_at > RESEND_AFTER_S and self._last is not None:
                if self._done.is_set():
                    return
                os.kill(os.getpid(), self._last)  # the handler raises it again (and restarts the clock)
                self._raised_at = time.monotonic()


class signals_deferred:
    """Ctrl-C and SIGTERM wait until the block is done, then interrupt as usual (KeyboardInterrupt,
    Interrupted). Around "create the trial's MLflow run, record its id, submit it": interrupted in
    between, the run existed but no id was recorded, so the driver could not mark it KILLED and it
    stayed RUNNING until a later driver. Outside the main thread (no signal handlers) it does nothing."""

    def __enter__(self) -> None:
        self._caught: list[int] = []
        self._active = threading.current_thread() is threading.main_thread()
        if self._active:
            self._old = {sig: signal.signal(sig, lambda signum, frame: self._caught.append(signum))
                         for sig in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc: Any) -> None:
        if not self._active:
            return
        for sig, handler in self._old.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if self._caught and exc[0] is None:
            raise _interrupt_for(self._caught[0])
