"""accelerate_train_mode: validation, the low-precision start, and the one-way switch."""

from __future__ import annotations

import pytest

from precision_tool.engine.device import golden, npu
from precision_tool.errors import ConfigError
from precision_tool.session import AccelerateTrainMode, Session, SessionConfig, parse_accelerate


def run(steps=20, device=None, **options):
    session = Session(SessionConfig(model="mlp", steps=steps, device=device or npu(), **options))
    return session, session.run()


def test_step_trigger_switches_at_step_10_of_20_at_ratio_half():
    session, summary = run(accelerate_train_mode="fast|step|0.5")
    assert summary.accelerate_switch_step == 10
    modes = [r.precision_mode for r in summary.results]
    assert modes == ["allow_mix_precision_fp16"] * 10 + ["allow_fp32_to_fp16"] * 10
    assert session.device == npu()


def test_step_trigger_default_ratio_is_0_9():
    _, summary = run(accelerate_train_mode="fast|step")
    assert summary.accelerate_switch_step == 18


def test_fast1_trains_in_bf16_then_recompiles_with_the_original_mode():
    session = Session(SessionConfig(model="mlp", steps=10, device=npu(), accelerate_train_mode="fast1|step|0.2"))
    assert session.device.precision_mode == "allow_mix_precision_bf16"
    assert session.program.node("fc1/MatMulBiasAddRelu").precision.compute.name == "bfloat16"
    session.run()
    assert session.accelerate_switch_step == 2
    assert session.device.precision_mode is None
    assert session.program.node("fc1/MatMulBiasAddRelu").precision.compute.name == "float16"


def test_precision_mode_v2_uses_the_v2_mixed_modes():
    _, summary = run(steps=10, device=npu(precision_mode_v2="origin"), accelerate_train_mode="fast|step|0.5")
    assert [r.precision_mode for r in summary.results] == ["mixed_float16"] * 5 + ["origin"] * 5


def test_loss_trigger_switches_after_the_first_step_at_or_below_target_times_ratio():
    target = 0.6
    _, summary = run(steps=30, accelerate_train_mode="fast|loss|1.05", target_loss=target)
    first_low = next(i for i, loss in enumerate(summary.losses) if loss <= target * 1.05)
    assert summary.accelerate_switch_step == first_low + 1
    assert summary.accelerate_switch_step == 20
    assert all(loss > target * 1.05 for loss in summary.losses[:first_low])
    modes = [r.precision_mode for r in summary.results]
    assert modes[first_low] == "allow_mix_precision_fp16" and modes[first_low + 1] == "allow_fp32_to_fp16"


def test_loss_trigger_never_fires_above_target():
    _, summary = run(steps=5, accelerate_train_mode="fast|loss|1.01", target_loss=0.01)
    assert summary.accelerate_switch_step is None
    assert {r.precision_mode for r in summary.results} == {"allow_mix_precision_fp16"}


def test_the_switch_is_one_way():
    mode = AccelerateTrainMode("fast|loss|1.5", npu())
    assert mode.tell(loss=0.0, target_loss=1.0) is False  # a zero loss never triggers
    assert mode.tell(loss=1.4, target_loss=1.0) is True
    assert mode.tell(loss=9.0, target_loss=1.0) is False
    assert mode.device == npu()


def test_golden_keeps_its_device_but_keeps_time():
    session, summary = run(device=golden(), accelerate_train_mode="fast|step|0.5")
    assert summary.accelerate_switch_step == 10
    assert session.device == golden()
    assert {r.precision_mode for r in summary.results} == {"golden_float32"}


def test_spec_is_normalised_in_metadata():
    session = Session(SessionConfig(device=npu(), accelerate_train_mode="fast1|loss", target_loss=1.0))
    assert session.metadata()["accelerate_train_mode"] == "fast1|loss|1.05"


@pytest.mark.parametrize("spec, message", [
    ("fast", "expected fast|fast1 '|' step|loss ['|' ratio]"),
    ("fast|step|0.5|1", "expected fast|fast1"),
    ("slow|step|0.5", "first field must be fast or fast1, got 'slow'"),
    ("fast|epoch|0.5", "second field must be step or loss, got 'epoch'"),
    ("fast|step|0.1", "a step ratio must be in 0.2-0.9, got 0.1"),
    ("fast|step|0.95", "a step ratio must be in 0.2-0.9, got 0.95"),
    ("fast|loss|1.0", "a loss ratio must be in 1.01-1.5, got 1.0"),
    ("fast|loss|1.6", "a loss ratio must be in 1.01-1.5, got 1.6"),
    ("fast|step|half", "ratio 'half' is not a number"),
])
def test_bad_specs(spec, message):
    with pytest.raises(ConfigError) as info:
        SessionConfig(device=npu(), accelerate_train_mode=spec, target_loss=1.0)
    assert message in str(info.value) and spec in str(info.value)


def test_ratio_bounds_are_inclusive():
    assert parse_accelerate("fast|step|0.2").ratio == 0.2
    assert parse_accelerate("fast|step|0.9").ratio == 0.9
    assert parse_accelerate("fast1|loss|1.01").ratio == 1.01
    assert parse_accelerate("fast1|loss|1.5").ratio == 1.5


@pytest.mark.parametrize("device, message", [
    (npu(precision_mode="force_fp16"), "needs precision_mode allow_fp32_to_fp16 or must_keep_origin_dtype or none, "
                                       "got 'force_fp16'"),
    (npu(precision_mode="allow_mix_precision"), "got 'allow_mix_precision'"),
    (npu(precision_mode_v2="fp16"), "needs precision_mode_v2 origin or none, got 'fp16'"),
    (npu(precision_mode_v2="mixed_float16"), "got 'mixed_float16'"),
])
def test_disallowed_precision_modes(device, message):
    with pytest.raises(ConfigError, match="accelerate_train_mode") as info:
        SessionConfig(device=device, accelerate_train_mode="fast|step|0.5")
    assert message in str(info.value)


@pytest.mark.parametrize("device", [npu(precision_mode="allow_fp32_to_fp16"),
                                    npu(precision_mode="must_keep_origin_dtype"),
                                    npu(precision_mode_v2="origin"), npu()])
def test_allowed_precision_modes(device):
    SessionConfig(device=device, accelerate_train_mode="fast|step|0.5")


def test_loss_trigger_needs_a_target_loss():
    with pytest.raises(ConfigError, match="triggers on loss: set target_loss too"):
        SessionConfig(device=npu(), accelerate_train_mode="fast|loss|1.05")
