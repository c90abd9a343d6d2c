"""Interrupts in the driver and `fp8lab trial`: SIGTERM raises like Ctrl-C; an interrupt between
creating a trial's MLflow run and recording its id waits until the id is recorded (else the run is
never closed); an interrupt that arrives inside a finalizer is not lost."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from orchestrator.interrupts import RESEND_AFTER_S, Interrupted, interrupts_raise, signals_deferred


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Interrupted)])
def test_a_signal_inside_the_launch_waits_until_the_run_id_is_recorded(sig: int, expected: type) -> None:
    recorded = []
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in an xdist worker
    with interrupts_raise(), pytest.raises(expected):
        with signals_deferred():
            os.kill(os.getpid(), sig)  # arrives while the run is being created
            recorded.append("run id")  # still recorded
        recorded.append("next trial")  # never reached: the interrupt comes right after the block
    assert recorded == ["run id"]
    assert signal.getsignal(signal.SIGINT) == before  # handlers put back


def test_without_a_signal_the_block_changes_nothing() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with signals_deferred():
        pass
    assert {sig: signal.getsignal(sig) for sig in before} == before


class _SignalledWhileFinalized:
    """A finalizer that is running when SIGTERM's handler runs: Python can only report the
    handler's exception there ("Exception ignored in"), not raise it."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # the handler runs inside the finalizer, before it returns


def test_an_interrupt_swallowed_by_a_finalizer_is_raised_again(monkeypatch: pytest.MonkeyPatch) -> None:
    swallowed: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: swallowed.append(unraisable.exc_value))
    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    with pytest.raises(Interrupted), interrupts_raise():
        _SignalledWhileFinalized()  # collected at once
        time.sleep(5)  # without the resend the trial goes on: this sleep would end and nothing be raised
    assert time.monotonic() - started < RESEND_AFTER_S + 1
    assert [type(exc) for exc in swallowed] == [Interrupted]  # the finalizer did swallow the first one
    assert signal.getsignal(signal.SIGTERM) == before
    # the watchdog is gone before the old handlers are back: a late resend would meet SIG_DFL and kill
    assert not [t for t in threading.enumerate() if t.name == "fp8lab-interrupt-watchdog"]


def test_an_interrupt_a_library_catches_is_raised_again() -> None:
    caught = []
    started = time.monotonic()
    with pytest.raises(Interrupted), interrupts_raise():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except BaseException as exc:  # noqa: BLE001 - what a careless library does
            caught.append(exc)
        time.sleep(5)
    assert [type(exc) for exc in caught] == [Interrupted]
    assert time.monotonic() - started < RESEND_AFTER_S + 1


def test_cleanup_slower_than_the_resend_is_not_interrupted_while_the_interrupt_unwinds() -> None:
    cleaned = []
    with pytest.raises(Interrupted), interrupts_raise():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            time.sleep(2 * RESEND_AFTER_S)  # closing the run, say
            cleaned.append(True)
    assert cleaned == [True]
