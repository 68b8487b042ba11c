"""Which narrower format a float32 tensor's values were computed in: the grid they lie on.

A module call that casts its inputs to float16 (or bfloat16), computes, and casts its result back writes a float32
output whose every value float16 holds exactly. A float32 computation lands there by chance for one value in 2**13
(its 13 lowest mantissa bits all zero), bfloat16's grid for one in 2**16. So a target output that lies wholly on a
narrower grid, where golden's output of the same call does not, says which format the call computed in, which
nothing else in a module-level dump records (its ops are not recorded). `extremes_grid_of` and `grid_of` ask
it of a module call of a running scan.
"""

from __future__ import annotations

import numpy as np

from precision_tool.dump.records import OpRecord

NARROWER = ("bfloat16", "float16")  # coarsest first: a bfloat16 value inside float16's range is a float16 value too
_LEAST_VALUES = 64  # fewer nonzero values (a bias, a scalar) prove nothing: small integers lie on every grid
_GOLDEN_AT_MOST = 0.5  # golden's values on the grid at most this share of the time: its values are float32's


def on_grid(values: np.ndarray, fmt: str) -> float | None:
    """The share of ``values``' finite nonzero float32 values that ``fmt`` holds exactly, or None for fewer than
    _LEAST_VALUES of them (or values that are not float32)."""
    if values.dtype != np.float32:
        return None
    flat = values.ravel()
    flat = flat[np.isfinite(flat) & (flat != 0)]
    if flat.size < _LEAST_VALUES:
        return None
    return float(np.count_nonzero(_held(flat, fmt))) / flat.size


def narrower_grid(target: np.ndarray, golden: np.ndarray) -> str | None:
    """The narrower format (bfloat16, then float16) that holds every one of ``target``'s values exactly while
    golden's values mostly fall between its grid points, or None. Fewer values than that takes (a rotary
    embedding's 4 frequencies, a BatchNorm's 8 running variances) count where every one is golden's rounded to
    the format and some differ from golden's: a chance landing there has odds of 2**-13 a value."""
    for fmt in NARROWER:
        share, theirs = on_grid(target, fmt), on_grid(golden, fmt)
        if share == 1.0 and theirs is not None and theirs <= _GOLDEN_AT_MOST:
            return fmt
        if share is None and _rounded_golden(target, golden, fmt):
            return fmt
    return None


def _rounded_golden(target: np.ndarray, golden: np.ndarray, fmt: str) -> bool:
    """Whether the float32 ``target`` is golden's values rounded to ``fmt``, every one, and differs somewhere."""
    if target.dtype != np.float32 or golden.dtype != np.float32 or target.shape != golden.shape or not target.size:
        return False
    import ml_dtypes

    narrow = ml_dtypes.bfloat16 if fmt == "bfloat16" else np.float16
    with np.errstate(over="ignore"):
        rounded = golden.astype(narrow).astype(np.float32)
    finite = np.isfinite(golden)
    return bool(finite.all() and np.array_equal(target, rounded) and (target != golden).any())


def extremes_grid(target, golden) -> str | None:
    """From statistics (``TensorStats``): the narrower format holding the target tensor's smallest and largest
    values exactly, both nonzero, where golden's are not both held; None where that cannot tell. Two float32
    values land on float16's grid together by chance once in 2**26."""
    values = np.array([target.min, target.max], dtype=np.float64)
    theirs = np.array([golden.min, golden.max], dtype=np.float64)
    if not (np.isfinite(values).all() and np.isfinite(theirs).all()) or (values == 0).any() or \
            (values.astype(np.float32) != values).any() or (theirs.astype(np.float32) != theirs).any():
        return None
    for fmt in NARROWER:
        if _held(values.astype(np.float32), fmt).all() and not _held(theirs.astype(np.float32), fmt).all():
            return fmt
    return None


def _held(values: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "bfloat16":
        return (values.view(np.uint32) & np.uint32(0xFFFF)) == 0
    with np.errstate(over="ignore"):
        return values.astype(np.float16).astype(np.float32) == values


def extremes_grid_of(scan, holder: OpRecord, slot: str | None) -> str | None:
    """`extremes_grid` of ``holder``'s input ``slot``, or of its first float32 output whose extremes lie on
    one, from their statistics."""
    golden = scan._golden_of(holder)
    if golden is None:
        return None
    theirs = {t.slot: t for t in golden.tensors if t.stats.count}
    for t in holder.tensors:
        if (t.slot == slot if slot is not None else t.kind == "output") and t.dtype == "float32" and \
                t.stats.count and t.slot in theirs:
            fmt = extremes_grid(t.stats, theirs[t.slot].stats)
            if fmt is not None:
                return fmt
    return None


def grid_of(scan, holder: OpRecord, slot: str | None) -> str | None:
    """`narrower_grid` of ``holder``'s input ``slot``, or of its first float32 output lying on one."""
    golden = scan._golden_of(holder)
    if golden is None:
        return None
    theirs = {t.slot: t for t in golden.tensors if t.has_data}
    for t in holder.tensors:
        if (t.slot == slot if slot is not None else t.kind == "output") and t.dtype == "float32" and \
                t.has_data and t.slot in theirs and theirs[t.slot].shape == t.shape:
            fmt = narrower_grid(scan.target.tensor(holder.step, holder.exec_index, t.slot),
                                scan.golden.tensor(golden.step, golden.exec_index, t.slot))
            if fmt is not None:
                return fmt
    return None
