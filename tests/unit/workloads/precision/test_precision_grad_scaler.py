"""Selective LoRA gradient scaler: skip + halve on overflow, grow x1.5 after good steps."""

import math

import pytest
import torch

from workloads.precision.grad_scaler import GradScalerConfig, LoraGradScaler


def grads(*values: float) -> list[torch.Tensor]:
    return [torch.full((2, 2), v) for v in values]


def test_defaults_follow_the_article():
    cfg = GradScalerConfig()
    assert (cfg.init_scale, cfg.growth_factor, cfg.backoff_factor, cfg.growth_interval) == (
        1024.0,
        1.5,
        0.5,
        100,
    )
    assert cfg.backoff_above_grad_norm is None and cfg.grow_below_grad_norm is None
    assert LoraGradScaler().scale_loss(torch.tensor(2.0)) == 2048.0


def test_overflow_skips_the_step_and_halves_the_scale():
    scaler = LoraGradScaler()
    g = grads(1.0, math.inf)
    assert scaler.unscale_(g) is False
    assert scaler.scale == 512.0 and scaler.skipped_steps == 1
    assert g[0][0, 0] == 1.0  # untouched: the step is skipped anyway
    assert scaler.unscale_(grads(math.nan)) is False and scaler.scale == 256.0


def test_finite_grads_are_unscaled_exactly():
    scaler = LoraGradScaler()
    g = grads(1024.0 * 3e-7, 2048.0)
    assert scaler.unscale_(g) is True
    assert g[0][0, 0] == pytest.approx(3e-7) and g[1][0, 0] == 2.0
    assert scaler.last_max_grad_norm == pytest.approx(4.0)  # ||[2,2,2,2]|| unscaled


def test_growth_after_interval_and_reset_on_overflow():
    scaler = LoraGradScaler(GradScalerConfig(growth_interval=3, init_scale=8.0))
    for _ in range(2):
        scaler.unscale_(grads(1.0))
    assert scaler.scale == 8.0
    scaler.unscale_(grads(1.0))
    assert scaler.scale == 12.0 and scaler.good_steps == 0
    scaler.unscale_(grads(1.0))
    scaler.unscale_(grads(math.inf))
    assert scaler.scale == 6.0 and scaler.good_steps == 0


def test_scale_is_bounded():
    scaler = LoraGradScaler(GradScalerConfig(init_scale=1.0, min_scale=1.0))
    scaler.unscale_(grads(math.inf))
    assert scaler.scale == 1.0
    scaler = LoraGradScaler(GradScalerConfig(init_scale=4.0, max_scale=5.0, growth_interval=1))
    scaler.unscale_(grads(1.0))
    assert scaler.scale == 5.0


def test_optional_article_norm_rules():
    cfg = GradScalerConfig(
        init_scale=16.0, backoff_above_grad_norm=1.0, grow_below_grad_norm=0.01, growth_interval=2
    )
    scaler = LoraGradScaler(cfg)
    assert scaler.unscale_(grads(16.0 * 1.0)) is True  # unscaled norm 2 > 1 -> halve, but step
    assert scaler.scale == 8.0
    for _ in range(2):
        scaler.unscale_(grads(8.0 * 0.1))  # norm 0.2: neither halves nor counts towards growth
    assert scaler.scale == 8.0 and scaler.good_steps == 0
    for _ in range(2):
        scaler.unscale_(grads(8.0 * 1e-3))  # norm 2e-3 < 0.01 -> counts
    assert scaler.scale == 12.0


def test_config_validation_and_state_roundtrip():
    with pytest.raises(ValueError, match="growth_factor"):
        GradScalerConfig(growth_factor=1.0)
    a = LoraGradScaler()
    a.unscale_(grads(math.inf))
    b = LoraGradScaler()
    b.load_state_dict(a.state_dict())
    assert b.scale == 512.0 and b.skipped_steps == 1
