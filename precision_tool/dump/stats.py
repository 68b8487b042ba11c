"""Tensor statistics in float64 accumulators, fast enough for every op of every step.

One pass each for min and max; the sum and the sum of squares accumulate in
float64 (arrays up to 256 Ki values are copied to float64 once and squared
there; larger ones are reduced with a float64 accumulator and their squares
rounded once to the array's precision, a relative error below 1e-7). When the variance is tiny next to
the mean squared, where ``E[x^2] - mean^2`` would cancel, a second pass
computes it from ``x - mean``. NaN and Inf are counted, and the other
statistics restricted to the finite values, only when the sum says some
value is not finite; saturated values only when min or max reaches the
format's largest finite value. `StatsCache` computes each array once per
step, since most op inputs are earlier ops' outputs.

Internally statistics are plain tuples in `TensorStats` field order (the
collector's hot path makes ~300 of them per step); `tensor_stats` returns
the dataclass.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from precision_tool.dump.records import TensorStats
from precision_tool.engine.formats import FORMATS

_F64 = np.float64
_NAN = math.nan
_EMPTY = (0, _NAN, _NAN, _NAN, _NAN, 0.0, 0, 0, 0)
_SMALL = 40  # up to this many values plain Python beats numpy's per-call cost
_CAST_WHOLE = 1 << 18  # up to this many values one float64 copy is cheaper than casting reductions
_CANCELLATION = 1e-6  # below this variance / mean^2 the one-pass variance has lost its digits
# the largest finite value of each float format: values at it count as saturated
_LIMITS = {name: fmt.max for name, fmt in FORMATS.items()}

# below this magnitude a value's square is finite in its own dtype
_SQUARE_SAFE = {np.dtype(t): float(np.sqrt(np.finfo(t).max)) / 2 for t in (np.float16, np.float32, np.float64)}

StatsTuple = tuple  # (count, min, max, mean, std, norm, nan, inf, saturated)


def tensor_stats(array, dtype: str = "") -> TensorStats:
    """Statistics of ``array``, whose values are those of format ``dtype``."""
    return TensorStats(*stats_tuple(array, dtype))


def stats_tuple(array, dtype: str = "") -> StatsTuple:
    """`tensor_stats` as a tuple in `TensorStats` field order."""
    flat = np.asarray(array).reshape(-1)
    if flat.dtype.kind != "f":
        flat = flat.astype(_F64)
    count = flat.size
    if count <= _SMALL:
        return _small_stats(flat.tolist(), dtype) if count else _EMPTY
    if count <= _CAST_WHOLE and flat.dtype.itemsize < 8:
        # one float64 copy (cache-sized): exact squares, and both sums accumulate in float64
        wide = flat.astype(_F64)
        total = float(np.add.reduce(wide))
        if total - total != 0.0:  # inf or nan: some value is not finite
            return _nonfinite_stats(flat, dtype)
        np.square(wide, out=wide)
        squares = float(np.add.reduce(wide))
    else:
        total = float(np.add.reduce(flat, dtype=_F64))
        if total - total != 0.0:
            return _nonfinite_stats(flat, dtype)
        squares = None
    low = float(flat.min())
    high = float(flat.max())
    if squares is None:
        if max(high, -low) < _SQUARE_SAFE.get(flat.dtype, 0.0):
            squares = float(np.add.reduce(np.square(flat), dtype=_F64))
        else:  # squares would overflow the array's dtype: square in float64
            squares = float(np.einsum("i,i->", flat, flat, dtype=_F64))
    mean = total / count
    variance = squares / count - mean * mean
    if variance < _CANCELLATION * mean * mean:
        centred = flat.astype(_F64) - mean
        variance = float(np.add.reduce(np.square(centred))) / count
    limit = _LIMITS.get(dtype)
    saturated = 0
    if limit is not None and (high >= limit or -low >= limit):
        saturated = int(np.count_nonzero(np.abs(flat) >= limit))
    return (count, low, high, mean, math.sqrt(max(variance, 0.0)), math.sqrt(squares), 0, 0, saturated)


def _small_stats(values: list, dtype: str) -> StatsTuple:
    """`stats_tuple` of a few values in plain Python floats (numpy's per-call cost dominates there)."""
    count = len(values)
    if not math.isfinite(sum(values)):  # (fsum raises on inf - inf)
        return _nonfinite_stats(np.array(values, dtype=_F64), dtype)
    total = math.fsum(values)
    low, high = min(values), max(values)
    squares = math.fsum([v * v for v in values])
    mean = total / count
    variance = math.fsum([(v - mean) ** 2 for v in values]) / count
    limit = _LIMITS.get(dtype)
    saturated = sum(1 for v in values if abs(v) >= limit) if limit is not None and \
        (high >= limit or -low >= limit) else 0
    return (count, float(low), float(high), mean, math.sqrt(variance), math.sqrt(squares), 0, 0, saturated)


def _nonfinite_stats(flat: np.ndarray, dtype: str) -> StatsTuple:
    nan = np.isnan(flat)
    inf = np.isinf(flat)
    finite = flat[~(nan | inf)]
    base = stats_tuple(finite, dtype) if finite.size else _EMPTY
    return (flat.size, *base[1:6], int(np.count_nonzero(nan)), int(np.count_nonzero(inf)), base[8])


class StatsCache:
    """Per-step memo of `stats_tuple` by array identity.

    ``entries`` maps ``id(array)`` to (weak reference, dtype, stats); the weak
    reference makes sure an id reused by a new array after the old one was
    freed is never mistaken for it.
    """

    def __init__(self) -> None:
        self.entries: dict[int, tuple[weakref.ref, str, StatsTuple]] = {}

    def get(self, array: np.ndarray, dtype: str) -> StatsTuple:
        entry = self.entries.get(id(array))
        if entry is not None and entry[1] == dtype and entry[0]() is array:
            return entry[2]
        stats = stats_tuple(array, dtype)
        try:
            self.entries[id(array)] = (weakref.ref(array), dtype, stats)
        except TypeError:  # not weak-referenceable (a numpy scalar): do not cache
            pass
        return stats

    def clear(self) -> None:
        self.entries.clear()
