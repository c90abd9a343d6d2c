"""The recipe is the whole trial: ``recipe.run`` runs setup -> train -> evaluate -> export and
hands back plain values; it writes nothing itself (what it records goes through the hooks)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fp8lab_conf.contracts import METRIC_EVAL_LOSS, METRIC_FINAL_LOSS, STATUS_STOPPED_EARLY
from workloads import recipe
from workloads.train.loop import TrainResult


class _Logger:
    """A TrialLogger that keeps what the loop and the health monitor write."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def log_step(self, step: int, metrics: dict) -> None:
        self.steps.append(step)

    def set_tags(self, tags: dict) -> None: ...

    def flush(self) -> None: ...


class _Hooks:
    """recipe.RunHooks that note which hook was called, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.logger = _Logger()

    def on_device(self, device: torch.device) -> None:
        self.calls.append("device")

    def on_rows(self, rows, embedded_dir: Path) -> None:
        self.calls.append("rows")

    def on_precision(self, trial: recipe.Trial) -> None:
        self.calls.append("precision")

    def flush_at_checkpoints(self) -> None:
        self.calls.append("checkpoints")

    def reference(self, policy: str):
        self.calls.append(f"reference:{policy}")
        return lambda step: None


def test_run_is_the_whole_trial(tmp_path: Path) -> None:
    """Every stage runs once, in order, for a trial that finishes: setup (base eval included),
    training, the held-out loss and lm-eval, and the adapter to keep."""
    from benchmarks._common import default_config

    config = default_config(["precision=fp8_naive", "train.steps=2", "train.batch_size=2", "train.log_every=1",
                             "train.num_threads=1", "eval.limit=1", "eval.before_training=true", "eval.loss_rows=2"])
    hooks = _Hooks()
    with _stages_called_by_the_spine() as stages:
        outcome = recipe.run(config, hooks)
    # the stages in order: runtime (embedded paths, the memory baseline), model, data, the base
    # model's score (eval), precision (its calibration reads batches from data), the loss-curve
    # hook (eval), health and train, the final scores
    assert stages == ["embedded", "train", "model", "data", "eval", "precision", "data", "precision", "eval", "health",
                      "train", "eval"], stages
    assert hooks.calls == ["device", "rows", "precision", f"reference:{config['health']['reference_policy']}"]
    assert hooks.logger.steps[:2] == [1, 2]
    assert (outcome.status, outcome.reason, outcome.steps_done, outcome.diverged_step) == ("FINISHED", "", 2, None)
    assert {"eval/base_accuracy", METRIC_FINAL_LOSS, METRIC_EVAL_LOSS, "eval/accuracy",
            "train/tokens_per_epoch"} <= set(outcome.metrics)
    assert outcome.scores is not None and len(outcome.scores.heldout_rows) == 2 and outcome.scores.aggregate == "mean"
    name, save = outcome.adapter
    assert name == "adapter" and (save(tmp_path / name) / "adapter_config.json").is_file()


class _stages_called_by_the_spine:
    """The workloads packages that ``recipe.py`` calls into, in order, repeats collapsed (a
    profile hook: only calls made from a frame of recipe.py, into a package's module)."""

    def __enter__(self) -> list[str]:
        self.stages: list[str] = []
        spine, root = recipe.__file__, Path(recipe.__file__).parent

        def hook(frame, event, _arg) -> None:
            if event != "call" or frame.f_back is None or frame.f_back.f_code.co_filename != spine:
                return
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(root) and len(path.relative_to(root).parts) > 1:
                package = path.relative_to(root).parts[0]
                if not self.stages or self.stages[-1] != package:
                    self.stages.append(package)

        sys.setprofile(hook)
        return self.stages

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


@pytest.mark.parametrize(("status", "reason", "stopped", "kept"), [
    ("FINISHED", "", None, True),
    ("DIVERGED", "non-finite loss at step 4", None, False),
    (STATUS_STOPPED_EARLY, "stopped early at step 5: doomed (loss far above the reference)", 5, False),
])
def test_export_says_why_and_keeps_the_adapter_of_a_finished_trial(status, reason, stopped, kept) -> None:
    trial = SimpleNamespace(model=object(), train_data=SimpleNamespace(attention_mask=torch.ones(3, 4)),
                            telemetry=SimpleNamespace(whatif=None))
    trained = TrainResult(status=status, steps_done=5, diverged_step=4 if status == "DIVERGED" else None,
                          verdict="doomed (loss far above the reference)" if stopped else "")
    outcome = recipe.export(trial, trained, {"train/final_loss": 1.0}, None, keep_adapter=True)
    assert (outcome.status, outcome.reason, outcome.stopped_step) == (status, reason, stopped)
    assert outcome.metrics == {"train/final_loss": 1.0, "train/tokens_per_epoch": 12.0}
    assert (outcome.adapter is not None) == kept
    assert recipe.export(trial, trained, {}, None, keep_adapter=False).adapter is None
