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

`StatsBatch` computes the same statistics for many arrays at once (the
collector's ~300 arrays a step): the arrays are copied side by side into one
cache-sized float64 buffer, and ``np.add/minimum/maximum.reduceat`` over the
segment offsets give every array's sum, min, max and sum of squares in a
handful of numpy calls per 256 Ki values, instead of five or six calls per
array, whose fixed cost dominates on small arrays. The accuracy is that of
`stats_tuple`: float32 values and their squares are exact in float64, and
both sums accumulate in float64. Arrays with an Inf or NaN, a variance that
would cancel, more than 256 Ki values or none take `stats_tuple`; a
constant array gets its value as mean and std 0 exactly.

Where the optional C extension ``precision_tool._native`` is built, its
``stats_rows`` computes a whole batch in one call: one pass over each array
where it lies (no float64 copy, no batch buffer) and the row built in C, to
spare numpy's per-call cost; `stats_tuple` uses it for arrays of more than
40 values. Rows it cannot give (inf or nan, a variance lost to
cancellation) are computed as before. ``PRECISION_TOOL_KERNEL=numpy``
forces the numpy path.

Internally statistics are plain tuples in `TensorStats` field order (the
collector's hot path makes ~300 of them per step); `tensor_stats` returns
the dataclass.
"""

from __future__ import annotations

import itertools
import math
import weakref

import numpy as np

from precision_tool import native
from precision_tool.dump.records import TensorStats
from precision_tool.engine.formats import FORMATS

_native = native.extension  # None: numpy computes the same sums

_F64 = np.float64
_NAN = math.nan
_EMPTY = (0, _NAN, _NAN, _NAN, _NAN, 0.0, 0, 0, 0)
_NO_ROWS = np.empty((0, 9), _F64)
_NATIVE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # native byte order: what the C pass reads
_BATCH = 1 << 18  # values per `StatsBatch` buffer (2 MiB of float64: stays in cache)
_SMALL = 40  # up to this many values plain Python beats numpy's per-call cost
SMALL_COUNT = _SMALL  # (for callers that hand larger arrays to the C extension themselves)
_CAST_WHOLE = 1 << 18  # up to this many values one float64 copy is cheaper than casting reductions
_CANCELLATION = 1e-6  # below this variance / mean^2 the one-pass variance has lost its digits
CANCELLATION = _CANCELLATION
# the largest finite value of each float format: values at it count as saturated
_LIMITS = {name: fmt.max for name, fmt in FORMATS.items()}

_SATURATION_FLOOR = min(_LIMITS.values())  # below this magnitude no format's values saturate
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
    if _native is not None and _native_ok(flat):
        row = _native.stats_rows((flat,), _CANCELLATION)[0]
        if row is not None:
            return (*row[:8], _saturated(flat, row[1], row[2], dtype))
    if count <= _CAST_WHOLE and flat.dtype.itemsize < 8:
        # one float64 copy (cache-sized): exact squares, and both sums accumulate in float64
        wide = flat.astype(_F64)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: the sum says so, quietly
            total = float(np.add.reduce(wide))
        if total - total != 0.0:  # inf or nan: some value is not finite
            return _nonfinite_stats(flat, dtype)
        np.square(wide, out=wide)
        squares = float(np.add.reduce(wide))
    else:
        with np.errstate(invalid="ignore", over="ignore"):
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
            with np.errstate(over="ignore"):
                squares = float(np.einsum("i,i->", flat, flat, dtype=_F64))
    if squares == math.inf:  # finite values near float64's largest: their squares are not
        return _scaled_stats(flat, dtype)
    mean = total / count
    variance = squares / count - mean * mean
    if variance < _CANCELLATION * mean * mean:
        centred = flat.astype(_F64) - mean
        variance = float(np.add.reduce(np.square(centred))) / count
    return (count, low, high, mean, math.sqrt(max(variance, 0.0)), math.sqrt(squares), 0, 0,
            _saturated(flat, low, high, dtype))


def _saturated(flat: np.ndarray, low: float, high: float, dtype: str) -> int:
    """How many of the (finite) values are at format ``dtype``'s largest finite value, in magnitude."""
    limit = _LIMITS.get(dtype)
    if limit is None or not (high >= limit or -low >= limit):
        return 0
    return int(np.count_nonzero(np.abs(flat) >= limit))


def _native_ok(flat: np.ndarray) -> bool:
    """Whether ``_native.stats_rows`` takes ``flat``: native-order float32 or float64, contiguous, not empty."""
    return flat.dtype.char in "fd" and flat.dtype.isnative and flat.flags.c_contiguous and flat.size > 0


def _small_stats(values: list, dtype: str) -> StatsTuple:
    """`stats_tuple` of a few values in plain Python floats (numpy's per-call cost dominates there)."""
    count = len(values)
    if not math.isfinite(sum(values)):  # (fsum raises on inf - inf)
        return _nonfinite_stats(np.array(values, dtype=_F64), dtype)
    total = math.fsum(values)
    low, high = min(values), max(values)
    squares = math.fsum([v * v for v in values])
    if squares == math.inf:  # finite values near float64's largest: their squares are not
        return _scaled_stats(np.array(values, dtype=_F64), dtype)
    mean = total / count
    variance = math.fsum([(v - mean) * (v - mean) for v in values]) / count
    limit = _LIMITS.get(dtype)
    saturated = sum(1 for v in values if abs(v) >= limit) if limit is not None and \
        (high >= limit or -low >= limit) else 0
    return (count, float(low), float(high), mean, math.sqrt(variance), math.sqrt(squares), 0, 0, saturated)


def _nonfinite_stats(flat: np.ndarray, dtype: str) -> StatsTuple:
    nan = np.isnan(flat)
    inf = np.isinf(flat)
    if not nan.any() and not inf.any():  # every value finite, their sum not (float64 values near its largest)
        return _scaled_stats(flat, dtype)
    finite = flat[~(nan | inf)]
    base = stats_tuple(finite, dtype) if finite.size else _EMPTY
    return (flat.size, *base[1:6], int(np.count_nonzero(nan)), int(np.count_nonzero(inf)), base[8])


def _scaled_stats(flat: np.ndarray, dtype: str) -> StatsTuple:
    """`stats_tuple` of finite values whose float64 sums or squares overflow (1e308 twice): summed divided by a
    power of two at least their largest magnitude, and multiplied back; a mean or spread beyond float64's range,
    and the norm, then read inf."""
    wide = flat.astype(_F64)
    count = wide.size
    low, high = float(wide.min()), float(wide.max())
    scale = math.ldexp(1.0, math.frexp(max(high, -low))[1] - 1)  # exact (a power of two), the values within 2
    scaled = wide / scale
    mean = math.fsum(scaled.tolist()) / count if count <= _SMALL else float(np.add.reduce(scaled)) / count
    squares = float(np.add.reduce(np.square(scaled)))
    variance = float(np.add.reduce(np.square(scaled - mean))) / count
    return (count, low, high, mean * scale, math.sqrt(variance) * scale, math.sqrt(squares) * scale, 0, 0,
            _saturated(flat, low, high, dtype))


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


class StatsBatch:
    """`stats_tuple` of many arrays in a few numpy calls per 256 Ki values.

    `add` queues an array and returns the position of its row in `rows`;
    when the queued arrays reach 256 Ki values, and on `flush`, they are
    copied side by side into one float64 buffer that stays in cache, their
    rows are computed from it, and the batch lets go of them. Rows carry no
    saturated count, which depends on the format: `row` adds it.
    """

    def __init__(self) -> None:
        self.rows: list = []  # a stats tuple per added array; None until computed
        self.saturated: dict[int, dict[str, int]] = {}  # position -> {format: count}, where some saturate
        self._buffer = np.empty(0, _F64)
        self._matrix = _NO_ROWS  # the first rows as a float64 matrix (see `matrix`)
        self._flats: list[np.ndarray] = []
        self._where: list[int] = []
        self._used = 0

    def add(self, array) -> int:
        """Queue the statistics of ``array``; return the position of its row."""
        position = len(self.rows)
        if _native is not None and type(array) is np.ndarray and array.dtype in _NATIVE_DTYPES \
                and array.flags.c_contiguous and 0 < array.size <= _BATCH:
            flat = array  # what the C pass reads as it is: no view to make, nothing to check again
        else:
            flat = np.asarray(array).ravel(order="K")  # a transpose's values without a copy
            size = flat.size
            if not size or size > _BATCH or (_native is not None and not _native_ok(flat)):
                # nothing to batch, enough values to amortise numpy's calls, or none the C pass reads
                self.rows.append(stats_tuple(flat) if size else _EMPTY)
                self._count_saturated(position, flat)
                return position
        size = flat.size
        if self._used + size > _BATCH:
            self._reduce()
        self._flats.append(flat)
        self._where.append(position)
        self._used += size
        self.rows.append(None)
        return position

    def take(self, event, floats, seen: dict, tensors: list, later: list, leftover: list) -> None:
        """The collector's per-tensor bookkeeping of one op in stats mode, in C (``_native.slots``).

        Appends (kind, index, dtype, shape, row) to ``tensors`` for each array
        of ``event``, computing the rows of the memory new to the step at once;
        an array it leaves to the caller gets None there, and (position, kind,
        index) in ``leftover``. Rows listed in ``later`` are finished by
        `settle`, which must run before those arrays may change. Only where
        the extension is built (`native_pass`).
        """
        _native.slots(_as_list(event.inputs), _as_list(event.input_dtypes), _as_list(event.outputs),
                      _as_list(event.output_dtypes), floats, np.ndarray, seen, tensors, self.rows, later, leftover,
                      _CANCELLATION, _SATURATION_FLOOR)

    def settle(self, later: list) -> None:
        """Finish the rows `take` left: statistics with NaN, Inf or cancellation, and saturated counts."""
        for position, array in later:
            flat = array.reshape(-1)
            if self.rows[position] is None:
                self.rows[position] = stats_tuple(flat)
            self._count_saturated(position, flat)

    @property
    def native_pass(self) -> bool:
        """Whether `take` is there (the C extension is built and in use)."""
        return _native is not None

    @property
    def queued(self) -> int:
        """How many values wait for their rows."""
        return self._used

    def flush(self) -> list:
        """Compute the rows still queued; return `rows`."""
        if self._flats:
            self._reduce()
        return self.rows

    def matrix(self) -> np.ndarray:
        """Every row so far as one float64 array, a row per position (saturated counts 0: see `row`).

        Computes the rows still queued; rows already converted by an earlier call are not converted again.
        """
        rows = self.flush()
        done = len(self._matrix)
        if done < len(rows):
            new = rows[done:]
            block = np.fromiter(itertools.chain.from_iterable(new), _F64, count=len(new) * 9).reshape(-1, 9)
            self._matrix = np.concatenate((self._matrix, block)) if done else block
        return self._matrix

    def row(self, position: int, dtype: str) -> StatsTuple:
        """The computed row at ``position``, with the saturated count of format ``dtype``."""
        counts = self.saturated.get(position)
        row = self.rows[position]
        return (*row[:8], counts[dtype]) if counts and counts.get(dtype) else row

    def clear(self) -> None:
        """Forget every row and queued array."""
        self.rows = []
        self.saturated = {}
        self._matrix = _NO_ROWS
        self._flats, self._where, self._used = [], [], 0

    def compute(self, arrays, dtypes) -> list:
        """The rows of ``arrays`` of formats ``dtypes``, from a cleared batch."""
        self.clear()
        positions = [self.add(array) for array in arrays]
        self.flush()
        rows = [self.row(position, dtype) for position, dtype in zip(positions, dtypes)]
        self.clear()
        return rows

    def _reduce(self) -> None:
        """Compute the rows of the queued arrays, in one C call or from one buffer holding them all."""
        if _native is not None:
            self._reduce_native()
            return
        flats = self._flats
        sizes = [flat.size for flat in flats]
        offsets = np.zeros(len(sizes), np.intp)
        np.cumsum(sizes[:-1], out=offsets[1:])
        if not self._buffer.size:
            self._buffer = np.empty(_BATCH, _F64)
        values = self._buffer[:self._used]
        np.concatenate(flats, out=values, casting="unsafe")
        with np.errstate(all="ignore"):  # inf and nan: the arrays that hold them are redone
            total = np.add.reduceat(values, offsets)
            low = np.minimum.reduceat(values, offsets)
            high = np.maximum.reduceat(values, offsets)
            square_sum = np.add.reduceat(np.square(values, out=values), offsets)
            rows, redo, extreme = _rows(sizes, total, low, high, square_sum)
            self._store(rows, redo, extreme)

    def _reduce_native(self) -> None:
        """`_reduce` by ``_native.stats_rows``: each array read once, where it is, its row built in C."""
        flats, where, rows = self._flats, self._where, self.rows
        for position, flat, row in zip(where, flats, _native.stats_rows(flats, _CANCELLATION)):
            if row is None:  # inf or nan, or a variance lost to cancellation
                row = stats_tuple(flat)
            rows[position] = row
            if row[2] >= _SATURATION_FLOOR or -row[1] >= _SATURATION_FLOOR:
                self._count_saturated(position, flat)
        self._flats, self._where, self._used = [], [], 0

    def _store(self, rows: list, redo, extreme) -> None:
        """File the computed rows, redo those `_rows` could not give, count saturation; empty the queue."""
        flats, where = self._flats, self._where
        for position, row in zip(where, rows):
            self.rows[position] = row
        for i in np.flatnonzero(redo).tolist():
            self.rows[where[i]] = stats_tuple(flats[i])
        for i in np.flatnonzero(extreme).tolist():
            self._count_saturated(where[i], flats[i])
        self._flats, self._where, self._used = [], [], 0

    def _count_saturated(self, position: int, flat: np.ndarray) -> None:
        """Count the finite values at each format's max that the row's min or max reaches."""
        row = self.rows[position]
        peak = max(row[2], -row[1])  # over the finite values; nan (none finite) compares false
        if not peak >= _SATURATION_FLOOR:
            return
        magnitude = np.abs(flat)
        finite = magnitude != math.inf
        self.saturated[position] = {name: int(np.count_nonzero((magnitude >= limit) & finite))
                                    for name, limit in _LIMITS.items() if peak >= limit}


def _as_list(values) -> list:
    return values if type(values) is list else list(values)


def _rows(sizes: list, total, low, high, square_sum) -> tuple:
    """Stats tuples from per-array sums and extremes; masks of those to redo and to count saturation for."""
    count = np.array(sizes, _F64)
    mean = total / count
    variance = square_sum / count - mean * mean
    constant = low == high
    mean[constant] = low[constant]  # exact, and std 0 exactly
    variance[constant] = 0.0
    # inf or nan somewhere (the sum is not finite), or a variance lost to cancellation
    redo = ~np.isfinite(total) | (~constant & (variance < _CANCELLATION * mean * mean))
    extreme = redo | (np.maximum(high, -low) >= _SATURATION_FLOOR)
    columns = (low.tolist(), high.tolist(), mean.tolist(), np.sqrt(np.maximum(variance, 0.0)).tolist(),
               np.sqrt(square_sum).tolist())
    return [(*row, 0, 0, 0) for row in zip(sizes, *columns)], redo, extreme
