"""Loss-scale managers: the exact rules and trajectories of NUMERICS.md section 4."""

from __future__ import annotations

import numpy as np
import pytest

from precision_tool.errors import ConfigError
from precision_tool.session import (
    DynamicLossScaleUpdateCell,
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    GradScaler,
    parse_loss_scale,
)

# NUMERICS.md 4.6: init 8, factor 2, window/incr 3, TF1 decr_every 2, ratio .8; steps 1..15
FINITE = [True, True, True, False, True, True, False, True, False, True, True, True, True, True, True]
F32 = np.float32
EXPONENTIAL = [8, 8, 16, 16, 16, 16, F32(12.8), F32(12.8), F32(12.8), F32(12.8), F32(12.8),
               F32(25.6), F32(25.6), F32(25.6), F32(51.2)]
HALVING = [8, 8, 16, 8, 8, 8, 4, 4, 2, 2, 2, 4, 4, 4, 8]  # MindSpore cell and torch GradScaler
TABLE_STEPS = {1: (8, 8), 2: (8, 8), 3: (16, 16), 4: (16, 8), 5: (16, 8), 6: (16, 8), 7: (12.8, 4),
               9: (12.8, 2), 12: (25.6, 4), 15: (51.2, 8)}  # step: (TF1/npu_bridge, MS-Cell/torch)


def trajectory(manager, finite=FINITE) -> list[float]:
    scales = []
    for ok in finite:
        manager.update(not ok)
        scales.append(manager.scale)
    return scales


def test_exponential_reproduces_the_tf1_and_npu_bridge_column():
    manager = ExponentialUpdateLossScaleManager(8, incr_every_n_steps=3, decr_every_n_nan_or_inf=2,
                                                incr_ratio=2, decr_ratio=0.8)
    scales = trajectory(manager)
    assert scales == [float(F32(s)) for s in EXPONENTIAL]
    for step, (expected, _) in TABLE_STEPS.items():
        assert scales[step - 1] == float(F32(expected))


def test_mindspore_cell_reproduces_its_column():
    scales = trajectory(DynamicLossScaleUpdateCell(8, scale_factor=2, scale_window=3))
    assert scales == [float(s) for s in HALVING]
    assert all(scales[step - 1] == ms for step, (_, ms) in TABLE_STEPS.items())


def test_gradscaler_reproduces_the_torch_column():
    scales = trajectory(GradScaler(8, growth_factor=2, backoff_factor=0.5, growth_interval=3))
    assert scales == [float(s) for s in HALVING]


def test_exponential_counts_bad_steps_accumulated_and_good_steps_consecutive():
    manager = ExponentialUpdateLossScaleManager(8, incr_every_n_steps=3, decr_every_n_nan_or_inf=2)
    trajectory(manager, [True, True, False])
    assert (manager.good_steps, manager.bad_steps) == (0, 1)
    trajectory(manager, [True, True])
    assert (manager.good_steps, manager.bad_steps, manager.scale) == (2, 1, 8.0)
    trajectory(manager, [False])  # the second bad step, not consecutive with the first
    assert manager.scale == float(F32(6.4))


def test_fixed_below_one_is_refused():
    with pytest.raises(ConfigError, match="loss_scale must be >= 1, got 0.5"):
        FixedLossScaleManager(0.5)


def test_fixed_never_changes():
    manager = FixedLossScaleManager(1024)
    assert trajectory(manager) == [1024.0] * len(FINITE)
    assert manager.check_overflow
    assert not FixedLossScaleManager(1024, enable_overflow_check=False).check_overflow


def test_exponential_floor_is_one():
    manager = ExponentialUpdateLossScaleManager(2, incr_every_n_steps=10, decr_every_n_nan_or_inf=1,
                                                decr_ratio=0.5)
    assert trajectory(manager, [False] * 4) == [1.0, 1.0, 1.0, 1.0]


def test_exponential_growth_stops_below_the_float32_maximum():
    manager = ExponentialUpdateLossScaleManager(2.0**126, incr_every_n_steps=1)
    assert trajectory(manager, [True] * 3) == [2.0**127] * 3
    tripling = ExponentialUpdateLossScaleManager(2.0**126, incr_every_n_steps=1, incr_ratio=3)
    assert trajectory(tripling, [True] * 3) == [float(F32(3 * 2.0**126))] * 3
    assert np.isfinite(tripling.scale)


def test_mindspore_cell_floor_is_one():
    assert trajectory(DynamicLossScaleUpdateCell(4, 2, 100), [False] * 4) == [2.0, 1.0, 1.0, 1.0]


def test_gradscaler_has_no_floor_and_keeps_finite():
    assert trajectory(GradScaler(2.0, 2.0, 0.5, 100), [False] * 3) == [1.0, 0.5, 0.25]
    assert trajectory(GradScaler(2.0**127, 2.0, 0.5, 1), [True] * 2) == [2.0**127] * 2


@pytest.mark.parametrize("spec, config", [
    ("fixed:128", {"kind": "fixed", "loss_scale": 128.0, "enable_overflow_check": True}),
    ("fixed:2**32,false", {"kind": "fixed", "loss_scale": 2.0**32, "enable_overflow_check": False}),
    ("exponential:2^32", {"kind": "exponential", "init_loss_scale": 2.0**32, "incr_every_n_steps": 1000,
                          "decr_every_n_nan_or_inf": 2, "incr_ratio": 2.0, "decr_ratio": 0.8}),
    ("exponential:65536,100,1,2,0.5", {"kind": "exponential", "init_loss_scale": 65536.0,
                                       "incr_every_n_steps": 100, "decr_every_n_nan_or_inf": 1,
                                       "incr_ratio": 2.0, "decr_ratio": 0.5}),
    ("dynamic:1024", {"kind": "dynamic", "loss_scale_value": 1024.0, "scale_factor": 2.0, "scale_window": 2000}),
    ("dynamic:1024,4,10", {"kind": "dynamic", "loss_scale_value": 1024.0, "scale_factor": 4.0,
                           "scale_window": 10}),
    ("gradscaler:8", {"kind": "gradscaler", "init_scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                      "growth_interval": 2000}),
    ("gradscaler:8,4,0.25,7", {"kind": "gradscaler", "init_scale": 8.0, "growth_factor": 4.0,
                               "backoff_factor": 0.25, "growth_interval": 7}),
])
def test_parse_loss_scale(spec, config):
    manager = parse_loss_scale(spec)
    assert manager.config() == config
    assert manager.scale == next(v for k, v in config.items() if k != "kind")


def test_config_keeps_the_initial_scale():
    manager = parse_loss_scale("dynamic:8,2,3")
    trajectory(manager)
    assert manager.scale == 8.0 and manager.config()["loss_scale_value"] == 8.0
    manager.update(True)
    assert manager.scale == 4.0 and manager.config()["loss_scale_value"] == 8.0


def test_parse_none():
    assert parse_loss_scale("none") is None
    assert parse_loss_scale(" None ") is None


@pytest.mark.parametrize("spec, message", [
    ("bogus:1", "bad loss scale 'bogus:1'; expected one of: none; fixed:V"),
    ("fixed", "bad loss scale 'fixed'; expected fixed:V[,CHECK]"),
    ("fixed:0.5", "bad loss scale 'fixed:0.5': loss_scale must be >= 1, got 0.5"),
    ("fixed:8,maybe", "expected fixed:V[,CHECK] with numbers"),
    ("exponential:8,x", "expected exponential:INIT[,INCR_EVERY_N_STEPS"),
    ("exponential:8,0", "incr_every_n_steps must be >= 1, got 0"),
    ("exponential:8,1.5", "incr_every_n_steps must be a whole number, got 1.5"),
    ("exponential:1e39", "loss scale must be a finite float32"),
    ("dynamic:8,2,3,4", "bad loss scale 'dynamic:8,2,3,4'; expected dynamic:INIT[,FACTOR[,WINDOW]]"),
    ("gradscaler:8,2,1.5", "backoff_factor must be in (0, 1), got 1.5"),
    ("gradscaler:8,1", "growth_factor must be > 1, got 1"),
])
def test_parse_errors_name_the_spec_and_the_form(spec, message):
    with pytest.raises(ConfigError) as info:
        parse_loss_scale(spec)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
