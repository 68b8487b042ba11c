import ml_dtypes
import numpy as np
import pytest

from precision_tool.engine.formats import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, get_format
from precision_tool.errors import ConfigError

EDGES = np.array(
    [0.0, -0.0, 1.0, 65504.0, -65504.0, 65519.99, 65520.0, -65520.0, 7e4, 2.0**-24, 2.0**-25,
     2.0**-25 * 1.0001, 3 * 2.0**-26, 2.0**-14, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2049.0, 2051.0,
     np.inf, -np.inf, np.nan, 3.4e38, 3.39e38, 70000.0, 1 + 2.0**-8, 257.0],
    dtype=np.float32,
)


def _numpy_f16(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float32)


def _ml_bf16(x):
    with np.errstate(invalid="ignore"):
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def test_fp16_rounding_matches_numpy_on_edges():
    y, _ = FLOAT16.round(EDGES, "inf_nan")
    np.testing.assert_array_equal(y, _numpy_f16(EDGES))


def test_bf16_rounding_matches_ml_dtypes_on_edges():
    y, _ = BFLOAT16.round(EDGES, "inf_nan")
    np.testing.assert_array_equal(y, _ml_bf16(EDGES))


@pytest.mark.parametrize("offset", [0, 3])
def test_rounding_matches_references_on_a_stride_of_all_float32_patterns(offset):
    bits = np.arange(offset, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    np.testing.assert_array_equal(FLOAT16.round(x, "inf_nan")[0], _numpy_f16(x))
    np.testing.assert_array_equal(BFLOAT16.round(x, "inf_nan")[0], _ml_bf16(x))


def test_rounding_matches_references_on_random_values():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(100_000) * np.exp(rng.uniform(-20, 12, 100_000))).astype(np.float32)
    np.testing.assert_array_equal(FLOAT16.round(x)[0], _numpy_f16(x))
    np.testing.assert_array_equal(BFLOAT16.round(x)[0], _ml_bf16(x))


def test_exact_fp16_values():
    cases = {1 + 2.0**-11: 1.0, 1 + 3 * 2.0**-11: 1.001953125, 2049.0: 2048.0, 2051.0: 2052.0,
             2.0**-25: 0.0, 3 * 2.0**-26: 2.0**-24, 65519.99: 65504.0}
    for value, expected in cases.items():
        assert FLOAT16.round(np.float32(value))[0] == np.float32(expected)


def test_saturation_clips_inf_and_zeroes_nan():
    x = np.array([7e4, -1e10, np.inf, np.nan, 65519, 65520, -np.inf], dtype=np.float32)
    y, overflow = FLOAT16.round(x, "saturation")
    np.testing.assert_array_equal(y, [65504, -65504, 65504, 0, 65504, 65504, -65504])
    assert overflow


def test_inf_nan_mode_is_ieee():
    x = np.array([7e4, -1e10, np.inf, np.nan, 65519, 65520], dtype=np.float32)
    y, overflow = FLOAT16.round(x, "inf_nan")
    np.testing.assert_array_equal(y, [np.inf, -np.inf, np.inf, np.nan, 65504, np.inf])
    assert overflow


def test_largest_value_below_the_rounding_midpoint_does_not_overflow():
    _, overflow = FLOAT16.round(np.array([65519.99, -65519.99], dtype=np.float32), "saturation")
    assert not overflow


def test_bf16_saturation_limit():
    y, overflow = BFLOAT16.round(np.array([3.4e38, -np.inf, 70000.0], dtype=np.float32), "saturation")
    np.testing.assert_array_equal(y, np.array([BFLOAT16.max, -BFLOAT16.max, 70144.0], dtype=np.float32))
    assert BFLOAT16.max == pytest.approx(3.3895313892515355e38)
    assert overflow


def test_float32_flags_non_finite_and_saturates():
    y, overflow = FLOAT32.round(np.array([1.0, np.inf, np.nan], dtype=np.float32), "saturation")
    np.testing.assert_array_equal(y, np.array([1.0, FLOAT32.max, 0.0], dtype=np.float32))
    assert overflow
    assert FLOAT32.round(np.array([1.0, 2.0], dtype=np.float32))[1] is False


def test_zero_dim_and_empty_keep_their_shape():
    assert FLOAT16.round(np.float32(1.5))[0].shape == ()
    assert FLOAT16.round(np.zeros((0, 3), np.float32))[0].shape == (0, 3)


def test_float64_keeps_its_container():
    y, _ = FLOAT64.round(np.array([1 + 2.0**-40]))
    assert y.dtype == np.float64 and y[0] == 1 + 2.0**-40


def test_limits():
    assert FLOAT16.max == 65504.0
    assert FLOAT16.tiny == 2.0**-14
    assert FLOAT16.smallest_subnormal == 2.0**-24
    assert FLOAT16.eps == 2.0**-10
    assert BFLOAT16.eps == 2.0**-7


def test_aliases_and_unknown_names():
    assert get_format("fp16") is FLOAT16
    assert get_format("bf16") is BFLOAT16
    with pytest.raises(ConfigError, match="valid: float16, bfloat16, float32, float64"):
        get_format("fp8")
