"""Session: step semantics, overflow handling, determinism, hooks, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from precision_tool.engine.device import npu
from precision_tool.engine.hooks import HookList, StepResult
from precision_tool.errors import ConfigError, InputError
from precision_tool.session import MODELS, FixedLossScaleManager, Session, SessionConfig, parse_loss_scale


def session(**options) -> Session:
    return Session(SessionConfig(**options))


def params_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class Recorder:
    """Records every hook call."""

    def __init__(self):
        self.calls = []
        self.events = []

    def on_run_begin(self, metadata):
        self.calls.append(("run_begin", metadata))

    def on_step_begin(self, step):
        self.calls.append(("step_begin", step))

    def before_op(self, event):
        self.events.append(("before", event.step, event.exec_index, event.direction, event.name, event.type))

    def after_op(self, event):
        self.events.append(("after", event.step, event.exec_index, event.direction, event.name, event.type))

    def on_step_end(self, result):
        self.calls.append(("step_end", result))

    def on_run_end(self, summary):
        self.calls.append(("run_end", summary))


# determinism and data

@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_two_golden_runs_are_bit_identical(model):
    first, second = session(model=model, steps=5), session(model=model, steps=5)
    a, b = first.run(), second.run()
    assert a.losses == b.losses
    assert params_equal(first.params, second.params)


def test_golden_and_npu_see_the_same_data_and_initial_weights():
    gold = session(model="cnn", steps=2)
    target = session(model="cnn", steps=2, device=npu(precision_mode="force_fp16"))
    assert params_equal(gold.params, target.params)
    assert all(v.dtype == np.float32 for v in target.params.values())
    for s in gold, target:
        s.step()
    assert np.array_equal(gold.executor.value("x"), target.executor.value("x"))
    assert np.array_equal(gold.executor.value("labels"), target.executor.value("labels"))
    assert not params_equal(gold.params, target.params)  # fp16 changed the update


def test_batches_do_not_depend_on_earlier_steps():
    data = session(model="transformer").data
    later = data.batch(7)
    for step in range(7):
        data.batch(step)
    again = data.batch(7)
    assert np.array_equal(later["x"], again["x"]) and np.array_equal(later["labels"], again["labels"])


def test_another_seed_gives_other_data_and_weights():
    a, b = session(seed=0), session(seed=1)
    assert not np.array_equal(a.data.batch(0)["x"], b.data.batch(0)["x"])
    assert not params_equal(a.params, b.params)


# step semantics

def test_step_returns_loss_overflow_and_scale():
    s = session(loss_scale=FixedLossScaleManager(128))
    loss, overflow, scale = s.step()
    assert (overflow, scale) == (False, 128.0)
    assert loss == s.results[0].loss and s.global_step == 1 and s.next_step == 1


def test_loss_scaling_is_exact_on_golden():
    # a power-of-two scale and its reciprocal are exact in float32
    plain, scaled = session(steps=3), session(steps=3, loss_scale="fixed:1024")
    plain.run(), scaled.run()
    assert params_equal(plain.params, scaled.params)


@pytest.mark.parametrize("spec", ["fixed:2**32", "exponential:2**32,1000,1"])
def test_fp16_npu_with_a_huge_scale_overflows_and_skips(spec):
    s = session(device=npu(precision_mode="force_fp16"), loss_scale=spec, steps=2)
    initial = {k: v.copy() for k, v in s.params.items()}
    summary = s.run()
    assert summary.overflow_steps == [0, 1] and summary.skipped_steps == [0, 1]
    assert summary.global_step == 0
    assert params_equal(s.params, initial)
    assert all(r.extra["first_overflow_op"] for r in summary.results)
    if spec.startswith("exponential"):
        assert summary.loss_scale_history == [2.0**32, float(np.float32(2.0**32 * 0.8))]
        assert s.loss_scale.scale == float(np.float32(np.float32(2.0**32 * 0.8) * np.float32(0.8)))
    else:
        assert summary.loss_scale_history == [2.0**32, 2.0**32]


def test_exponential_scale_drops_until_steps_stop_overflowing():
    s = session(device=npu(precision_mode="force_fp16"), loss_scale="exponential:2**20,1000,1,2,0.5", steps=12)
    summary = s.run()
    history = summary.loss_scale_history
    assert summary.overflow_steps == list(range(len(summary.overflow_steps)))  # a run of overflows, then none
    assert 0 < len(summary.overflow_steps) < 12
    assert history[:len(summary.overflow_steps) + 1] == [2.0**(20 - i) for i in range(len(summary.overflow_steps) + 1)]
    assert summary.global_step == 12 - len(summary.overflow_steps)


def test_overflow_check_disabled_never_skips():
    s = session(device=npu(precision_mode="force_fp16"), loss_scale="fixed:2**32,false", steps=2)
    summary = s.run()
    assert summary.overflow_steps == [0, 1]  # still reported
    assert summary.skipped_steps == [] and summary.global_step == 2


def test_without_a_manager_overflow_is_reported_and_the_update_applied():
    s = session(model="transformer", device=npu(precision_mode="force_fp16"), steps=1, lr=1e5)
    s.step()
    initial = {k: v.copy() for k, v in s.params.items()}
    loss, overflow, scale = s.step()  # the huge first update blows the forward up
    assert overflow and scale == 1.0
    assert s.global_step == 2 and not params_equal(s.params, initial)


class StatusRaiser:
    """Raises the float status in the last backward op, leaving every gradient finite."""

    def __init__(self):
        self.session = None

    def after_op(self, event):
        if event.direction == "backward":
            self.session.status.raise_(None)


@pytest.mark.parametrize("overflow_mode, detected", [("saturation", True), ("inf_nan", False)])
def test_saturation_reads_the_float_status_and_inf_nan_the_gradients(overflow_mode, detected):
    raiser = StatusRaiser()
    s = Session(SessionConfig(device=npu(overflow_mode=overflow_mode), loss_scale="fixed:8"), hooks=[raiser])
    raiser.session = s
    _, overflow, _ = s.step()
    assert overflow is detected


def test_inf_nan_mode_detects_non_finite_gradients():
    s = session(device=npu(precision_mode="force_fp16", overflow_mode="inf_nan"), loss_scale="fixed:2**32")
    _, overflow, _ = s.step()
    assert overflow and s.global_step == 0
    assert s.results[0].skipped


def test_the_status_is_cleared_at_each_step_start():
    s = session(device=npu(precision_mode="force_fp16"), loss_scale="gradscaler:2**32,2,2**-20,1000", steps=2)
    summary = s.run()
    assert summary.overflow_steps == [0]  # step 1 runs at scale 2**12 and the flag was cleared


def test_each_session_starts_from_the_configured_manager_state():
    config = SessionConfig(device=npu(precision_mode="force_fp16"), loss_scale="dynamic:2**32", steps=2)
    Session(config).run()
    assert Session(config).loss_scale.scale == 2.0**32
    assert config.loss_scale.scale == 2.0**32


# hooks

def test_hooks_see_forward_backward_and_optimizer_ops_each_step():
    recorder = Recorder()
    s = Session(SessionConfig(model="mlp", steps=2, optimizer="momentum"), hooks=[recorder])
    s.run()
    for step in (0, 1):
        after = [e for e in recorder.events if e[0] == "after" and e[1] == step]
        before = [e for e in recorder.events if e[0] == "before" and e[1] == step]
        assert [e[2] for e in after] == list(range(len(after)))
        assert [e[2:] for e in before] == [e[2:] for e in after]
        directions = [e[3] for e in after]
        assert directions == sorted(directions, key=["forward", "backward", "optimizer"].index)
        assert {"forward", "backward", "optimizer"} == set(directions)
        optimizer = [e for e in after if e[3] == "optimizer"]
        assert [e[4] for e in optimizer] == [f"{name}/ApplyMomentum" for name in s.params]
        assert {e[5] for e in optimizer} == {"ApplyMomentum"}


class OverflowWatcher:
    """Sees only the ops that raise the float status (the collector in overflow mode)."""

    only_overflowing_ops = True

    def __init__(self):
        self.events = []

    def after_op(self, event):
        self.events.append((event.step, event.exec_index, event.direction, event.name, event.overflow,
                            [None if a is None else a.copy() for a in event.inputs], list(event.input_dtypes),
                            [None if a is None else a.copy() for a in event.outputs], event.status))


@pytest.mark.parametrize("overflow_mode", ["saturation", "inf_nan"])
def test_a_hook_of_overflowing_ops_alone_sees_them_as_a_hook_of_every_op_does(overflow_mode):
    def run(hook):
        device = npu(precision_mode="force_fp16", overflow_mode=overflow_mode)
        Session(SessionConfig(model="mlp", steps=2, device=device, loss_scale="fixed:2**32", optimizer="momentum"),
                hooks=[hook]).run()
        return hook.events

    class EveryOp(OverflowWatcher):
        only_overflowing_ops = False

        def after_op(self, event):
            if event.overflow:
                super().after_op(event)

    alone, among_all = run(OverflowWatcher()), run(EveryOp())
    assert alone and {e[2] for e in alone} >= {"backward"}
    assert len(alone) == len(among_all)
    for mine, theirs in zip(alone, among_all):
        assert mine[:5] == theirs[:5] and mine[6] == theirs[6] and mine[8] == theirs[8]
        for a, b in ((mine[5], theirs[5]), (mine[7], theirs[7])):
            assert all((x is None and y is None) or np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def test_events_are_built_for_every_op_only_when_a_hook_wants_them():
    assert not HookList([OverflowWatcher()]).every_op
    assert HookList([OverflowWatcher(), Recorder()]).every_op
    assert not HookList().every_op


def test_run_calls_run_and_step_hooks_in_order():
    recorder = Recorder()
    summary = Session(SessionConfig(steps=2), hooks=HookList([recorder])).run()
    kinds = [(c[0], c[1] if c[0] == "step_begin" else None) for c in recorder.calls]
    assert kinds == [("run_begin", None), ("step_begin", 0), ("step_end", None), ("step_begin", 1),
                     ("step_end", None), ("run_end", None)]
    metadata, ends, final = recorder.calls[0][1], recorder.calls[2][1], recorder.calls[-1][1]
    assert isinstance(ends, StepResult) and ends.step == 0 and ends.precision_mode == "golden_float32"
    assert final == json.loads(json.dumps(summary.to_dict()))
    assert json.loads(json.dumps(metadata)) == metadata


def test_metadata_describes_the_run():
    s = session(model="cnn", steps=3, device=npu(), loss_scale="exponential:1024,10", optimizer="adam")
    meta = json.loads(json.dumps(s.metadata()))
    assert meta["model"] == "cnn" and meta["task"] == "classification"
    assert (meta["steps"], meta["seed"], meta["batch_size"], meta["optimizer"], meta["lr"]) == (3, 0, 32, "adam", 0.01)
    assert meta["device"] == npu().describe()
    assert meta["loss_scale"] == parse_loss_scale("exponential:1024,10").config()
    assert meta["accelerate_train_mode"] is None and meta["version"]


def test_keyboard_interrupt_propagates_without_run_end():
    class Interrupt(Recorder):
        def on_step_end(self, result):
            super().on_step_end(result)
            if result.step == 1:
                raise KeyboardInterrupt

    hook = Interrupt()
    with pytest.raises(KeyboardInterrupt):
        Session(SessionConfig(steps=5), hooks=[hook]).run()
    assert [c[0] for c in hook.calls][-1] == "step_end"


# models, optimizers and configuration errors

@pytest.mark.parametrize("model", MODELS)
def test_each_model_learns_on_golden_within_40_steps(model):
    losses = np.array(session(model=model, steps=40).run().losses)
    assert np.isfinite(losses).all()
    assert losses[-5:].mean() < 0.6 * losses[:5].mean()


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_other_optimizers_learn(optimizer):
    losses = np.array(session(model="mlp", steps=30, optimizer=optimizer).run().losses)
    assert losses[-5:].mean() < 0.6 * losses[:5].mean()


def test_sgd_update_is_var_minus_lr_times_grad():
    seen = {}

    class Capture:
        def after_op(self, event):
            if event.direction == "optimizer":
                seen[event.name] = (event.inputs, event.outputs)

    Session(SessionConfig(steps=1, lr=0.25), hooks=[Capture()]).run()
    (var, lr, grad), (updated,) = seen["fc1/weight/ApplyGradientDescent"]
    assert lr == np.float32(0.25) and updated.dtype == np.float32
    assert np.array_equal(updated, var - np.float32(0.25) * grad)


def test_unknown_model_lists_the_valid_names():
    with pytest.raises(ConfigError) as info:
        SessionConfig(model="resnet50")
    assert str(info.value) == ("unknown model 'resnet50'; valid: mlp, mlp_regression, cnn, transformer, sensor, "
                               "or FILE.py:FACTORY")


USER_MODEL = '''
from precision_tool.engine.layers import DataSpec, Dense, Model


class Tiny(Model):
    def __init__(self, rng):
        self.data = DataSpec("features", (6,), "regression", output_dim=1)
        self.hidden = Dense(6, 8, "tanh", rng=rng)
        self.out = Dense(8, 1, rng=rng)

    def forward(self, x):
        return self.out(self.hidden(x))


def build(rng):
    return Tiny(rng)


def build_fixed():
    import numpy as np
    return Tiny(np.random.default_rng(7))


def broken(rng):
    return 42
'''


def test_a_user_model_loads_from_file_and_factory(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(USER_MODEL)
    s = session(model=f"{path}:build", steps=3)
    assert set(s.params) == {"hidden/weight", "hidden/bias", "out/weight", "out/bias"}
    assert s.task == "regression" and len(s.run().losses) == 3
    fixed = session(model=f"{path}:build_fixed", steps=1)
    assert set(fixed.params) == set(s.params)


def test_user_model_errors(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(USER_MODEL)
    with pytest.raises(InputError, match="no such file"):
        SessionConfig(model=f"{tmp_path / 'missing.py'}:build")
    with pytest.raises(InputError, match="defines no factory function 'nothing'"):
        session(model=f"{path}:nothing")
    with pytest.raises(InputError, match=r"broken\(\) returned int, not a layer-API Model"):
        session(model=f"{path}:broken")
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_here\n")
    with pytest.raises(InputError, match="failed to import: ModuleNotFoundError"):
        session(model=f"{bad}:build")


@pytest.mark.parametrize("options, message", [
    ({"steps": 0}, "steps must be a whole number >= 1, got 0"),
    ({"steps": 2.5}, "steps must be a whole number >= 1, got 2.5"),
    ({"seed": -1}, "seed must be a whole number >= 0, got -1"),
    ({"batch_size": 0}, "batch_size must be a whole number >= 1, got 0"),
    ({"optimizer": "rmsprop"}, "unknown optimizer 'rmsprop'; valid: sgd, momentum, adam"),
    ({"lr": 0}, "lr must be a positive number, got 0"),
    ({"loss_scale": "fixed:0.5"}, "loss_scale must be >= 1, got 0.5"),
    ({"loss_scale": 128}, "loss_scale must be a LossScaleManager or a spec, got int"),
    ({"device": "npu"}, "device must be a DeviceProfile"),
    ({"target_loss": -1.0}, "target_loss must be a positive number, got -1.0"),
])
def test_bad_configuration_values(options, message):
    with pytest.raises(ConfigError) as info:
        SessionConfig(**options)
    assert message in str(info.value)


def test_batch_size_and_lr_overrides():
    s = session(batch_size=8, lr=0.05)
    assert s.data.batch(0)["x"].shape == (8, 16) and s.lr == 0.05
    assert session(optimizer="adam").lr == 0.01
