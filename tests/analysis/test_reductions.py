"""`reductions.amplification`: how far a backward group's reduced gradient may carry its input's error."""

from __future__ import annotations

import math

from precision_tool.analysis.reductions import amplification, incoming_size
from precision_tool.analysis.structure import Rewritten
from precision_tool.dump.records import OpRecord, TensorRecord, TensorStats


def _tensor(slot: str, count: int, norm: float, low: float = -1.0) -> TensorRecord:
    return TensorRecord(slot, "float32", (count,), TensorStats(count, low, 1.0, 0.0, 0.0, norm), has_data=False)


def _record(index: int, type_: str, *tensors: TensorRecord) -> OpRecord:
    return OpRecord(0, index, f"fc/aten.addmm_0/{type_}_0", type_, "backward", "float32", False, tensors)


def _linear_backward():
    """g (130 x 128, norm 0.25) against x (130 x 64, norm 90): mm for x's gradient, mm for the weight's, sum for
    the bias's."""
    g = _tensor("input_0", 130 * 128, 0.25)
    members = [_record(0, "aten.mm", g, _tensor("input_1", 128 * 64, 1.8, -2.0), _tensor("output_0", 130 * 64, 0.04)),
               _record(1, "aten.mm", _tensor("input_0", 130 * 128, 0.25), _tensor("input_1", 130 * 64, 90.0, -3.0),
                       _tensor("output_0", 128 * 64, 2.0)),
               _record(2, "aten.sum", _tensor("input_0", 130 * 128, 0.25), _tensor("output_0", 128, 0.3))]
    rewrite = Rewritten("fc", "backward", ("mm", "mm", "sum"), ("mm", "mm", "mul", "sum"), members[-1],
                        members[-1], target_first=members[0], golden_first=members[0], target_slot="input_0")
    return rewrite, members


def test_a_weight_gradient_may_carry_its_inputs_error_times_their_norms_over_its_own():
    rewrite, members = _linear_backward()
    assert incoming_size(rewrite) == 130 * 128
    weight = members[1].tensor("output_0")
    assert math.isclose(amplification(rewrite, members, weight, 2.0), 0.25 * 90.0 / 2.0)


def test_a_bias_gradient_may_carry_it_times_the_root_of_the_rows_summed():
    rewrite, members = _linear_backward()
    bias = members[2].tensor("output_0")
    # (the largest norm read from outside, 90, bounds it too: the bound takes the larger)
    assert math.isclose(amplification(rewrite, members, bias, 0.3), 0.25 * 90.0 / 0.3)
    assert math.isclose(amplification(rewrite, members[2:], bias, 0.3), 0.25 * math.sqrt(130.0) / 0.3)


def test_a_result_that_is_rounding_noise_may_carry_any_error():
    rewrite, members = _linear_backward()
    bias = members[2].tensor("output_0")
    assert amplification(rewrite, members, bias, 3e-13) > 1e10  # (a key projection's bias gradient)
    assert amplification(rewrite, members, bias, 0.0) == math.inf
