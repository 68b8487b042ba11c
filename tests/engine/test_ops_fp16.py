"""Ops on the simulated NPU: fp16 overflow modes, the float status, single rounding, seeded dropout, conv, cast."""

from __future__ import annotations

import numpy as np
import pytest

from precision_tool.engine import functional as F
from precision_tool.engine.device import golden, npu
from .gradcheck import OneOpRunner, OpCase, run_graph

F32 = np.float32


def fp16(overflow_mode="saturation"):
    return npu(precision_mode="force_fp16", overflow_mode=overflow_mode)


def run1(build, x, device):
    out, executor = run_graph(build, {"x": np.asarray(x, F32)}, device)
    return out, executor.status


@pytest.mark.parametrize("mode, expected", [("saturation", 65504.0), ("inf_nan", np.inf)])
def test_exp_of_12_in_fp16_overflows(mode, expected):
    out, status = run1(F.exp, [12.0, 1.0], fp16(mode))
    np.testing.assert_array_equal(out, [expected, F32(np.float16(np.e))])
    assert status.raised and status.first.name == "Exp"


@pytest.mark.parametrize("mode, expected", [("saturation", 0.0), ("inf_nan", np.nan)])
def test_sqrt_of_minus_1_in_fp16(mode, expected):
    out, status = run1(F.sqrt, [-1.0, 4.0], fp16(mode))
    np.testing.assert_array_equal(out, [expected, 2.0])
    assert status.raised and status.first.name == "Sqrt"


def test_finite_fp16_results_leave_the_status_clear():
    out, status = run1(F.exp, [11.0], fp16())
    assert out[0] == F32(np.float16(np.exp(11.0)))
    assert not status.raised


@pytest.mark.parametrize("mode, expected", [("saturation", 65504.0), ("inf_nan", np.inf)])
def test_matmul_beyond_fp16_max(mode, expected):
    a, b = np.array([[300.0, 300.0]], F32), np.array([[200.0], [200.0]], F32)
    out, executor = run_graph(F.matmul, {"a": a, "b": b}, fp16(mode))
    assert out[0, 0] == expected  # 120000 in float32, then one rounding
    assert executor.status.raised


def test_matmul_accumulates_in_float32_and_rounds_once():
    # fp16 after every add would give 1 + 2**-11 -> 1 (tie to even) twice; float32 keeps 1 + 2**-10
    a = np.array([[1.0, 2.0**-11, 2.0**-11]], F32)
    out, _ = run_graph(F.matmul, {"a": a, "b": np.ones((3, 1), F32)}, fp16())
    assert out[0, 0] == 1 + 2.0**-10


def test_fp16_elementwise_rounds_each_op():
    out, _ = run_graph(F.add, {"a": np.array([1.0], F32), "b": np.array([2.0**-11], F32)}, fp16())
    assert out[0] == 1.0  # a tie, to even
    out, _ = run_graph(F.add, {"a": np.array([1.0], F32), "b": np.array([3 * 2.0**-11], F32)}, fp16())
    assert out[0] == 1.001953125


def test_fp16_reduce_sum_accumulates_in_float32():
    # 10000 x fp16(0.1) = 999.756; sequential fp16 accumulation would stall at 256
    out, _ = run1(F.reduce_sum, np.full(10000, 0.1), fp16())
    assert out == 1000.0
    out, _ = run1(F.reduce_sum, np.ones(2049), fp16())
    assert out == 2048.0  # 2049 is not a float16


def test_softmax_stays_finite_on_large_fp16_inputs():
    out, status = run1(F.softmax, [[60000.0, 60000.0]], fp16("inf_nan"))
    np.testing.assert_array_equal(out, [[0.5, 0.5]])
    assert not status.raised


def test_movement_ops_do_not_raise_the_status_again():
    out, executor = run_graph(lambda x: F.reshape(F.exp(x), (2,)), {"x": np.array([[12.0, 1.0]], F32)},
                              fp16("inf_nan"))
    assert np.isinf(out[0])
    assert executor.status.first.name == "Exp" and executor.status.count == 1


def _dropout_out(device, step, x=None, seed=7):
    x = np.ones((64, 32), F32) if x is None else x
    out, _ = run_graph(lambda v: F.dropout(v, 0.5), {"x": x}, device, seed=seed, step=step)
    return out


def test_dropout_mask_is_the_same_on_every_device_and_scales_the_kept():
    golden_out = _dropout_out(golden(), step=3)
    for device in (golden(float64=True), fp16(), npu(precision_mode="allow_mix_precision_bf16")):
        np.testing.assert_array_equal(_dropout_out(device, step=3), golden_out)
    assert set(np.unique(golden_out)) == {0.0, 2.0}
    assert 0.4 < (golden_out == 0).mean() < 0.6


def test_dropout_mask_changes_with_step_and_seed():
    base = _dropout_out(golden(), step=0)
    assert not np.array_equal(_dropout_out(golden(), step=1), base)
    assert not np.array_equal(_dropout_out(golden(), step=0, seed=8), base)
    np.testing.assert_array_equal(_dropout_out(golden(), step=0), base)


def test_dropout_backward_uses_the_forward_mask():
    runner = OneOpRunner(OpCase("Dropout", lambda v: F.dropout(v, 0.25), [np.ones((8, 8), F32)]), golden(), seed=1)
    out = runner.forward([np.ones((8, 8), F32)], step=2)
    (grad,) = runner.backward(np.ones((8, 8), F32))
    np.testing.assert_array_equal(grad, out)  # x is all ones: y = mask / 0.75 = dy/dx
    assert set(np.unique(out)) == {0.0, F32(1 / 0.75)}


def _naive_conv(x, w, stride, padding):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho, wo = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    y = np.zeros((n, o, ho, wo))
    for b in range(n):
        for oc in range(o):
            for i in range(ho):
                for j in range(wo):
                    patch = xp[b, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
                    y[b, oc, i, j] = (patch * w[oc]).sum()
    return y


@pytest.mark.parametrize("stride, padding, kernel", [(1, 0, (3, 3)), (2, 1, (3, 3)), (2, 2, (2, 3)), (1, 0, (1, 1))])
def test_conv2d_matches_a_naive_loop(stride, padding, kernel):
    rng = np.random.default_rng(0)
    x = rng.integers(-4, 5, (2, 3, 6, 7)).astype(F32)  # small integers: every sum is exact
    w = rng.integers(-3, 4, (4, 3, *kernel)).astype(F32)
    out, _ = run_graph(lambda a, b: F.conv2d(a, b, stride, padding), {"x": x, "w": w}, golden())
    np.testing.assert_array_equal(out, _naive_conv(x, w, stride, padding))


def test_conv2d_in_fp16_rounds_the_float32_sum_once():
    x = np.array([1.0, 2.0**-11, 2.0**-11], F32).reshape(1, 3, 1, 1)
    out, _ = run_graph(F.conv2d, {"x": x, "w": np.ones((1, 3, 1, 1), F32)}, fp16())
    assert out.item() == 1 + 2.0**-10


def test_embedding_lookup():
    table = np.arange(12, dtype=F32).reshape(4, 3)
    ids = np.array([[3, 0], [1, 3]])
    out, _ = run_graph(F.gather, {"table": table, "ids": ids}, fp16())
    np.testing.assert_array_equal(out, table[ids])


def test_cast_to_float16_rounds_and_overflows():
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 2049.0, 70000.0, 2.0**-25 * 1.0001], F32)
    out, status = run1(lambda v: F.cast(v, "float16"), x, golden())
    np.testing.assert_array_equal(out, [1.0, 1.001953125, 2048.0, np.inf, 2.0**-24])
    assert status.raised
    out, _ = run1(lambda v: F.cast(v, "float16"), x, npu(overflow_mode="saturation"))
    assert out[3] == 65504.0


def test_cast_to_float16_then_float32_keeps_the_rounded_value():
    out, _ = run1(lambda v: F.cast(F.cast(v, "float16"), "float32"), [1 + 2.0**-11, 0.1], golden())
    np.testing.assert_array_equal(out, [1.0, F32(np.float16(0.1))])
