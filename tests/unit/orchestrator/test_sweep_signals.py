"""The driver's signal handling around a trial's launch: an interrupt between creating a trial's
MLflow run and recording its id must wait until the id is recorded (else the run is never closed)."""
from __future__ import annotations

import os
import signal

import pytest

from orchestrator.sweep import Interrupted, _signals_deferred, _signals_raise_interrupt


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Interrupted)])
def test_a_signal_inside_the_launch_waits_until_the_run_id_is_recorded(sig: int, expected: type) -> None:
    recorded = []
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in an xdist worker
    with _signals_raise_interrupt(), pytest.raises(expected):
        with _signals_deferred():
            os.kill(os.getpid(), sig)  # arrives while the run is being created
            recorded.append("run id")  # still recorded
        recorded.append("next trial")  # never reached: the interrupt comes right after the block
    assert recorded == ["run id"]
    assert signal.getsignal(signal.SIGINT) == before  # handlers put back


def test_without_a_signal_the_block_changes_nothing() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with _signals_deferred():
        pass
    assert {sig: signal.getsignal(sig) for sig in before} == before
