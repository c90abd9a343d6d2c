"""Run the workload's preflight checks (files, policy names, devices, lm-eval tasks) in a child
process, so the orchestrator itself never imports torch, and turn them into one UserInputError.

`start_preflight` returns at once: the child imports torch (seconds) while the caller goes on."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from orchestrator.errors import UserInputError


class PendingPreflight:
    """A running preflight child; `wait()` raises UserInputError listing every problem."""

    def __init__(self, configs: list[dict[str, Any]]) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "workloads.preflight"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:  # the child reads all of stdin first, then checks: hand it everything now
            self._proc.stdin.write(json.dumps(configs, default=str))
        except BrokenPipeError:  # it died at start: wait() reports its stderr
            pass
        finally:
            stdin, self._proc.stdin = self._proc.stdin, None  # communicate() must not touch it again
            try:
                stdin.close()
            except BrokenPipeError:
                pass

    def wait(self) -> list[dict[str, Any]]:
        """Per config (in order), the `train` keys its data decided (`train.max_seq_len: null`,
        `train.epochs` -> steps); raises UserInputError listing every problem."""
        try:
            stdout, stderr = self._proc.communicate()
        except BaseException:  # Ctrl-C while waiting: leave no child behind
            self._proc.kill()
            self._proc.wait()
            raise
        if self._proc.returncode != 0:
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"preflight checks crashed: {tail}")
        answer = json.loads(stdout)
        if answer["problems"]:
            raise UserInputError(answer["problems"])
        return answer["train"]


def start_preflight(configs: list[dict[str, Any]]) -> PendingPreflight:
    return PendingPreflight(configs)


def preflight(configs: list[dict[str, Any]]) -> None:
    """Raise UserInputError listing every problem of every config; return quietly when all is well."""
    start_preflight(configs).wait()
