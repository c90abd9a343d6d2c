"""The buffered MLflow logger writes by time as well as by count: few writes per trial, metrics in
the store within `flush_s`, and nothing written mid-training for a checkpointed trial."""
from __future__ import annotations

from typing import Any

import pytest

from workloads.record import logger as logger_mod
from workloads.record.logger import MlflowTrialLogger


class _Client:
    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def log_batch(self, run_id: str, metrics: list[Any] = (), **_: Any) -> None:
        self.batches.append(list(metrics))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(logger_mod.time, "monotonic", fake)
    monkeypatch.setattr(logger_mod, "MlflowClient", lambda uri: _Client())  # no store is touched
    return fake


def _logger(**kwargs: Any) -> tuple[MlflowTrialLogger, _Client]:
    log = MlflowTrialLogger("sqlite:///unused.db", "run", **kwargs)
    return log, log.client  # type: ignore[return-value]


def test_steps_within_flush_s_share_one_write(clock: _Clock) -> None:
    log, client = _logger(flush_s=5.0)
    for step in range(1, 40):  # 39 logged steps of 20 metrics, 0.1 s apart: 3.9 s
        clock.now += 0.1
        log.log_step(step, {f"m{i}": float(i) for i in range(20)})
    assert client.batches == []  # neither 5 s nor 1000 metrics yet
    clock.now += 1.2
    log.log_step(40, {"m0": 0.0})
    assert len(client.batches) == 1 and len(client.batches[0]) == 39 * 20 + 1
    clock.now += 1.0
    log.log_step(41, {"m0": 0.0})
    assert len(client.batches) == 1  # the clock restarted at the write


def test_a_first_step_after_a_long_setup_waits_its_turn(clock: _Clock) -> None:
    """The clock starts with the oldest buffered metric, not at the last write: after a slow model
    build the first logged step is not written at once (a worker killed a step later leaves no
    history, so its retry stays in the run: record/attempts.py)."""
    log, client = _logger(flush_s=5.0)
    log.log_final({"queue_s": 1.0})  # written at once, as at a trial's start
    clock.now += 30.0  # model build and data loading on a loaded machine
    log.log_step(2, {"train/loss": 1.0})
    assert len(client.batches) == 1  # only the queue time
    clock.now += 4.9
    log.log_step(4, {"train/loss": 1.0})
    assert len(client.batches) == 1
    clock.now += 0.2
    log.log_step(6, {"train/loss": 1.0})
    assert [len(b) for b in client.batches] == [1, 3]  # step 2 waited 5.1 s


def test_a_full_batch_is_written_at_once(clock: _Clock) -> None:
    log, client = _logger(flush_s=60.0)
    for step in range(1, 35):
        log.log_step(step, {f"m{i}": 1.0 for i in range(30)})  # 1020 metrics at step 34
    assert [len(b) for b in client.batches] == [1000]
    log.flush()
    assert [len(b) for b in client.batches] == [1000, 20]


def test_a_checkpointed_trial_writes_only_when_flushed(clock: _Clock) -> None:
    log, client = _logger()
    log.hold_until_flush()
    for step in range(1, 200):
        clock.now += 1.0
        log.log_step(step, {f"m{i}": 1.0 for i in range(10)})
    assert client.batches == []
    log.flush()
    assert sum(len(b) for b in client.batches) == 1990


def test_a_failed_write_is_retried_after_flush_s_not_every_step(clock: _Clock) -> None:
    log, client = _logger(flush_s=5.0)
    calls = []

    def failing(run_id: str, metrics: list[Any] = (), **_: Any) -> None:
        calls.append(len(metrics))
        raise ConnectionError("store down")

    client.log_batch = failing  # type: ignore[method-assign]
    for step in range(1, 111):  # 11 s of steps 0.1 s apart
        clock.now += 0.1
        log.log_step(step, {"train/loss": 1.0})
    assert len(calls) == 2  # 5 s and 10 s after the first step
    assert len(log._metrics) == 110  # nothing dropped
