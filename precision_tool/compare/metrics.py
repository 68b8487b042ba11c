"""Per-tensor comparison metrics, streamed in float64 over chunks of a tensor pair.

``x`` is the target tensor, ``y`` the golden one. Every sum, maximum and
product is taken in float64, so fp16 and bf16 values (held in float32
containers) lose nothing. One `PairAccumulator` reads each pair once, chunk
by chunk; its memory is a few cache-sized float64 buffers, whatever the tensor
size. The formulas, and the edge cases below, follow msaccucmp (CANN's
``algorithm_manager/builtin_algorithm/alg_*.py``) unless stated; each is a
small function of the accumulated sums, documented and tested on its own.

Elements where either side is NaN or +-inf are left out of every metric and
counted instead (`PairAccumulator.nonfinite_pairs`,
`PairAccumulator.target_only_nonfinite`).

Speed: a chunk is processed in blocks of `BLOCK_ELEMENTS` in five
preallocated float64 buffers, every numpy call writing ``out=`` (no
temporaries), about 30 vectorised passes a block. Dot products are short-row
BLAS calls (`row_dot`). KL's log(u/v) is 2·atanh(s), s = (u − v)/(u + v), summed
as a truncated series where |s| is small (`_kl_series`), to within half a
float64 ulp of each term: numpy's float64 log is scalar and cost a third of
the pass. A block where x == y skips the errors and the series.

That numpy path is the fallback. Where the optional C extension
``precision_tool._native`` is built (``pip install`` builds it when a C
compiler is there), one fused, vectorised loop computes the same float64 sums
in a single pass at about 2 ns a pair instead of 8 (`KERNEL` says which is
in use; ``PRECISION_TOOL_KERNEL=numpy`` forces the fallback). The two agree
to the rounding of float64 sums taken in a different order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from precision_tool import native

_kernel = native.extension  # None: the numpy path does the same work
KERNEL = "c" if _kernel is not None else "numpy"  # which path PairAccumulator takes
# slots of the C kernel's sums array (the enum in _native.c)
(_COUNT, _XY, _XX, _YY, _DD, _ABS, _MAX_ABS, _REL, _MAX_REL, _REL_COUNT, _KL_U, _KL_V, _KL_S, _N_SUMS) = range(14)

FLOAT32_EPS = float(np.finfo(np.float32).eps)  # msaccucmp's KL floor and zero snap
FLOAT64_EPS = float(np.finfo(np.float64).eps)  # msaccucmp's relative-error and norm floor
BLOCK_ELEMENTS = 1 << 17  # values per block: amortises the ~40 numpy calls a block makes (measured best of 32-256 Ki)
DOT_ROW = 256  # values per BLAS dot (see `row_dot`)
SERIES_MAX = 0.025  # KL: |s| beyond this takes a float64 log, below it the atanh series (5 terms at most)
DIRECT_SHARE = 8  # KL: a block with more than 1/8 of its |s| beyond SERIES_MAX takes logs throughout
# largest s² for which k = 1, 2, ... terms of the atanh series are within half a float64 ulp (see `_series_terms`)
_SERIES_LIMITS = tuple((FLOAT64_EPS / 2 * (2 * k + 1)) ** (1 / k) for k in range(1, 6))

ONE_SIDE_ZERO = "one side is all zeros"
NO_FINITE_PAIRS = "no element is finite on both sides"


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class TensorMetrics:
    """The metrics of one tensor pair; ``note`` says why cosine is NaN, if it is."""

    count: int  # element pairs compared (finite on both sides)
    cosine: float
    max_abs_err: float
    max_rel_err: float
    mean_abs_err: float
    mean_rel_err: float
    rmse: float
    rel_euclidean: float
    accumulated_rel_err: float
    kl_divergence: float
    nonfinite_pairs: int = 0  # pairs left out because a side is NaN or inf
    target_only_nonfinite: int = 0  # of those, pairs where the target is non-finite and golden holds another
    # value (a finite one, the other infinity, NaN against inf)
    note: str = ""


def cosine_similarity(sxy: float, sxx: float, syy: float, identical: bool = False) -> tuple[float, str]:
    """Cosine from Σxy, Σx², Σy²: clipped to [-1, 1]; 1 when both are zero, NaN when one is.

    ``identical`` (every compared pair equal) gives exactly 1.0, which the
    rounding of ``sxy / (|x| |y|)`` would not always give.
    """
    x_zero, y_zero = sxx == 0.0, syy == 0.0
    if identical or (x_zero and y_zero):
        return 1.0, ""
    if x_zero or y_zero:
        return math.nan, ONE_SIDE_ZERO
    cosine = sxy / (math.sqrt(sxx) * math.sqrt(syy))
    return min(1.0, max(-1.0, cosine)), ""


def relative_euclidean(sdd: float, syy: float) -> float:
    """‖x−y‖ / ‖y‖, and 0 when ‖y‖ is at most float64 eps (msaccucmp's rule)."""
    norm_y = math.sqrt(syy)
    if norm_y <= FLOAT64_EPS:
        return 0.0
    return math.sqrt(sdd) / norm_y


def kl_divergence(s: float, u: float, v: float) -> float:
    """KL(p‖q) from S = Σu·log(u/v), U = Σu and V = Σv, where p = u/U and q = v/V.

    Σp·log(p/q) = S/U − log(U/V). A result below float32 eps in magnitude is
    snapped to 0, as msaccucmp does. NaN when either side sums to zero.
    """
    if not (u > 0.0 and v > 0.0):
        return math.nan
    kl = s / u - math.log(u / v)
    return 0.0 if abs(kl) < FLOAT32_EPS else kl


def kl_shift(lo: float, hi: float) -> tuple[float, float]:
    """(shift, floor) with u = max(x − shift, floor) proportional to max((x−lo)/(hi−lo), float32 eps).

    msaccucmp min-max normalises each side to [0, 1] and floors it at float32
    eps before normalising to sum 1; dividing by hi − lo cancels in KL, so
    only the floor is scaled. A constant tensor (hi == lo) keeps its values, as
    msaccucmp's ``_normalized`` does.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return 0.0, FLOAT32_EPS
    return lo, FLOAT32_EPS * (hi - lo)


def row_dot(a: np.ndarray, b: np.ndarray) -> float:
    """Σa·b of two contiguous float64 blocks: one batched matmul of rows of `DOT_ROW` values.

    OpenBLAS threads a dot of more than 10,000 values, and with --jobs 2 on two
    cores those threads stall each call for milliseconds. Short rows stay on
    the calling thread at BLAS speed (0.3 ns a value, einsum's is 0.55), and a
    block of 128 Ki values makes 512 of them: numpy releases the GIL around a
    gufunc loop of more than 500 iterations, not around a shorter one.
    """
    rows, tail = divmod(a.size, DOT_ROW)
    total = 0.0
    if rows:
        head = rows * DOT_ROW
        lhs, rhs = a[:head].reshape(rows, 1, DOT_ROW), b[:head].reshape(rows, DOT_ROW, 1)
        total = float(np.add.reduce(np.matmul(lhs, rhs), axis=None))
    if tail:
        total += float(np.dot(a[a.size - tail:], b[b.size - tail:]))
    return total


def _series_terms(z_max: float) -> int:
    """Terms of atanh(s) = s·Σ z^k/(2k+1), z = s², that keep z <= z_max within half a float64 ulp.

    The remainder after k terms is below z^k/((2k+1)(1 − z)) relative: the
    rounding of one float64 operation (see `_SERIES_LIMITS`).
    """
    return next((k for k, limit in enumerate(_SERIES_LIMITS, 1) if z_max <= limit), len(_SERIES_LIMITS))


def _atanh_sum(u: np.ndarray, s: np.ndarray, z: np.ndarray, q: np.ndarray, terms: int) -> float:
    """Σu·atanh(s) = Σu·s·(1 + z/3 + z²/5 + ...), z = s², to ``terms`` terms (Horner); overwrites u and q."""
    np.multiply(u, s, out=u)
    if terms <= 1:
        return float(np.add.reduce(u))
    np.multiply(z, 1.0 / (2 * terms - 1), out=q)
    for k in range(terms - 2, -1, -1):
        np.add(q, 1.0 / (2 * k + 1), out=q)
        if k:
            np.multiply(q, z, out=q)
    return row_dot(u, q)


def _u_log_ratio(u: np.ndarray, v: np.ndarray, out: np.ndarray | None = None) -> float:
    """Σu·log(u/v) with numpy's float64 log."""
    ratio = np.divide(u, v, out=out)
    np.log(ratio, out=ratio)
    return row_dot(u, ratio)


def finite_range(values: np.ndarray) -> tuple[float, float]:
    """(min, max) over the finite values; (nan, nan) when there are none."""
    values = np.asarray(values)
    if values.size and not np.issubdtype(values.dtype, np.floating):
        return float(values.min()), float(values.max())
    finite = values[np.isfinite(values)] if values.size else values
    if finite.size == 0:
        return math.nan, math.nan
    return float(finite.min()), float(finite.max())


class PairAccumulator:
    """Float64 sums over one tensor pair, fed chunk by chunk; `result` gives the metrics.

    ``target_range`` and ``golden_range`` are each side's (min, max) over its
    finite values, needed before the pass for KL's min-max normalisation; the
    comparator takes them from the dump's statistics. ``rel_floor``: golden
    elements with |y| at or below it are left out of the relative errors.
    ``check_finite=False`` skips the NaN/inf screen when statistics show both
    sides are finite.
    """

    def __init__(self, target_range: tuple[float, float], golden_range: tuple[float, float],
                 rel_floor: float = FLOAT64_EPS, check_finite: bool = True):
        self.rel_floor = float(rel_floor)
        self.check_finite = check_finite
        self._x_lo, self._x_floor = kl_shift(*target_range)
        self._y_lo, self._y_floor = kl_shift(*golden_range)
        self.count = self.rel_count = 0
        self.nonfinite_pairs = self.target_only_nonfinite = 0
        self.sxy = self.sxx = self.syy = self.sdd = 0.0
        self.sum_abs = self.max_abs = self.sum_rel = self.max_rel = 0.0
        self.kl_s = self.kl_u = self.kl_v = 0.0
        self._kl_logs = False  # set once a block of this pair needed logs throughout: the next ones will too
        self._buffers: np.ndarray | None = None
        self._sums = np.zeros(_N_SUMS) if _kernel is not None else None  # the C kernel's running sums
        self._kernel_args = (self._x_lo, self._x_floor, self._y_lo, self._y_floor, self.rel_floor)

    def update(self, target: np.ndarray, golden: np.ndarray) -> None:
        """Add one chunk of each side; the chunks hold the same elements of the pair."""
        x, y = np.ravel(target), np.ravel(golden)
        if x.size != y.size:
            raise ValueError(f"chunk sizes differ: {x.size} vs {y.size}")
        if self._sums is not None:
            self._kernel_update(x, y)
            return
        if self.check_finite and (np.issubdtype(x.dtype, np.inexact) or np.issubdtype(y.dtype, np.inexact)):
            x, y = self._finite_pairs(x, y)
        self._numpy_update(x, y)

    def _numpy_update(self, x: np.ndarray, y: np.ndarray) -> None:
        for start in range(0, x.size, BLOCK_ELEMENTS):
            self._block(x[start:start + BLOCK_ELEMENTS], y[start:start + BLOCK_ELEMENTS])

    def _kernel_update(self, x: np.ndarray, y: np.ndarray) -> None:
        """One chunk through the C kernel.

        The kernel refuses a chunk holding NaN or inf (its sums would not be
        finite): the chunk is screened and retried. One it still refuses has
        float64 values so large that Σx² overflows, and goes the numpy way.
        """
        x, y = _kernel_operand(x), _kernel_operand(y)
        if _kernel.pair_sums(x, y, self._sums, *self._kernel_args):
            x, y = self._finite_pairs(x, y)
            if _kernel.pair_sums(x, y, self._sums, *self._kernel_args):
                self._numpy_update(x, y)

    def _fold_kernel_sums(self) -> None:
        """Move the C kernel's sums into the attributes `result` reads."""
        if self._sums is None or not self._sums[_COUNT]:
            return
        sums = self._sums.tolist()  # Python floats: the metrics hold no numpy scalars
        self.count += int(sums[_COUNT])
        self.rel_count += int(sums[_REL_COUNT])
        self.sxy += sums[_XY]
        self.sxx += sums[_XX]
        self.syy += sums[_YY]
        self.sdd += sums[_DD]
        self.sum_abs += sums[_ABS]
        self.max_abs = max(self.max_abs, sums[_MAX_ABS])
        self.sum_rel += sums[_REL]
        self.max_rel = max(self.max_rel, sums[_MAX_REL])
        self.kl_u += sums[_KL_U]
        self.kl_v += sums[_KL_V]
        self.kl_s += sums[_KL_S]
        self._sums[:] = 0.0

    def _finite_pairs(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x_ok, y_ok = np.isfinite(x), np.isfinite(y)
        both = x_ok & y_ok
        kept = int(np.count_nonzero(both))
        if kept == x.size:
            return x, y
        self.nonfinite_pairs += x.size - kept
        # the target non-finite where golden holds something else: a finite value, the other infinity, NaN for inf
        with np.errstate(invalid="ignore"):
            same = (x == y) | (np.isnan(x) & np.isnan(y))
        self.target_only_nonfinite += int(np.count_nonzero(~x_ok & ~same))
        return x[both], y[both]

    def _scratch(self, size: int) -> tuple[np.ndarray, ...]:
        """Five float64 block buffers, allocated once per pair (no temporaries in the block loop)."""
        if self._buffers is None or self._buffers.shape[1] < size:
            self._buffers = np.empty((5, size))
        return tuple(row[:size] for row in self._buffers)

    def _block(self, x: np.ndarray, y: np.ndarray) -> None:
        a, b, d, t, e = self._scratch(x.size)
        np.copyto(a, x, casting="unsafe")
        np.copyto(b, y, casting="unsafe")
        self.count += x.size
        self.sxy += row_dot(a, b)
        self.sxx += row_dot(a, a)
        self.syy += row_dot(b, b)
        np.subtract(a, b, out=d)
        self.sdd += row_dot(d, d)
        np.abs(d, out=d)
        self.sum_abs += float(np.add.reduce(d))
        block_max = float(d.max())
        self.max_abs = max(self.max_abs, block_max)
        if block_max == 0.0:
            self._equal_block(a, b, t, d, e)
            return
        self._relative(b, d, t)
        self._kl(a, b, d, t, e)

    def _equal_block(self, a: np.ndarray, b: np.ndarray, t: np.ndarray, d: np.ndarray, e: np.ndarray) -> None:
        """A block where x == y everywhere: every error is 0, only the counts and KL sums move."""
        np.abs(b, out=t)
        self.rel_count += t.size - self._at_floor(t)
        if self._x_lo == self._y_lo and self._x_floor == self._y_floor:
            u = self._kl_shifted(a, self._x_lo, self._x_floor)
            self.kl_u += u  # u == v: every log(u/v) is 0
            self.kl_v += u
        else:
            self._kl(a, b, d, t, e)

    def _at_floor(self, abs_y: np.ndarray) -> int:
        """How many |y| are at or below the floor; those become +inf, so dividing by them gives 0."""
        if float(abs_y.min()) > self.rel_floor:
            return 0
        small = abs_y <= self.rel_floor
        np.copyto(abs_y, np.inf, where=small)
        return int(np.count_nonzero(small))

    def _relative(self, b: np.ndarray, abs_diff: np.ndarray, t: np.ndarray) -> None:
        """|x−y|/|y| over |y| > rel_floor."""
        np.abs(b, out=t)
        self.rel_count += t.size - self._at_floor(t)
        np.divide(abs_diff, t, out=t)
        self.sum_rel += float(np.add.reduce(t))
        self.max_rel = max(self.max_rel, float(t.max()))

    @staticmethod
    def _kl_shifted(values: np.ndarray, lo: float, floor: float) -> float:
        """values <- max(values − lo, floor) in place (see `kl_shift`); returns their sum."""
        if lo:
            np.subtract(values, lo, out=values)  # exact for float32 values: lo is one of them
        if float(values.min()) < floor:  # only blocks holding values near the minimum: a min is cheaper
            np.maximum(values, floor, out=values)
        return float(np.add.reduce(values))

    def _kl(self, a: np.ndarray, b: np.ndarray, num: np.ndarray, den: np.ndarray, s: np.ndarray) -> None:
        """Σu·log(u/v), Σu and Σv of one block (see `kl_shift` and `kl_divergence`); a, b become u, v."""
        self.kl_u += self._kl_shifted(a, self._x_lo, self._x_floor)
        self.kl_v += self._kl_shifted(b, self._y_lo, self._y_floor)
        if self._kl_logs or not self._kl_series(a, b, num, den, s):
            self._kl_logs = True  # the next blocks of this pair would most likely fail the series too
            self.kl_s += _u_log_ratio(a, b, num)

    def _kl_series(self, u: np.ndarray, v: np.ndarray, num: np.ndarray, den: np.ndarray, s: np.ndarray) -> bool:
        """Add Σu·log(u/v) as Σu·2·atanh(s), s = (u − v)/(u + v); False, adding nothing, when too many |s| are large.

        Where the sides agree, |s| is about |x − y| / 2|x − min|: a few terms of
        the atanh series (`_series_terms`) then replace numpy's float64 log,
        which is scalar (~5 ns a value). The few |s| > SERIES_MAX, typically
        next to either side's minimum, take the log.
        """
        np.subtract(u, v, out=num)
        np.add(u, v, out=den)
        np.divide(num, den, out=s)
        z = np.multiply(s, s, out=num)
        z_max = float(z.max())
        if z_max > SERIES_MAX ** 2:
            outliers = np.flatnonzero(z > SERIES_MAX ** 2)
            if outliers.size * DIRECT_SHARE > s.size:
                return False
            self.kl_s += _u_log_ratio(u[outliers], v[outliers])
            s[outliers] = z[outliers] = 0.0
            z_max = SERIES_MAX ** 2
        self.kl_s += 2.0 * _atanh_sum(u, s, z, den, _series_terms(z_max))
        return True

    def result(self) -> TensorMetrics:
        """The metrics of everything added so far."""
        self._fold_kernel_sums()
        return metrics_from_sums(self.count, self.rel_count, self.sxy, self.sxx, self.syy, self.sdd, self.sum_abs,
                                 self.max_abs, self.sum_rel, self.max_rel, self.kl_s, self.kl_u, self.kl_v,
                                 self.nonfinite_pairs, self.target_only_nonfinite)


def metrics_from_sums(n: int, rel_count: int, sxy: float, sxx: float, syy: float, sdd: float, sum_abs: float,
                      max_abs: float, sum_rel: float, max_rel: float, kl_s: float, kl_u: float, kl_v: float,
                      nonfinite_pairs: int = 0, target_only_nonfinite: int = 0) -> TensorMetrics:
    """The metrics of a pair from its float64 sums (`PairAccumulator`, or the batch of `compare.batch`)."""
    if n == 0:
        if nonfinite_pairs:  # no pair compared: an all-non-finite pair is unknown, an empty one matches
            nan = math.nan
            return TensorMetrics(0, nan, nan, nan, nan, nan, nan, nan, nan, nan,
                                 nonfinite_pairs, target_only_nonfinite, NO_FINITE_PAIRS)
        return TensorMetrics(0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    cosine, note = cosine_similarity(sxy, sxx, syy, identical=max_abs == 0.0)
    return TensorMetrics(
        n, cosine, max_abs, max_rel, sum_abs / n, sum_rel / rel_count if rel_count else 0.0, math.sqrt(sdd / n),
        relative_euclidean(sdd, syy), sum_rel, kl_divergence(kl_s, kl_u, kl_v), nonfinite_pairs,
        target_only_nonfinite, note)


def _kernel_operand(values: np.ndarray) -> np.ndarray:
    """``values`` as the C kernel takes them: contiguous float32 or float64 (fp16 and bf16 widen exactly)."""
    if values.dtype.kind == "f" and values.dtype.itemsize in (4, 8) and values.dtype.isnative:
        return np.ascontiguousarray(values)
    wide = np.float64 if values.dtype.kind in "iu" or values.dtype.itemsize > 8 else np.float32
    return np.ascontiguousarray(values, dtype=wide)


def compare_arrays(target: np.ndarray, golden: np.ndarray, rel_floor: float = FLOAT64_EPS,
                   chunk_elements: int = 1 << 22) -> TensorMetrics:
    """Every metric of one in-memory pair (same number of elements), streamed in chunks."""
    x, y = np.ravel(np.asarray(target)), np.ravel(np.asarray(golden))
    if x.size != y.size:
        raise ValueError(f"sizes differ: {x.size} vs {y.size}")
    accumulator = PairAccumulator(finite_range(x), finite_range(y), rel_floor)
    for start in range(0, x.size, chunk_elements):
        accumulator.update(x[start:start + chunk_elements], y[start:start + chunk_elements])
    return accumulator.result()
