"""`grid`: which narrower format a float32 tensor's values were computed in."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from precision_tool.analysis.grid import narrower_grid, on_grid


def _values(n: int = 256) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(n).astype(np.float32)


def test_values_cast_through_float16_lie_on_its_grid_only():
    golden = _values()
    target = golden.astype(np.float16).astype(np.float32)
    assert on_grid(target, "float16") == 1.0
    assert on_grid(golden, "float16") == 0.0  # 256 normal draws, none with 13 zero low bits
    assert narrower_grid(target, golden) == "float16"


def test_values_cast_through_bfloat16_are_named_bfloat16_the_coarser_grid():
    golden = _values()
    target = golden.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert narrower_grid(target, golden) == "bfloat16"


def test_no_grid_is_named_for_float32_values_few_values_or_a_golden_on_the_grid_too():
    golden = _values()
    assert narrower_grid(golden * 1.5, golden) is None
    few = golden[:63].astype(np.float16).astype(np.float32)  # 63 values: under the 64 that prove anything
    assert on_grid(few, "float16") is None and narrower_grid(few, golden[1:64]) is None  # (not golden's, rounded)
    integers = np.arange(1, 300, dtype=np.float32)  # small integers lie on every grid, in both runs
    assert narrower_grid(integers, integers) is None
    assert on_grid(golden.astype(np.float64), "float16") is None


def test_zeros_and_non_finite_values_are_left_out_of_the_share():
    target = _values().astype(np.float16).astype(np.float32)
    target[:100] = 0.0
    target[100] = np.inf
    target[101] = np.nan
    assert on_grid(target, "float16") == 1.0
    assert on_grid(np.float32([70000.0] * 64 + [1.0 + 2.0 ** -20]), "float16") == 0.0  # beyond float16's range


def test_extremes_on_a_narrower_grid_tell_the_format_from_statistics():
    from precision_tool.analysis.grid import extremes_grid
    from precision_tool.dump.records import TensorStats

    def stats(low, high):
        return TensorStats(256, low, high, 0.0, 1.0, 16.0)

    golden = stats(float(np.float32(-2.7182817)), float(np.float32(3.1415927)))
    assert extremes_grid(stats(-2.720703125, 3.14453125), golden) == "float16"  # held by float16, not bfloat16
    assert extremes_grid(stats(-2.71875, 3.140625), stats(-2.71875, 3.140625)) is None  # golden's are too
    assert extremes_grid(stats(-2.703125, 3.140625), golden) == "bfloat16"
    assert extremes_grid(stats(0.0, 3.140625), golden) is None  # a ReLU's 0 lies on every grid
    assert extremes_grid(stats(-2.7182817, 3.140625), golden) is None  # one of float32's own


def test_few_values_count_where_every_one_is_goldens_rounded():
    golden = np.float32([1.0, 0.1, 0.01, 0.001])  # a rotary embedding's inverse frequencies
    assert narrower_grid(golden.astype(ml_dtypes.bfloat16).astype(np.float32), golden) == "bfloat16"
    assert narrower_grid(golden.astype(np.float16).astype(np.float32), golden) == "float16"
    assert narrower_grid(golden, golden) is None  # (the same values: nothing was rounded)
    one_off = golden.astype(np.float16).astype(np.float32)
    one_off[1] = np.nextafter(one_off[1], np.float32(1))  # one value not golden's rounded
    assert narrower_grid(one_off, golden) is None
    assert narrower_grid(np.float32([1.0, 2.0, 4.0]), np.float32([1.0, 2.0, 4.0])) is None
