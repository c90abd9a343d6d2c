"""Health signals and verdicts on hand-built situations (docs/health.md): frozen adapters,
saturating activations, a diverging loss, a healthy run; plus the rules' own validation."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from peft import LoraConfig, get_peft_model
from torch import nn

from fp8lab_conf.contracts import (METRIC_HEALTH_LOSS_VS_REF, METRIC_HEALTH_MOVEMENT_MEDIAN,
                                   METRIC_HEALTH_MOVEMENT_MIN, METRIC_HEALTH_STD_MIN)
from workloads.health.monitor import HealthMonitor, verdict_step
from workloads.health.rules import HealthRules, rule_problems
from workloads.health.signals import AdapterProbe
from workloads.model.loading import base_weight_norms

DEFAULT_RULES = Path(__file__).parents[4] / "conf" / "health" / "default.yaml"


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _lora_model() -> nn.Module:
    torch.manual_seed(0)
    return get_peft_model(_Tiny(), LoraConfig(r=4, lora_alpha=8, target_modules=["up", "down"]))


def _train(model: nn.Module, steps: int, lr: float) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    for _ in range(steps):
        x = torch.randn(8, 16)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture(scope="module")
def rules() -> HealthRules:
    return HealthRules.from_config(yaml.safe_load(DEFAULT_RULES.read_text())["rules"])


def _signals(probe: AdapterProbe, **extra: float) -> dict[str, float]:
    out = {k: float(v) for k, v in probe.device_signals().items()}
    return {"train/loss": 1.0, **out, **extra}


def test_frozen_adapters_are_doomed(rules: HealthRules) -> None:
    model = _lora_model()
    probe = AdapterProbe(model, base_weight_norms(model))
    signals = _signals(probe)  # no step taken: lora_B is still exactly zero
    assert signals[METRIC_HEALTH_MOVEMENT_MIN] == 0.0 and signals[METRIC_HEALTH_STD_MIN] == 0.0
    verdict = rules.judge(20, signals)
    assert verdict.verdict == "doomed"
    assert "adapters frozen" in verdict.reasons[0] and "health/adapter_movement_min=0" in verdict.reasons[0]
    assert METRIC_HEALTH_LOSS_VS_REF in verdict.missing  # no reference trial: said, not guessed
    assert verdict.line().endswith("(not checked: loss far above the reference trial's, no health/loss_vs_ref)")


def test_healthy_run_moves_its_adapters_and_is_healthy(rules: HealthRules) -> None:
    model = _lora_model()
    probe = AdapterProbe(model, base_weight_norms(model))
    _train(model, 5, 1e-3)
    signals = _signals(probe, **{METRIC_HEALTH_LOSS_VS_REF: 1.02, "telemetry/activation/overflow_pct": 0.0,
                                 "telemetry/dgrad/underflow_pct": 1.0})
    assert signals[METRIC_HEALTH_MOVEMENT_MIN] > 1e-4
    verdict = rules.judge(20, signals)
    assert (verdict.verdict, verdict.reasons) == ("healthy", ())


def test_movement_is_the_relative_change_of_the_adapted_weight() -> None:
    model = _lora_model()
    layer = model.base_model.model.up
    a0, b0 = layer.lora_A["default"].weight.detach().clone(), layer.lora_B["default"].weight.detach().clone()
    probe = AdapterProbe(model, base_weight_norms(model))
    _train(model, 3, 1e-2)
    a, b = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
    down = model.base_model.model.down
    with torch.no_grad():
        expected = (layer.scaling["default"] * (b @ a - b0 @ a0)).norm() / layer.get_base_layer().weight.norm()
        expected_down = (down.scaling["default"] * (down.lora_B["default"].weight @ down.lora_A["default"].weight)).norm() \
            / down.get_base_layer().weight.norm()
    got = probe.device_signals()
    assert float(got[METRIC_HEALTH_MOVEMENT_MIN]) == pytest.approx(min(float(expected), float(expected_down)), rel=1e-4)
    assert float(got[METRIC_HEALTH_MOVEMENT_MEDIAN]) > 0


def test_saturating_activations_put_a_moving_run_at_risk(rules: HealthRules) -> None:
    model = _lora_model()
    probe = AdapterProbe(model, base_weight_norms(model))
    _train(model, 3, 1e-3)
    verdict = rules.judge(20, _signals(probe, **{"telemetry/activation/overflow_pct": 4.0}))
    assert verdict.verdict == "at_risk"
    assert verdict.reasons == ("activations saturate (telemetry/activation/overflow_pct=4 > 0.1)",)


def test_loss_far_above_the_reference_or_not_finite_is_doomed(rules: HealthRules) -> None:
    model = _lora_model()
    probe = AdapterProbe(model, base_weight_norms(model))
    _train(model, 3, 1e-3)
    assert rules.judge(20, _signals(probe, **{METRIC_HEALTH_LOSS_VS_REF: 3.0})).verdict == "doomed"
    assert rules.judge(20, _signals(probe, **{METRIC_HEALTH_LOSS_VS_REF: 1.5})).verdict == "at_risk"
    nan_loss = {**_signals(probe), "train/loss": math.nan}
    assert "loss not finite" in rules.judge(20, nan_loss).reasons[0]


class _Tags:
    def __init__(self) -> None:
        self.tags: dict = {}

    def set_tags(self, tags: dict) -> None:
        self.tags.update(tags)


def test_monitor_judges_once_at_its_step_tags_the_run_and_stops_only_when_allowed(rules: HealthRules) -> None:
    model = _lora_model()
    logger = _Tags()
    probe = AdapterProbe(model, base_weight_norms(model))
    monitor = HealthMonitor(probe, handle=None, rules=rules, step=20, early_stop=True,
                            reference=lambda step: 2.0, logger=logger)
    metrics = {"train/loss": 9.0, **{k: float(v) for k, v in monitor.device_signals().items()}}
    assert monitor.observe(10, dict(metrics)) is None
    verdict = monitor.observe(20, metrics)
    assert metrics[METRIC_HEALTH_LOSS_VS_REF] == 4.5 and metrics["health/ref_loss"] == 2.0
    assert verdict.verdict == "doomed" and monitor.stops(verdict)
    assert logger.tags["fp8lab.health.verdict"] == "doomed" and logger.tags["fp8lab.health.step"] == 20
    probe = AdapterProbe(model, base_weight_norms(model))
    assert not HealthMonitor(probe, None, rules, 20, early_stop=False).stops(verdict)


@pytest.mark.parametrize(("at", "steps", "log_every", "tele", "step", "moved"), [
    (0.1, 200, 10, 10, 20, False),
    (0.1, 400, 10, 10, 40, False),
    (0.1, 150, 10, 10, 20, True),     # step 15 logs nothing: the next logged step with telemetry
    (0.1, 200, 10, None, 20, False),  # telemetry off: any logged step
    (7, 50, 5, 5, 10, True),
    (0.9, 25, 10, 10, 25, True),      # past the last multiple: the last step (always logged)
])
def test_verdict_step_is_a_logged_step(at: float, steps: int, log_every: int, tele: int | None, step: int,
                                       moved: bool) -> None:
    got, note = verdict_step(at, steps, log_every, tele)
    assert got == step and bool(note) == moved


def test_rules_file_problems_are_reported_together_one_line_each() -> None:
    assert rule_problems(yaml.safe_load(DEFAULT_RULES.read_text())["rules"]) == []
    bad = [{"verdict": "fatal", "why": "", "when": [{"metric": "train/loss", "op": "~", "value": 1}]},
           {"verdict": "doomed", "why": "x", "when": [{"metric": "train/loss", "op": ">", "value": "big"}]},
           {"verdict": "at_risk", "why": "y", "when": []}]
    problems = rule_problems(bad)
    assert [p.split(":")[0] for p in problems] == ["health.rules[0].verdict", "health.rules[0].why",
                                                  "health.rules[0].when[0].op", "health.rules[1].when[0].value",
                                                  "health.rules[2].when"]
    assert all("fix:" in p for p in problems)
