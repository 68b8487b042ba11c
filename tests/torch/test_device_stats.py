"""Statistics reduced where a tensor lies (`precision_tool.torch.device_stats`), the path of CUDA tensors:
checked on CPU tensors against the host path, `dump.stats.stats_tuple`, which golden runs use."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from precision_tool.dump.stats import stats_tuple  # noqa: E402
from precision_tool.torch.device_stats import device_stats  # noqa: E402

_RNG = np.random.default_rng(7)
CASES = {
    "normal": _RNG.standard_normal(3000).astype(np.float32),
    "offset": (_RNG.standard_normal(5000) * 1e-4 + 30.0).astype(np.float32),  # the variance cancels
    "constant": np.full(100, 2.5, np.float32),
    "with nan and inf": np.array([1.0, np.nan, -2.0, np.inf, 3.0, -np.inf, 0.5] * 20, np.float32),
    "all nan": np.full(50, np.nan, np.float32),
    "saturated": np.array([65504.0, -65504.0, 1.0, 2.0] * 30, np.float32),
    "float64": _RNG.standard_normal(1000),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_device_statistics_are_the_host_statistics_up_to_the_order_of_the_sums(name, dtype):
    values = CASES[name]
    got = device_stats(torch.from_numpy(values), dtype)
    want = stats_tuple(values, dtype)
    assert got[0] == want[0] and got[6:] == want[6:]  # count, NaN, Inf and saturated counts
    for field in range(1, 6):  # min, max, mean, std, norm
        if math.isnan(want[field]):
            assert math.isnan(got[field])
        else:
            assert got[field] == pytest.approx(want[field], rel=1e-12, abs=1e-300)


def test_device_statistics_of_16_bit_integer_and_strided_tensors():
    half = torch.tensor([1.0, -3.0, 65504.0, 0.25], dtype=torch.float16)
    assert device_stats(half, "float16") == stats_tuple(half.float().numpy(), "float16")
    ints = torch.arange(10)
    assert device_stats(ints, "int64") == pytest.approx(stats_tuple(ints.numpy(), "int64"), rel=1e-15)
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert device_stats(strided, "float32") == pytest.approx(stats_tuple(strided.contiguous().numpy()), rel=1e-15)
    assert device_stats(torch.empty(0), "float32")[0] == 0
