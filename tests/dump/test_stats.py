import math
import weakref

import numpy as np
import pytest

from precision_tool.dump import stats
from precision_tool.dump.stats import StatsBatch, StatsCache, stats_tuple, tensor_stats


@pytest.fixture(params=["c", "numpy"] if stats._native is not None else ["numpy"], autouse=True)
def kernel(request, monkeypatch):
    """Every test here runs with the C statistics (where they are built) and with numpy's."""
    if request.param == "numpy":
        monkeypatch.setattr(stats, "_native", None)
    return request.param


def test_exact_values():
    s = tensor_stats(np.array([1.0, -2.0, 3.0, 4.0], np.float32), "float32")
    assert (s.count, s.min, s.max, s.mean) == (4, -2.0, 4.0, 1.5)
    assert s.std == pytest.approx(math.sqrt((0.25 + 12.25 + 2.25 + 6.25) / 4), rel=1e-15)
    assert s.norm == pytest.approx(math.sqrt(30.0), rel=1e-15)
    assert (s.nan, s.inf, s.saturated) == (0, 0, 0)
    assert s.finite


def test_nan_inf_are_counted_and_left_out_of_the_rest():
    s = tensor_stats(np.array([1.0, np.nan, np.inf, -np.inf, 3.0], np.float32), "float32")
    assert (s.count, s.nan, s.inf) == (5, 1, 2)
    assert (s.min, s.max, s.mean) == (1.0, 3.0, 2.0)
    assert s.norm == pytest.approx(math.sqrt(10.0))
    assert not s.finite


def test_all_nonfinite_gives_nan_statistics():
    s = tensor_stats(np.array([np.nan, np.inf], np.float32), "float16")
    assert (s.count, s.nan, s.inf, s.norm) == (2, 1, 1, 0.0)
    assert math.isnan(s.min) and math.isnan(s.mean)


def test_float16_saturation_limit_is_counted():
    s = tensor_stats(np.array([65504.0, -65504.0, 1.0, 65500.0], np.float32), "float16")
    assert s.saturated == 2
    assert tensor_stats(np.array([65504.0], np.float32), "float32").saturated == 0


def test_bfloat16_saturation_limit():
    bf16_max = float(np.uint32(0x7F7F0000).view(np.float32))
    assert tensor_stats(np.array([bf16_max, 2.0], np.float32), "bfloat16").saturated == 1


def test_empty_and_scalar_and_int():
    empty = tensor_stats(np.zeros((0, 3), np.float32), "float32")
    assert empty.count == 0 and empty.norm == 0.0 and math.isnan(empty.mean)
    assert tensor_stats(np.float32(2.5), "float32").mean == 2.5
    ints = tensor_stats(np.arange(5, dtype=np.int64), "int64")
    assert (ints.min, ints.max, ints.mean, ints.saturated) == (0.0, 4.0, 2.0, 0)


def test_zero_vector():
    s = tensor_stats(np.zeros(10, np.float32), "float32")
    assert (s.min, s.max, s.mean, s.std, s.norm) == (0.0, 0.0, 0.0, 0.0, 0.0)


def test_std_survives_a_large_mean():
    rng = np.random.default_rng(1)
    x = (np.float32(1000.0) + rng.standard_normal(10000).astype(np.float32) * np.float32(0.01))
    assert tensor_stats(x, "float32").std == pytest.approx(x.astype(np.float64).std(), rel=1e-6)


def test_huge_values_square_in_float64():
    s = tensor_stats(np.array([3e20, 4e20], np.float32), "float32")
    assert s.norm == pytest.approx(5e20, rel=1e-6)


@pytest.mark.parametrize("values, expected", [
    ([1e308, 1e308], (2, 1e308, 1e308, 1e308, 0.0, math.sqrt(2.0) * 1e308)),  # the sum overflows (was a recursion)
    ([1e200, -1e200], (2, -1e200, 1e200, 0.0, 1e200, math.sqrt(2.0) * 1e200)),  # squares do (was OverflowError)
    ([1e308] * 300, (300, 1e308, 1e308, 1e308, 0.0, math.inf)),  # the norm itself is beyond float64
])
def test_finite_float64_values_whose_sums_overflow_have_their_statistics(values, expected):
    count, low, high, mean, std, norm, nan, inf, saturated = stats_tuple(np.array(values))
    assert (count, low, high, nan, inf, saturated) == (*expected[:3], 0, 0, 0)
    assert mean == pytest.approx(expected[3], rel=1e-15) and norm == pytest.approx(expected[5], rel=1e-15)
    assert std == pytest.approx(expected[4], rel=1e-15, abs=1e-15 * abs(expected[3]))
    assert stats_tuple(np.array(values + [math.inf]))[1:8] == (low, high, mean, std, norm, 0, 1)


def test_float64_accumulation_matches_exact_sum():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(1 << 16).astype(np.float32) + np.float32(3)
    s = tensor_stats(x, "float32")
    exact = x.astype(np.float64)
    assert s.mean == pytest.approx(exact.mean(), rel=1e-12)
    assert s.norm == pytest.approx(math.sqrt((exact * exact).sum()), rel=1e-7)


def test_cache_reuses_by_identity_only():
    cache = StatsCache()
    a = np.ones(4, np.float32)
    first = cache.get(a, "float32")
    assert cache.get(a, "float32") is first
    b = np.full(4, 2.0, np.float32)
    assert cache.get(b, "float32")[3] == 2.0
    del a
    c = np.full(4, 3.0, np.float32)  # may reuse a's id: must not reuse a's stats
    assert cache.get(c, "float32")[3] == 3.0
    assert stats_tuple(c, "float32") == cache.get(c, "float32")


def _batch_cases():
    rng = np.random.default_rng(5)
    big = rng.standard_normal(300_000).astype(np.float32)  # more than one batch buffer: the per-array path
    return [
        np.zeros((0, 3), np.float32),
        np.float32(2.5),
        np.array([1.0, -2.0, 3.0, 4.0], np.float32),
        np.arange(5, dtype=np.int64),
        np.array([1.0, np.nan, np.inf, -np.inf, 3.0], np.float32),
        np.array([np.nan, np.inf], np.float32),
        np.full(1000, 1.5, np.float32),
        np.zeros(10, np.float32),
        np.float32(1000.0) + rng.standard_normal(10000).astype(np.float32) * np.float32(0.01),
        np.array([3e20, 4e20], np.float32),
        rng.standard_normal((64, 48)).astype(np.float32).T,  # a transpose: not C-contiguous
        rng.standard_normal((40, 40))[::2, ::3],  # float64, strided
        rng.standard_normal(100_000).astype(np.float32) + np.float32(3),
        big,
        rng.standard_normal(200_000).astype(np.float32),  # with the one before: several buffers' worth
        np.array([65504.0, -65504.0, 1.0], np.float32),
    ]


def test_batch_matches_stats_tuple():
    cases = _batch_cases()
    for dtype in ("float32", "float16"):
        rows = StatsBatch().compute(cases, [dtype] * len(cases))
        for array, row in zip(cases, rows):
            expected = stats_tuple(array, dtype)
            assert row[0] == expected[0] and row[6:] == expected[6:]
            assert row[1:6] == pytest.approx(expected[1:6], rel=1e-12, nan_ok=True)


def test_batch_of_a_constant_array_is_exact():
    count, low, high, mean, std, norm, *_ = StatsBatch().compute([np.full(7, 0.1, np.float32)], ["float32"])[0]
    assert (count, low, high, mean, std) == (7, float(np.float32(0.1)), float(np.float32(0.1)),
                                            float(np.float32(0.1)), 0.0)


def test_batch_sums_in_float64_across_buffer_refills():
    batch = StatsBatch()
    rng = np.random.default_rng(2)
    x = rng.standard_normal(1 << 16).astype(np.float32) + np.float32(3)
    positions = [batch.add(np.ones(10, np.float32)), *(batch.add(x) for _ in range(6))]  # 6 x 64 Ki: a refill
    rows = batch.flush()
    assert rows[positions[0]][3] == 1.0
    exact = x.astype(np.float64)
    for position in positions[1:]:
        assert rows[position][3] == pytest.approx(exact.mean(), rel=1e-12)
        assert rows[position][5] == pytest.approx(math.sqrt((exact * exact).sum()), rel=1e-12)


def test_batch_lets_go_of_the_arrays_once_computed():
    batch = StatsBatch()
    x = np.full(100, 2.0, np.float32)
    alive = weakref.ref(x)
    position = batch.add(x)
    del x
    assert alive() is not None and batch.rows[position] is None  # queued: kept until computed
    assert batch.flush()[position][3] == 2.0 and alive() is None


def test_batch_counts_saturated_finite_values_per_format():
    x = np.array([65504.0, -65504.0, 1.0, np.inf], np.float32)
    batch = StatsBatch()
    position = batch.add(x)
    batch.flush()
    assert batch.rows[position][8] == 0 and batch.rows[position][7] == 1
    assert batch.row(position, "float16")[8] == 2
    assert batch.row(position, "float32") is batch.rows[position]
    assert batch.row(position, "int64") is batch.rows[position]


@pytest.mark.skipif(stats._native is None, reason="the C statistics are not in use (not built, or "
                                                   "PRECISION_TOOL_KERNEL=numpy)")
@pytest.mark.parametrize("kernel", ["c"], indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_c_and_numpy_statistics_agree(dtype, monkeypatch):
    rng = np.random.default_rng(3)
    arrays = [(rng.standard_normal(n) * 5 + 2).astype(dtype) for n in (41, 1000, 70_000, 300_000)]
    arrays.append(np.full(500, 7.25, dtype))  # constant: mean exact, std 0
    arrays.append(np.linspace(1e4, 1e4 + 1e-3, 1000).astype(dtype))  # variance lost to cancellation: redone
    arrays.append(np.array([1.0, np.inf] * 30, dtype))  # non-finite: redone
    fast = StatsBatch().compute(arrays, ["float16"] * len(arrays))
    monkeypatch.setattr(stats, "_native", None)
    slow = StatsBatch().compute(arrays, ["float16"] * len(arrays))
    for array, f, s in zip(arrays, fast, slow):
        assert f[0] == s[0] and f[1:3] == s[1:3] and f[6:] == s[6:]  # counts and extremes exactly
        finite = array[np.isfinite(array)].astype(np.float64)
        exact = (finite.mean(), finite.std(), math.sqrt(math.fsum(finite * finite)))
        assert f[3:6] == pytest.approx(exact, rel=1e-12, abs=1e-300)
        # numpy squares arrays of more than 256 Ki values in their own precision (documented: below 1e-7)
        assert s[3:6] == pytest.approx(exact, rel=1e-12 if array.size <= 1 << 18 else 1e-7, abs=1e-300)
