"""Floating-point formats and their rounding, with saturation or IEEE overflow.

Tensors of every format live in float32 arrays (float64 for the float64
golden device) whose values are exactly representable in their format. A
16-bit result is made by rounding a float32 result once, round-to-nearest-even,
without leaving float32: bfloat16 with integer operations on the bits, float16
with one float addition of a per-element magic constant. Both are several
times faster than an ``astype`` round trip and bit-identical to numpy's
float16 and ml_dtypes' bfloat16 (checked on all 2**32 patterns once, and on
a stride of them in ``tests/engine/test_formats.py``).

Overflow modes, as on Ascend (``../shared/reference/NUMERICS.md`` section 1.1):

``saturation``
    a result beyond the format's largest finite value becomes +-max, +-inf
    becomes +-max and NaN becomes 0.
``inf_nan``
    IEEE 754: overflow gives +-inf, NaN stays NaN.

Either way, `Format.round` reports whether the IEEE result would have been
non-finite, which is what raises the float-status flag.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precision_tool.errors import choice_error

OVERFLOW_MODES = ("saturation", "inf_nan")



def _round_bits(x: np.ndarray, dropped_bits: int) -> np.ndarray:
    """Round float32 ``x`` to ``23 - dropped_bits`` mantissa bits, ties to even."""
    u = np.require(x, np.float32, "C").view(np.uint32)
    keep_lsb = (u >> np.uint32(dropped_bits)) & np.uint32(1)
    keep_lsb += np.uint32((1 << (dropped_bits - 1)) - 1)
    keep_lsb += u
    keep_lsb &= np.uint32((0xFFFFFFFF << dropped_bits) & 0xFFFFFFFF)
    return keep_lsb.view(np.float32)


_ABS_BITS = np.uint32(0x7FFFFFFF)
_EXP_BITS = np.uint32(0x7F800000)
_F16_MAGIC_SHIFT = np.uint32(13 << 23)  # M = 2**(e + 13) has ulp 2**(e - 10): fp16's spacing in binade e
_F16_MAGIC_MIN = np.uint32(0x3F000000)  # 0.5, ulp 2**-24: fp16's subnormal spacing


def _round_fp16(x: np.ndarray, ax: np.ndarray) -> np.ndarray:
    """Round float32 ``x`` (``ax``: its |x| bits) to fp16 values, ties to even, subnormals included.

    ``(|x| + M) - M`` with ``M = max(2**(e + 13), 0.5)``, e the binade of x:
    the float32 adder rounds |x| onto M's ulp grid, which is fp16's grid at
    x, normal or subnormal, with no masks. Bit-identical to numpy's
    ``astype(float16)`` for every float32 below 65520 (checked exhaustively);
    out-of-range values come out as garbage that `Format._fix_overflow` replaces.
    """
    magic = ax & _EXP_BITS
    magic += _F16_MAGIC_SHIFT
    np.maximum(magic, _F16_MAGIC_MIN, out=magic)
    m = magic.view(np.float32)
    y = ax.view(np.float32)  # reuses ax's buffer: the caller is done with it
    with np.errstate(invalid="ignore", over="ignore"):
        y += m
        y -= m
    return np.copysign(y, x, out=y)


@dataclass(frozen=True)
class Format:
    """A floating-point format: its limits and how to round into it."""

    name: str
    bits: int
    max: float
    tiny: float  # smallest positive normal
    smallest_subnormal: float
    eps: float
    container: type  # numpy dtype the values are held in while computing
    # |x| at or above this rounds to inf (the midpoint between max and 2**emax+1, ties to even)
    overflow_threshold: float

    @property
    def unit_roundoff(self) -> float:
        """The relative error bound of one round-to-nearest: eps / 2."""
        return self.eps / 2

    def round(self, x: np.ndarray, overflow_mode: str = "inf_nan") -> tuple[np.ndarray, bool]:
        """Round ``x`` into this format; return the result and whether IEEE would overflow.

        The flag is true when the IEEE result holds an inf or a NaN, including
        when ``saturation`` replaced them by +-max and 0.
        """
        x = np.asarray(x)
        if x.dtype != self.container:
            x = x.astype(self.container)
        if x.size == 0:
            return x, False
        if x.ndim == 0:
            y, overflow = self.round(x.reshape(1), overflow_mode)
            return y.reshape(()), overflow
        if self.bits == 16:
            ax = np.require(x, np.float32, "C").view(np.uint32) & _ABS_BITS
            # |x| bit patterns order as unsigned ints like the floats do, NaNs above inf: one pass
            in_range = ax.max() < self._overflow_bits
            y = _round_fp16(x, ax) if self.name == "float16" else _round_bits(x, 16)
        else:
            lo, hi = x.min(), x.max()
            in_range = -self.overflow_threshold < lo and hi < self.overflow_threshold
            y = x
        if in_range:
            return y, False
        return self._fix_overflow(x, y, overflow_mode), True

    @property
    def _overflow_bits(self) -> np.uint32:
        """The float32 bit pattern of ``overflow_threshold``."""
        return np.float32(self.overflow_threshold).view(np.uint32)

    def _fix_overflow(self, x: np.ndarray, y: np.ndarray, overflow_mode: str) -> np.ndarray:
        """Apply the overflow mode to a rounded result that holds out-of-range values."""
        y = np.array(y, dtype=self.container, copy=True)
        nan = np.isnan(x)
        big = ~nan & (np.abs(x) >= self.overflow_threshold)
        if overflow_mode == "saturation":
            y[big] = np.copysign(self.max, x[big])
            y[nan] = 0.0
        else:
            y[big] = np.copysign(np.inf, x[big])
            y[nan] = np.nan
        return y


def _make_formats() -> dict[str, Format]:
    f16 = np.finfo(np.float16)
    f32 = np.finfo(np.float32)
    f64 = np.finfo(np.float64)
    bf16_max = float(np.uint32(0x7F7F0000).view(np.float32))
    return {
        "float16": Format(
            "float16", 16, float(f16.max), float(f16.smallest_normal), 2.0**-24,
            float(f16.eps), np.float32, 65520.0,
        ),
        "bfloat16": Format(
            "bfloat16", 16, bf16_max, float(f32.smallest_normal), float(np.uint32(1).view(np.float32)),
            2.0**-7, np.float32, float(np.uint32(0x7F7F8000).view(np.float32)),
        ),
        "float32": Format(
            "float32", 32, float(f32.max), float(f32.smallest_normal),
            float(np.uint32(1).view(np.float32)), float(f32.eps), np.float32, float("inf"),
        ),
        "float64": Format(
            "float64", 64, float(f64.max), float(f64.smallest_normal), 5e-324,
            float(f64.eps), np.float64, float("inf"),
        ),
    }


FORMATS: dict[str, Format] = _make_formats()
FLOAT16 = FORMATS["float16"]
BFLOAT16 = FORMATS["bfloat16"]
FLOAT32 = FORMATS["float32"]
FLOAT64 = FORMATS["float64"]

_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64", "f64": "float64",
}


def get_format(name: str) -> Format:
    """Look a format up by name or common alias (fp16, bf16, fp32, ...)."""
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    try:
        return FORMATS[key]
    except KeyError:
        raise choice_error("dtype", name, FORMATS) from None


def check_overflow_mode(mode: str) -> str:
    """Return ``mode`` if it is a known overflow mode, else raise a ConfigError."""
    if mode not in OVERFLOW_MODES:
        raise choice_error("overflow mode", mode, OVERFLOW_MODES)
    return mode
