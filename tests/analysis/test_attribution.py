"""Replay and introduced-versus-inherited attribution."""

import numpy as np
import pytest

from precision_tool.analysis import attribute
from precision_tool.analysis.replay import EXACT, NotReplayable, Numerics, replay_forward
from precision_tool.errors import ConfigError


def test_replay_on_the_targets_own_inputs_reproduces_its_output_bit_for_bit(planted_dumps):
    golden, target = planted_dumps("sensor")
    with golden, target:
        overflow_mode = target.metadata["overflow_mode"]
        for record in target.ops(step=0, direction="forward"):
            inputs = [target.tensor(0, record.exec_index, t.slot) for t in record.inputs]
            outputs, _ = replay_forward(record, inputs, Numerics.of(record, overflow_mode))
            recorded = target.tensor(0, record.exec_index, "output_0")
            np.testing.assert_array_equal(outputs[0], recorded, err_msg=record.name)


def test_golden_replay_reproduces_golden(planted_dumps):
    golden, target = planted_dumps("sensor")
    with golden, target:
        result = attribute(golden, golden, "fc1/MatMul", device="golden")
    assert result.introduced == 0.0 and result.observed == 0.0 and result.inherited == 0.0


def test_fused_layer_norm_introduces_its_error(planted_dumps):
    golden, target = planted_dumps("sensor")
    with golden, target:
        layer_norm = attribute(golden, target, "LayerNormFused")
        downstream = attribute(golden, target, "fc1/MatMulBiasAddRelu")
    assert layer_norm.introduced > 1.0 and layer_norm.inherited < 0.01
    assert layer_norm.expected < 0.01 and layer_norm.excess > 100
    # the next op inherits the damage but adds almost nothing itself
    assert downstream.inherited > 1.0 and downstream.introduced < 0.01


def test_unknown_and_ambiguous_op_names(planted_dumps):
    golden, target = planted_dumps("sensor")
    with golden, target:
        with pytest.raises(ConfigError, match="no forward op named 'nope'"):
            attribute(golden, target, "nope")
        with pytest.raises(ConfigError, match="matches 2 ops"):
            attribute(golden, target, "MatMulBiasAdd")


def test_backward_ops_are_not_replayable(planted_dumps):
    golden, target = planted_dumps("sensor")
    with golden, target:
        record = target.ops(step=0, direction="backward")[0]
    with pytest.raises(NotReplayable):
        replay_forward(record, [], EXACT)
