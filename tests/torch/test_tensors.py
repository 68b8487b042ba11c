"""Tensor helpers: statistics, memory order, rounding into formats."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

from precision_tool.dump.stats import stats_tuple  # noqa: E402
from precision_tool.engine.formats import FLOAT16  # noqa: E402
from precision_tool.torch.tensors import (TensorStatsCache, all_finite, array_stats, memory_order,  # noqa: E402
                                          round_in_place, round_to, stats_of)


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).standard_normal(10_000) * 3 + 1,
    np.full(5000, 65504.0),  # saturated, zero variance
    np.r_[np.random.default_rng(1).standard_normal(5000), np.inf, np.nan],
    np.full(8192, 3e30),  # squares beyond float32
    np.arange(7, dtype=np.float64),  # small: the shared helper
])
def test_fast_statistics_agree_with_the_shared_helper(values):
    array = values.astype(np.float32)
    fast, shared = array_stats(array, "float16"), stats_tuple(array, "float16")
    for a, b in zip(fast, shared):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-9)


def test_statistics_ignore_the_order_of_values_and_reuse_transposes():
    x = torch.randn(64, 80)
    cache = TensorStatsCache()
    assert memory_order(x.t()).is_contiguous() and memory_order(x.t()).data_ptr() == x.data_ptr()
    first = cache.get(x, "float32")
    assert cache.get(x.t(), "float32") is first
    assert stats_of(x.t().contiguous(), "float32")[1:3] == first[1:3]
    x.mul_(2)  # a new version: new statistics
    assert cache.get(x, "float32")[2] == pytest.approx(2 * first[2])


def test_rounding_into_float16_saturates_and_reports_overflow():
    x = torch.tensor([70000.0, 1.0 + 2.0**-12, float("nan")])
    rounded, overflow = round_to(x, FLOAT16, "saturation")
    assert overflow and rounded.tolist() == [65504.0, 1.0, 0.0] and x[0] == 70000.0
    y = x.clone()
    assert round_in_place(y, FLOAT16, "inf_nan") and math.isinf(y[0]) and math.isnan(y[2])
    assert not all_finite(x) and all_finite(torch.ones(3)) and all_finite(torch.arange(3))
