"""Converting tensors between their compute containers and their on-disk dtypes.

Tensors are float32 containers (float64 on a float64 golden device) holding
values exact in their format. On disk float16 is float16 and bfloat16 is its
upper 16 bits as uint16 (HDF5 has no bfloat16 type). numpy's float32 <->
float16 casts round element by element and take ~3 ns a value; since the
values are already exact, the conversions here move exponent bits instead,
about 3x faster, bit-identical to ``astype`` (tested, including subnormals,
signed zeros, Inf and NaN). The float16 tricks go through float32 denormals;
a process that flushes denormals to zero falls back to ``astype`` (checked
once).
"""

from __future__ import annotations

import numpy as np

_U16, _U32 = np.uint16, np.uint32
_TO_F16_SCALE = np.float32(2.0**-112)  # float32 exponent bias 127 -> float16 bias 15
_FROM_F16_SCALE = np.float32(2.0**112)
_SMALL = 16384  # below this many values numpy's own cast is as fast
_fast: bool | None = None

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def container_dtype(dtype: str) -> np.dtype:
    """The dtype a reader gets a tensor of format ``dtype`` in."""
    if dtype == "float64":
        return np.dtype(np.float64)
    if dtype in FLOAT_DTYPES:
        return np.dtype(np.float32)
    return np.dtype(dtype)


def stored_dtype(dtype: str) -> np.dtype:
    """The on-disk dtype of a tensor of format ``dtype`` (TypeError for a name numpy does not know)."""
    if dtype == "bfloat16":
        return np.dtype(_U16)
    return np.dtype(dtype)


def to_storage(array: np.ndarray, dtype: str, has_nan: bool = True) -> np.ndarray:
    """``array`` as written to disk for a tensor of format ``dtype``; C-contiguous."""
    array = np.asarray(array)
    if dtype == "float16":
        if array.dtype == np.float16:
            return np.require(array, None, "C")
        return _f32_to_f16(np.require(array, np.float32, "C"))
    if dtype == "bfloat16":
        if array.dtype.itemsize == 2:  # already bfloat16 (ml_dtypes) or its bits
            return np.require(array, None, "C").view(_U16)
        return _f32_to_bf16_bits(np.require(array, np.float32, "C"), has_nan)
    if dtype in ("float32", "float64"):
        return np.require(array, dtype, "C")
    return np.require(array, None, "C")


def from_storage(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The container array (float32, float64 for float64) of a stored tensor of format ``dtype``."""
    if dtype == "float16":
        return _f16_to_f32(raw)
    if dtype == "bfloat16":
        return np.asarray(raw.astype(_U32) << _U32(16)).view(np.float32)
    if dtype == "float32" and raw.dtype != np.float32:
        return raw.astype(np.float32)
    return raw


def _fast_ok() -> bool:
    """Whether float32 denormals survive here (they do unless something set flush-to-zero)."""
    global _fast
    if _fast is None:
        probe = np.array([2.0**-24, -(2.0**-20), 0.5, 65504.0], dtype=np.float32)
        bits = _f32_to_f16_bits(probe)
        _fast = bool(np.array_equal(bits, probe.astype(np.float16).view(_U16))
                     and np.array_equal(_f16_bits_to_f32(bits), probe))
    return _fast


def _f32_to_f16(x: np.ndarray) -> np.ndarray:
    if x.size < _SMALL or not _fast_ok():
        return x.astype(np.float16)
    return _f32_to_f16_bits(x).view(np.float16)


def _f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    # Scaling by 2**-112 moves the exponent to float16's bias; fp16 subnormals
    # become float32 denormals with the same mantissa, zero stays zero, and Inf
    # and NaN stay themselves. The float16 pattern is then bits 13..27, plus the sign.
    scaled = np.multiply(x, _TO_F16_SCALE)
    bits = scaled.view(_U32)
    np.right_shift(bits, _U32(13), out=bits)
    half = bits.astype(_U16)
    half &= _U16(0x7FFF)
    half |= x.reshape(-1).view(_U16)[1::2].reshape(x.shape) & _U16(0x8000)
    return half


def _f16_to_f32(raw: np.ndarray) -> np.ndarray:
    if raw.size < _SMALL or not _fast_ok():
        return raw.astype(np.float32)
    return _f16_bits_to_f32(raw.view(_U16))


def _f16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    wide = bits.astype(_U32)
    magnitude = wide & _U32(0x7FFF)
    special = magnitude.size and magnitude.max() >= 0x7C00
    magnitude <<= _U32(13)
    values = magnitude.view(np.float32)
    values *= _FROM_F16_SCALE
    if special:
        top = (bits & _U16(0x7C00)) == _U16(0x7C00)
        values[top] = np.where((bits[top] & _U16(0x3FF)) != 0, np.float32(np.nan), np.float32(np.inf))
    wide &= _U32(0x8000)
    wide <<= _U32(16)
    magnitude |= wide
    return values


def _f32_to_bf16_bits(x: np.ndarray, has_nan: bool) -> np.ndarray:
    bits = np.asarray(x.view(_U32) >> _U32(16)).astype(_U16)
    if has_nan:  # a NaN whose payload sat in the dropped half would read back as Inf
        nan = np.isnan(x)
        if nan.any():
            bits[nan] |= _U16(0x0040)
    return bits
