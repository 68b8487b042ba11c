"""How far a target tensor is from golden, apart from what the target's format could never hold.

Three kinds of position are told apart before any error is measured:

* **shared**: golden holds inf or NaN there and the target holds the same
  (or, in saturation mode, its format's extreme of the same sign, or 0 for
  NaN). A causal mask of ``-inf`` is the computation, not an error.
* **overflowed**: golden holds a finite value that the target's format cannot
  hold (|golden| beyond its max), or golden is finite and the target is not. These are the values an
  overflow changed; they are counted, not scored.
* everything else is scored: the relative L2 error ``||t - g|| / ||g||``.

A NaN the target holds where golden is finite is counted apart too
(``new_nan``): from finite inputs that is an invalid operation (sqrt or log
of a negative number, 0/0), not an overflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from precision_tool import native
from precision_tool.analysis.replay import is_float
from precision_tool.compare.metrics import row_dot
from precision_tool.defaults import SIGNIFICANT_ERROR
from precision_tool.dump.records import OpRecord, TensorStats
from precision_tool.engine.formats import FORMATS


@dataclass(frozen=True)
class ErrorSplit:
    """The scored error of one tensor pair and the positions left out of it."""

    error: float  # relative L2 over the scored positions; inf when shapes differ
    overflowed: int = 0  # golden finite, target could not hold it
    new_nan: int = 0  # target NaN where golden is finite
    shared: int = 0  # golden non-finite, target the same
    size: int = 0

    @property
    def overflow(self) -> bool:
        return self.overflowed > 0


MISMATCH = ErrorSplit(math.inf)


def format_limit(dtype: str) -> float:
    """The largest finite value of ``dtype`` (inf for float64 and non-float dtypes)."""
    fmt = FORMATS.get(dtype)
    return fmt.max if fmt is not None and fmt.bits < 64 else math.inf


def split_error(target, golden, target_dtype: str, scale: float = 1.0, summed: bool = False) -> ErrorSplit:
    """Score ``target`` against ``golden`` (multiplied by ``scale`` first: a loss scale the target ran with); where
    one's shape broadcasts to the other's (the same rows repeated over a batch), against the other broadcast, or,
    ``summed`` (a gradient), also against the larger summed over the copies (the gradient of a broadcast value is
    its copies' gradients summed; autograd sums where one run broadcast): the closer of the two."""
    t, g = np.ravel(target), np.ravel(golden)
    if t.size != g.size:
        if summed:
            t2, g2 = summed_pair(np.asarray(target), np.asarray(golden))
            if t2.size == g2.size != t.size:
                return min(split_error(target, golden, target_dtype, scale),
                           split_error(t2, g2, target_dtype, scale), key=lambda e: e.error)
        t, g = (np.ravel(x) for x in broadcast_pair(np.asarray(target), np.asarray(golden)))
    if t.size != g.size:
        return MISMATCH
    if scale != 1.0:
        g = g * np.float64(scale)
    if _all_finite(t) and _all_finite(g):  # the common case, without a mask: a few passes, no copies but one
        limit = format_limit(target_dtype)
        if limit == math.inf or not g.size or max(float(g.max()), -float(g.min())) <= min(limit, _NARROW_EXTREME):
            return ErrorSplit(_relative(t, g), size=t.size)
    t = np.asarray(t, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    g_finite = np.isfinite(g)
    t_finite = np.isfinite(t)
    limit = format_limit(target_dtype)
    with np.errstate(invalid="ignore"):
        same_sign = np.sign(t) == np.sign(g)
        at_limit = np.abs(t) >= limit
        shared = ~g_finite & ((np.isnan(g) & (np.isnan(t) | (t == 0))) | (np.isinf(g) & same_sign & at_limit))
        # a 16-bit format's extreme carried into a wider tensor where golden's is beyond it: a mask constant of
        # the model's own format (finfo(float16).min, a float16 model's; golden's is float32's), cast up
        shared |= g_finite & same_sign & ~at_limit & (np.abs(g) > np.abs(t)) & np.isin(np.abs(t), _EXTREMES_16)
        beyond = g_finite & (np.abs(g) > limit) & (at_limit | ~t_finite)  # (a finite value under the limit where
        # golden's is beyond it is no overflow of the target's: other values, from inputs that differ)
        new_nan = g_finite & np.isnan(t)
        overflowed = beyond | (g_finite & ~t_finite & ~new_nan)
    keep = ~(shared | overflowed | new_nan | ~g_finite)
    return ErrorSplit(_relative(t[keep], g[keep]), int(overflowed.sum()), int(new_nan.sum()), int(shared.sum()),
                      t.size)


_EXTREMES_16 = np.array([FORMATS[d].max for d in ("float16", "bfloat16")], dtype=np.float64)
_NARROW_EXTREME = float(_EXTREMES_16.min())  # golden's values beyond it are looked at one by one


def broadcast_pair(target: np.ndarray, golden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(target, golden), the one whose shape broadcasts to the other's along leading dimensions (a batch: the same
    rows repeated) broadcast to it; both as given otherwise (top-1 routing weights against golden's top-2 are
    other values, not repeated ones)."""
    copies = _copies(target.shape, golden.shape)
    if copies is None:
        return target, golden
    if copies[1]:
        return target, np.broadcast_to(golden, target.shape)
    return np.broadcast_to(target, golden.shape), golden


def summed_pair(target: np.ndarray, golden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(target, golden), the larger summed over the leading dimensions along which the other broadcasts to it, in
    float64; both as given otherwise."""
    copies = _copies(target.shape, golden.shape)
    if copies is None:
        return target, golden
    axes, target_larger = copies
    if target_larger:
        return np.sum(target, axis=axes, dtype=np.float64, keepdims=True), golden
    return target, np.sum(golden, axis=axes, dtype=np.float64, keepdims=True)


def _copies(target: tuple, golden: tuple) -> tuple[tuple[int, ...], bool] | None:
    """(the leading axes along which one shape broadcasts to the other, whether the target's is the larger), or
    None where neither broadcasts to the other along leading axes alone."""
    if target == golden or len(target) != len(golden):
        return None
    differ = tuple(i for i, (a, b) in enumerate(zip(target, golden)) if a != b)
    if differ != tuple(range(len(differ))):
        return None
    if all(golden[i] == 1 for i in differ):
        return differ, True
    if all(target[i] == 1 for i in differ):
        return differ, False
    return None


def repeated_stats(target_shape, target: TensorStats, golden_shape, golden: TensorStats) \
        -> tuple[TensorStats, TensorStats]:
    """(target, golden) statistics, the smaller tensor's as of its copies broadcast to the other's shape along
    leading axes (`broadcast_pair`, from statistics: the counts times the copies, the norm times their root;
    extremes, mean and spread unchanged); both as given otherwise."""
    copies = _copies(tuple(target_shape), tuple(golden_shape))
    if copies is None or not target.count or not golden.count:
        return target, golden
    if copies[1]:
        return target, _repeated(golden, target.count // golden.count)
    return _repeated(target, golden.count // target.count), golden


def _repeated(stats: TensorStats, k: int) -> TensorStats:
    return replace(stats, count=stats.count * k, norm=stats.norm * math.sqrt(k), nan=stats.nan * k,
                   inf=stats.inf * k, saturated=stats.saturated * k)


def _all_finite(x: np.ndarray) -> bool:
    """No NaN or Inf in ``x``: its float64 sum is finite (a float32 sum cannot overflow float64)."""
    if x.dtype.kind != "f":
        return True
    if x.dtype.itemsize < 8:
        with np.errstate(invalid="ignore"):  # (inf + -inf: NaN, the answer, not a warning for the user)
            return math.isfinite(float(np.add.reduce(x, dtype=np.float64)))
    return bool(np.isfinite(x).all())


def _relative(t: np.ndarray, g: np.ndarray) -> float:
    """||t - g|| / ||g||, in float64, of finite arrays.

    The C extension takes both sums in one pass (`native`); numpy needs float64 copies and two dots,
    which go through `metrics.row_dot` so that OpenBLAS does not thread them (a stall of milliseconds a
    call on a busy two-core machine).
    """
    kernel = native.extension
    if kernel is not None and t.dtype.kind == "f" and g.dtype.kind == "f":
        dd, yy = kernel.diff_norms(_operand(t), _operand(g))
    else:
        d = np.subtract(t, g, dtype=np.float64)
        g = np.asarray(g, dtype=np.float64)
        dd, yy = row_dot(d, d), row_dot(g, g)
    diff = math.sqrt(dd)
    norm = math.sqrt(yy)
    if diff == 0.0:
        return 0.0
    return diff / norm if norm > 0.0 else math.inf


def _operand(values: np.ndarray) -> np.ndarray:
    """Contiguous float32 or float64, as the C extension reads them (float16 widens exactly)."""
    if values.dtype.itemsize in (4, 8) and values.dtype.isnative:
        return np.ascontiguousarray(values)
    return np.ascontiguousarray(values, dtype=np.float64 if values.dtype.itemsize > 8 else np.float32)


def rounding_error(golden, dtype: str) -> float:
    """The relative error of ``golden``'s values rounded to ``dtype`` (0 for float32 and wider, or no data)."""
    fmt = FORMATS.get(dtype)
    if golden is None or fmt is None or dtype in ("float32", "float64"):
        return 0.0
    values = np.asarray(golden, dtype=np.float64).astype(np.float32)
    rounded, _ = fmt.round(values)
    return split_error(rounded, values, dtype).error


def exact_cast(source: str, destination: str) -> bool:
    """Whether every value of ``source``'s format is one of ``destination``'s (float16 to float32: a cast that
    rounds nothing)."""
    a, b = FORMATS.get(source), FORMATS.get(destination)
    return a is not None and b is not None and b.eps <= a.eps and b.max >= a.max and \
        b.smallest_subnormal <= a.smallest_subnormal


def noise_floor(dtype: str) -> float:
    """Relative error below which a tensor in ``dtype`` is never judged: 16 units of its last place."""
    fmt = FORMATS.get(dtype)
    return 16 * fmt.unit_roundoff if fmt is not None else 16 * FORMATS["float32"].unit_roundoff


def coarsest_compute(records: list[OpRecord], dtype: str) -> str:
    """Of ``dtype`` and the formats ``records`` compute in, the one whose rounding is coarsest: what a module call's
    output can carry of its ops' rounding (a bfloat16 LSTM cell's, however wide the output it writes)."""
    known = [d for d in [dtype, *(r.compute_dtype for r in records)] if d in FORMATS]
    return max(known, key=lambda d: FORMATS[d].unit_roundoff, default=dtype)


def asks_for_infinity(value) -> bool:
    """Whether an op's recorded arguments hold an infinite number (a torch dump writes it ``{"float": "-inf"}``)."""
    if isinstance(value, dict):
        if set(value) == {"float"}:
            return str(value["float"]).lstrip("+-") in ("inf", "infinity")
        return any(asks_for_infinity(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(asks_for_infinity(v) for v in value)
    return isinstance(value, float) and math.isinf(value)


def asks_for_extreme(value, limit: float) -> bool:
    """Whether an op's recorded arguments hold a number of magnitude ``limit`` (its format's largest, as
    ``torch.finfo(dtype).min`` gives a mask value) or more, or an infinite one: values it writes at the
    format's limit are the model's constant, not an overflow."""
    if isinstance(value, dict):
        return asks_for_infinity(value) if set(value) == {"float"} else any(
            asks_for_extreme(v, limit) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(asks_for_extreme(v, limit) for v in value)
    return isinstance(value, float) and not math.isnan(value) and abs(value) >= limit


def overflows_here(record: OpRecord, a) -> bool:
    """Whether ``record`` (its `Attribution` ``a``) makes inf or NaN where golden holds finite values, from
    inputs within SIGNIFICANT_ERROR of golden's, or from inputs that rounding alone moved further, finite
    wherever golden's are (no op before overflowed: Adam's update in float16 dividing by a second moment and
    an eps rounded to 0). An input holding inf or NaN of its own points to an earlier op."""
    from precision_tool.defaults import SIGNIFICANT_ERROR

    return bool(a.overflowed or a.new_nan) and (a.inherited < SIGNIFICANT_ERROR or not (
        a.inputs_off or record.inherited_nonfinite))


def starts_nonfinite(record: OpRecord) -> bool | None:
    """From its statistics alone: False when ``record`` reaches +-max or inf on a side none of its inputs
    reaches (it overflowed), True when it makes NaN from inputs without NaN or inf, else None. An op that reads
    no float tensor (``scalar_tensor``, ``full``) writes a constant: finfo.min as a mask value, held exactly, is
    no overflow; only a constant its format turned into inf is, not one asked for as inf (the math attention's
    ``scalar_tensor(-inf)`` mask value)."""
    if not any(t.stats.count and t.dtype in FORMATS for t in record.inputs):
        if asks_for_infinity(record.attrs):
            return None
        return False if any(t.stats.count and t.dtype in FORMATS and t.stats.inf for t in record.outputs) else None

    def extremes(tensors):
        hi = lo = nan = False
        for t in tensors:
            s, limit = t.stats, format_limit(t.dtype)
            if not s.count or t.dtype not in FORMATS:
                continue
            hi |= bool(s.inf) or s.max >= limit
            lo |= bool(s.inf) or s.min <= -limit
            nan |= bool(s.nan)
        return hi, lo, nan

    in_hi, in_lo, in_nan = extremes(record.inputs)
    out_hi, out_lo, out_nan = extremes(record.outputs)
    limit = min((format_limit(t.dtype) for t in record.outputs if t.dtype in FORMATS), default=math.inf)
    if ((out_hi and not in_hi) or (out_lo and not in_lo)) and not asks_for_extreme(record.attrs, limit):
        return False  # (masked_fill(scores, mask, finfo.min) writes the mask value it was given)
    if out_nan and not (in_nan or in_hi or in_lo):
        return True
    return None


def stats_split(target: TensorStats, golden: TensorStats, target_dtype: str, scale: float = 1.0) -> ErrorSplit:
    """`split_error` from two tensors' statistics alone (stats-mode dumps keep no values).

    The error is a lower bound of ``||t - g|| / ||g||``, each term exact:
    the norms differ by at most ``||t - g||`` (triangle inequality); so do
    the largest and the smallest values; ``sqrt(n)`` times the means'
    difference is the difference's projection on the all-ones direction
    (Cauchy-Schwarz), and ``sqrt(n)`` times the standard deviations' is
    that of the centred values. A shift, a scale or a bias shows at its full
    size; rounding noise, whose positions statistics do not keep, shows at
    its second order. Where non-finite or beyond-format values differ, the
    finite values are not the same positions on both sides: they are
    counted as in `split_error` and not scored.
    """
    if target.count != golden.count:
        return MISMATCH
    if not target.count:
        return ErrorSplit(0.0)
    new_nan = max(0, target.nan - golden.nan)
    limit = format_limit(target_dtype)
    beyond = golden.count > golden.nan + golden.inf and max(abs(golden.max), abs(golden.min)) * scale > limit
    overflowed = max(0, target.inf - golden.inf) + (max(0, target.saturated - golden.saturated) if beyond else 0)
    if beyond and not overflowed:
        overflowed = 1  # golden holds a value the target's format cannot: at least that one
    if new_nan or overflowed or target.inf != golden.inf or target.nan != golden.nan:
        return ErrorSplit(0.0, overflowed, new_nan, min(target.inf, golden.inf) + min(target.nan, golden.nan),
                          target.count)
    finite = target.count - target.nan - target.inf
    if not finite:
        return ErrorSplit(0.0, shared=target.count, size=target.count)
    norm = golden.norm * scale
    root = math.sqrt(finite)
    gaps = (abs(target.norm - norm), root * abs(target.mean - golden.mean * scale),
            root * abs(target.std - golden.std * scale), abs(target.max - golden.max * scale),
            abs(target.min - golden.min * scale))
    gap = max(gaps)
    if not gap or not math.isfinite(gap):
        return ErrorSplit(0.0 if not gap else math.inf, size=target.count)
    return ErrorSplit(gap / norm if norm > 0.0 else math.inf, size=target.count)



SCALE_COHERENCE = 4.0  # a uniform scale leaves, divided out, at most 1/this of its departure from 1
_SCALE_VALUES = 16  # fewer values than this (a loss, a logit): any departure of theirs is some scale


def uniform_scale(target, golden, target_dtype: str) -> float | None:
    """r where the target tensor is golden's times r: r departs from 1 by SIGNIFICANT_ERROR or more, and the
    target is within 1/SCALE_COHERENCE of that departure, and within its dtype's noise floor, from golden's
    times r. ``target`` and ``golden`` are arrays, or TensorStats (then `stats_split` against golden's
    statistics times r measures what is left).

    Rounding moves values both ways, each by its own amount; a constant the code multiplies by (a dropout's
    1/(1-p) left out, a scaling applied twice, a variance summed for a mean) moves all of them by one factor, and
    with them the norm, the spread, both extremes and the mean. None for all-equal or non-finite values."""
    if isinstance(target, TensorStats):
        if target.count != golden.count or target.count < _SCALE_VALUES or target.nan or target.inf or \
                golden.nan or golden.inf or not golden.max > golden.min or not golden.norm > 0.0:
            return None
        r = target.norm / golden.norm
        left = stats_split(target, golden, target_dtype, r).error
    else:
        t, g = (np.asarray(x, dtype=np.float64).ravel() for x in (target, golden))
        if t.shape != g.shape or t.size < _SCALE_VALUES or not (_all_finite(t) and _all_finite(g)):
            return None
        norm = float(np.linalg.norm(g))
        if not norm > 0.0 or not g.max() > g.min():
            return None
        r = float(np.linalg.norm(t)) / norm
        left = float(np.linalg.norm(t - r * g)) / (r * norm) if r > 0.0 else math.inf
    departs = abs(r - 1.0)
    return r if math.isfinite(r) and departs >= SIGNIFICANT_ERROR and left * SCALE_COHERENCE <= departs and \
        left <= noise_floor(target_dtype) else None


HARM_DEPTH = 6  # readers followed from an overflow before it counts as absorbed
RUINED_DEPTH = 64  # ... where the step's loss is not finite and golden's is: a chain of inf or NaN to it is harm


def harm_depth(golden, target, step: int) -> int:
    """How many readers deep an overflow's inf or NaN is followed to find harm: `RUINED_DEPTH` at a step whose
    loss the target lost (not finite, golden's finite): statistics show no error where values are not finite,
    and only the chain of non-finite readers to the loss tells harm from an overflow the model absorbs."""
    losses = [next((s.loss for s in dump.steps() if s.step == step), math.nan) for dump in (golden, target)]
    return RUINED_DEPTH if math.isfinite(losses[0]) and not math.isfinite(losses[1]) else HARM_DEPTH


def stats_only(record: OpRecord) -> bool:
    """Whether ``record`` has float outputs with statistics but none with values (a stats-mode op)."""
    floats = [t for t in record.outputs if is_float(t.dtype)]
    return bool(floats) and not any(t.has_data for t in floats) and any(t.stats.count for t in floats)


_ADDITIVE = frozenset({"aten.add", "aten.add_", "aten.sub", "aten.sub_", "aten.rsub"})


def stats_sensitivity(record: OpRecord) -> float | None:
    """From statistics, how far rounding an additive op's inputs to its compute dtype moves its output: the unit
    roundoff times the inputs' summed root-mean-square over the output's (cancellation: ``E[x^2] - E[x]^2`` of
    values around 16 loses in float16 what that ratio says). None for other ops or without statistics."""
    if record.type not in _ADDITIVE or not stats_only(record):
        return None
    fmt = FORMATS.get(record.compute_dtype or "")
    rms = [t.stats.norm / t.stats.count ** 0.5 for t in record.inputs
           if is_float(t.dtype) and t.stats.count and t.stats.finite]
    out = [t.stats.norm / t.stats.count ** 0.5 for t in record.outputs if is_float(t.dtype) and t.stats.count]
    if fmt is None or not rms or not out or not out[0] > 0.0:
        return None
    return fmt.unit_roundoff * sum(rms) / out[0]


def differing_count(target, golden) -> tuple[int, int]:
    """(elements of ``target`` that differ from ``golden``, its size); a shape mismatch differs everywhere, but
    where one broadcasts to the other (position ids given as (batch, length), golden's (1, length))."""
    t, g = broadcast_pair(np.asarray(target), np.asarray(golden))
    t, g = np.ravel(t), np.ravel(g)
    if t.size != g.size:
        return max(t.size, g.size, 1), max(t.size, g.size, 1)
    return int(np.count_nonzero(t != g)), int(t.size)
