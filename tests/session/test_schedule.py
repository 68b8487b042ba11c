"""Rec SDK's schedule: max_steps, train_steps, eval_steps, save_steps; their ranges, rules and effects."""

import numpy as np
import pytest

from precision_tool.engine.device import golden, npu
from precision_tool.errors import ConfigError
from precision_tool.session import Session, SessionConfig
from precision_tool.session.data import EVAL_SET_BATCHES, SyntheticData


@pytest.mark.parametrize("kwargs, message", [
    ({"max_steps": -2}, "max_steps must be a whole number >= -1, got -2"),
    ({"train_steps": 2147483648}, "train_steps must be at most 2147483647, got 2147483648"),
    ({"eval_steps": 1.5}, "eval_steps must be a whole number >= -1, got 1.5"),
    ({"save_steps": True}, "save_steps must be a whole number >= -1, got True"),
    ({"max_steps": 0, "train_steps": 0, "eval_steps": 0}, "max_steps, train_steps and eval_steps cannot all be 0"),
    ({"max_steps": 0}, "max_steps 0 trains nothing"),
    ({"steps": 4, "train_steps": 5}, "train_steps 5 is more than the run's 4 steps: evaluation would never happen"),
    ({"max_steps": 4, "save_steps": 6, "checkpoint_dir": "c"}, "save_steps 6 is more than the run's 4 steps"),
    ({"save_steps": 2}, "save_steps 2 needs checkpoint_dir"),
    ({"if_load": True}, "if_load needs checkpoint_dir"),
    ({"checkpoint_dir": "c", "restore_model_version": 3}, "restore_model_version needs if_load"),
    ({"checkpoint_dir": "c", "if_load": True, "restore_model_version": -1},
     "restore_model_version must be a whole number >= 0, got -1"),
    ({"checkpoint_dir": ""}, "checkpoint_dir must not be empty"),
])
def test_a_schedule_out_of_range_or_inconsistent_is_a_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SessionConfig(model="mlp", **kwargs)


def test_the_seed_ranges_bounds_are_accepted_and_max_steps_sets_the_run_length():
    config = SessionConfig(model="mlp", steps=20, max_steps=7, train_steps=2147483647 // 2147483647 * 7,
                           eval_steps=2147483647, save_steps=0)
    assert config.steps == 7 and config.max_steps == 7
    assert SessionConfig(model="mlp", steps=20).steps == 20  # max_steps -1: the configured steps
    assert SessionConfig(model="mlp", max_steps=3, train_steps=0, eval_steps=0).steps == 3


def _evaluated_steps(**kwargs) -> list[int]:
    summary = Session(SessionConfig(model="mlp", device=golden(), **kwargs)).run()
    return [e["step"] for e in summary.evaluations]


def test_evaluation_runs_every_train_steps_after_the_last_step_by_default_and_never_with_zero():
    assert _evaluated_steps(steps=7, train_steps=3) == [2, 5]
    assert _evaluated_steps(steps=7) == [6]
    assert _evaluated_steps(steps=7, train_steps=0) == []
    assert _evaluated_steps(steps=7, eval_steps=0) == []
    assert _evaluated_steps(steps=6, train_steps=2) == [1, 3, 5]


def test_an_evaluation_scores_the_current_weights_on_held_out_batches():
    session = Session(SessionConfig(model="mlp", steps=2, device=golden(), eval_steps=3))
    session.run()
    (evaluation,) = session.evaluations
    assert evaluation["batches"] == 3 and evaluation["metric"] == "accuracy" and evaluation["step"] == 1
    # the same forward, by hand: argmax of the logits against the labels of held-out batches 0..2
    hits, losses = 0, []
    data = SyntheticData(session.model.data, 0, session.batch_size)
    for index in range(3):
        batch = data.eval_batch(index)
        session.executor.begin_step(99)
        out = session.executor.forward(batch, session.params)
        hits += int(np.sum(np.argmax(out["logits"], axis=1) == batch["labels"]))
        losses.append(float(out["loss"]))
    assert evaluation["value"] == hits / (3 * session.batch_size)
    assert evaluation["loss"] == float(np.mean(losses))
    training = {data.batch(s)["x"].tobytes() for s in range(50)}
    assert not any(data.eval_batch(i)["x"].tobytes() in training for i in range(EVAL_SET_BATCHES))


def test_regression_is_scored_by_mean_squared_error_over_the_whole_held_out_set():
    session = Session(SessionConfig(model="mlp_regression", steps=1, device=golden()))
    (evaluation,) = session.run().evaluations
    assert evaluation["metric"] == "mse" and evaluation["batches"] == EVAL_SET_BATCHES
    assert 0 < evaluation["value"] < 10


def test_evaluation_leaves_the_training_record_alone():
    events = []

    class Listener:
        def after_op(self, event):
            events.append(event.step)

    plain = Session(SessionConfig(model="mlp", steps=3, device=npu(), train_steps=0, eval_steps=0)).run()
    evaluated_session = Session(SessionConfig(model="mlp", steps=3, device=npu(), train_steps=1), [Listener()])
    evaluated = evaluated_session.run()
    assert evaluated.losses == plain.losses and len(evaluated.evaluations) == 3
    assert set(events) == {0, 1, 2}


def test_a_golden_and_an_fp16_run_report_their_held_out_accuracy():
    config = {"model": "mlp", "steps": 10}
    g = Session(SessionConfig(device=golden(), **config)).run().evaluations[-1]
    t = Session(SessionConfig(device=npu(precision_mode="force_fp16"), **config)).run().evaluations[-1]
    assert g["metric"] == t["metric"] == "accuracy" and g["step"] == t["step"] == 9
    assert (g["value"] * 256, t["value"] * 256) == (180, 179)  # of 8 held-out batches of 32
