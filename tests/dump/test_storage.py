import ml_dtypes
import numpy as np
import pytest

from precision_tool.dump.storage import container_dtype, from_storage, to_storage


def _float16_values(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * 300).astype(np.float16).astype(np.float32)
    x[::7] = 0.0
    x[1:9] = [-0.0, 2.0**-24, -(2.0**-20), np.inf, -np.inf, np.nan, 65504.0, -65504.0]
    return x


@pytest.mark.parametrize("n", [9, 20000, 1 << 18])  # below and above the fast-path threshold
def test_float16_round_trip_is_bit_exact(n):
    x = _float16_values(n)
    stored = to_storage(x, "float16")
    assert stored.dtype == np.float16
    assert np.array_equal(stored.view(np.uint16), x.astype(np.float16).view(np.uint16))
    back = from_storage(stored, "float16")
    assert back.dtype == np.float32
    assert np.array_equal(back, x, equal_nan=True)
    assert np.array_equal(np.signbit(back), np.signbit(x))


@pytest.mark.parametrize("n", [9, 20000])
def test_bfloat16_stored_as_its_bits(n):
    x = _float16_values(n).astype(ml_dtypes.bfloat16).astype(np.float32)
    stored = to_storage(x, "bfloat16")
    assert stored.dtype == np.uint16
    assert np.array_equal(stored, x.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(from_storage(stored, "bfloat16"), x, equal_nan=True)


def test_bfloat16_nan_with_low_payload_stays_nan():
    x = np.array([np.uint32(0x7F800001).view(np.float32)], np.float32)
    assert np.isnan(from_storage(to_storage(x, "bfloat16"), "bfloat16")[0])


def test_shapes_scalars_and_other_dtypes():
    scalar = np.float32(1.5).reshape(())
    for dtype in ("float16", "bfloat16", "float32"):
        stored = to_storage(scalar, dtype)
        assert stored.shape == ()
        assert from_storage(stored, dtype) == 1.5
    transposed = np.arange(6, dtype=np.float32).reshape(2, 3).T
    assert to_storage(transposed, "float32").flags.c_contiguous
    ints = np.arange(4, dtype=np.int32)
    assert to_storage(ints, "int32").dtype == np.int32
    assert to_storage(np.ones(3), "float64").dtype == np.float64
    assert container_dtype("float16") == np.float32 and container_dtype("float64") == np.float64
