"""`simulate_npu`'s fast paths give what its general ones give: remembered plans, outputs rounded in C, dropped
parameter copies."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

import precision_tool.torch as ptt  # noqa: E402
from precision_tool.engine.formats import BFLOAT16, FLOAT16  # noqa: E402
from precision_tool.torch.tensors import logical_dtype  # noqa: E402

_FINE = 1.0 + 2.0**-11 + 2.0**-20  # rounds to 1 + 2**-10 in float16, to 1 in bfloat16


_GRAY_OPS = [  # gray-list ops (they follow their inputs' formats) on every mix of float32 x and float16 h
    lambda x, h: x + x, lambda x, h: h + x, lambda x, h: x + h, lambda x, h: h + h, lambda x, h: torch.relu(x),
    lambda x, h: torch.relu(h), lambda x, h: torch.cat([h]), lambda x, h: torch.cat([x, h]),
    lambda x, h: torch.cat([x, x]), lambda x, h: torch.cat([h, h]), lambda x, h: x + x]


def test_a_remembered_plan_is_the_decision_a_fresh_simulator_makes():
    """The plan an op gets is remembered by its op and its inputs' formats: ops of one type on inputs in other
    formats (or other counts of them) each get their own, as each would alone."""
    x = torch.full((2, 2), _FINE)
    w = torch.eye(2)
    with ptt.simulate_npu("allow_mix_precision"):
        h = x @ w  # white: float16
        together = [op(x, h) for op in _GRAY_OPS]
    alone = []
    for op in _GRAY_OPS:
        with ptt.simulate_npu("allow_mix_precision"):
            alone.append(op(x, x @ w))
    assert [logical_dtype(t) for t in together] == [logical_dtype(t) for t in alone]
    assert [logical_dtype(t) for t in together[:4]] == ["float32", "float16", "float16", "float16"]
    for mine, theirs in zip(together, alone):
        assert mine.numpy().tobytes() == theirs.numpy().tobytes()


def test_each_simulator_remembers_its_own_plans():
    x = torch.full((2,), _FINE)
    with ptt.simulate_npu("force_fp16"):
        a = x * 1.0
    with ptt.simulate_npu("allow_mix_precision_bf16"):
        b = torch.full((1, 1), _FINE) @ torch.ones(1, 1)
    with ptt.simulate_npu("allow_mix_precision"):
        c = x * 1.0  # gray on a float32 input: stays float32
    assert (float(a[0]), logical_dtype(a)) == (1.0 + 2.0**-10, "float16")
    assert (float(b), logical_dtype(b)) == (1.0, "bfloat16")
    assert (float(c[0]), logical_dtype(c)) == (_FINE, "float32")


@pytest.mark.parametrize("fmt, mode", [(FLOAT16, "force_fp16"), (BFLOAT16, "allow_mix_precision_bf16")])
def test_outputs_in_every_layout_are_rounded_as_format_round_rounds_them(fmt, mode):
    """A contiguous output, a gate chunk of a wider matrix written in place (its rows, not the gaps between them)
    and a transposed output: each rounded to the bit as `Format.round`, the rest of the matrix untouched."""
    raw = torch.randn(4, 12, generator=torch.Generator().manual_seed(0)) * 3
    with ptt.simulate_npu(mode):
        gates = raw @ torch.eye(12)  # white: in ``fmt``, exactly ``raw`` rounded
        before = gates.clone()
        contiguous = gates * 1.5
        chunk = gates[:, 4:8]  # rows of 4 values, 12 apart
        chunk.mul_(1.5)  # writes the rounded product where it lies
        transposed = gates.t() * 3.0  # laid out as its input: a transpose of dense memory
    rounded, _ = fmt.round(raw.numpy(), "saturation")
    np.testing.assert_array_equal(before.numpy(), rounded)
    np.testing.assert_array_equal(contiguous.numpy(), fmt.round(rounded * np.float32(1.5), "saturation")[0])
    np.testing.assert_array_equal(chunk.numpy(), fmt.round(rounded[:, 4:8] * np.float32(1.5), "saturation")[0])
    untouched = np.ones(12, dtype=bool)
    untouched[4:8] = False
    np.testing.assert_array_equal(gates.numpy()[:, untouched], rounded[:, untouched])
    np.testing.assert_array_equal(transposed.numpy(), fmt.round(gates.numpy().T * np.float32(3.0), "saturation")[0])
    assert not transposed.is_contiguous() and not chunk.is_contiguous()
    assert {logical_dtype(t) for t in (chunk, contiguous, transposed)} == {fmt.name}


@pytest.mark.parametrize("overflow_mode, expected", [("saturation", 65504.0), ("inf_nan", float("inf"))])
def test_an_output_out_of_range_takes_the_overflow_mode_in_every_layout(overflow_mode, expected):
    with ptt.simulate_npu("force_fp16", overflow_mode) as sim:
        gates = torch.ones(3, 8) * 1.0
        chunk = gates[:, 2:4]
        contiguous = torch.ones(3, 2) * 1e5
        chunk.mul_(1e5)
    assert contiguous.unique().tolist() == [expected] and chunk.unique().tolist() == [expected]
    assert gates[:, :2].unique().tolist() == [1.0] and sim.status.count == 2


def test_a_write_through_an_offset_alias_of_data_drops_the_parameters_rounded_copies():
    """A write through ``w.data[1:]`` (a view of ``.data``, past the storage's start, with a version counter of
    its own) reaches the storage of the copies rounded from ``w``: the next op rounds the new values."""
    x = torch.tensor([[1.0, 1.0]])
    w = torch.nn.Parameter(torch.full((2, 2), _FINE))
    with ptt.simulate_npu("force_fp16") as sim:
        assert (x @ w.t()).tolist() == [[2.0 + 2.0**-9] * 2]
        assert len(sim._parameters._entries) == 1
        version = w._version
        w.data[1:].mul_(3)
        assert w._version == version and not sim._parameters._entries
        assert (x @ w.t()).tolist() == [[2.0 + 2.0**-9, 6.0 + 2.0**-7]]
        w.data[:1].copy_(torch.ones(1, 2))  # a write that never reads its destination drops them too
        assert (x @ w.t()).tolist() == [[2.0, 6.0 + 2.0**-7]]


def test_a_write_elsewhere_keeps_the_parameters_rounded_copies():
    x = torch.tensor([[1.0, 1.0]])
    w = torch.nn.Parameter(torch.full((2, 2), _FINE))
    with ptt.simulate_npu("force_fp16") as sim:
        y = x @ w.t()
        y.mul_(2)  # an activation: not the weight's storage
        torch.zeros(0).add_(1)  # an empty tensor writes nothing
        assert len(sim._parameters._entries) == 1
        assert (x @ w.t()).tolist() == [[2.0 + 2.0**-9] * 2]


def test_an_optimizer_step_and_a_data_assignment_give_the_next_op_the_new_weights():
    x = torch.tensor([[1.0, 1.0]])
    w = torch.nn.Parameter(torch.full((2, 2), _FINE))
    optimizer = torch.optim.SGD([w], lr=1.0)
    with ptt.simulate_npu("force_fp16"):
        (x @ w.t()).sum().backward()
        optimizer.step()  # w - 1 (the gradient is 1 everywhere)
        after_step = (x @ w.t()).tolist()
        w.data = torch.full((2, 2), 3.0)  # a new storage
        after_assignment = (x @ w.t()).tolist()
    fine_minus_one, _ = FLOAT16.round(np.float32(_FINE) - np.float32(1.0))
    assert after_step == [[float(FLOAT16.round(2 * fine_minus_one)[0])] * 2]
    assert after_assignment == [[6.0, 6.0]]
