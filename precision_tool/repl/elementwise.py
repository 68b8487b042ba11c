"""`cp`'s element-wise comparison of two arrays, vectorised (no per-element loop)."""

from __future__ import annotations

import numpy as np

from precision_tool.compare.metrics import compare_arrays as pair_metrics
from precision_tool.commands.results import Mismatch, TensorComparison


def compare_arrays(left: np.ndarray, right: np.ndarray, *, left_label: str, right_label: str,
                   atol: float, rtol: float, show: int) -> TensorComparison:
    """Compare ``left`` against the reference ``right`` with the allclose rule.

    An element mismatches when ``|left - right| > atol + rtol * |right|`` or
    when only one side is NaN. The cosine is the comparator's (pairs finite on
    both sides). Arrays of different sizes are reported, never padded.
    """
    result = TensorComparison(left=left_label, right=right_label, left_shape=tuple(left.shape),
                              right_shape=tuple(right.shape), atol=atol, rtol=rtol)
    if left.size != right.size:
        result.notes.append(f"sizes differ: {left.size} vs {right.size} elements; not compared")
        return result
    if left.shape != right.shape:
        result.notes.append(f"shapes differ: {tuple(left.shape)} vs {tuple(right.shape)}; compared flat")
    flat_left = np.asarray(left, dtype=np.float64).ravel()
    flat_right = np.asarray(right, dtype=np.float64).ravel()
    close = np.isclose(flat_left, flat_right, rtol=rtol, atol=atol, equal_nan=True)
    bad = np.flatnonzero(~close)
    result.count = int(flat_left.size)
    result.mismatched = int(bad.size)
    result.allclose = bad.size == 0
    metrics = pair_metrics(flat_left, flat_right)  # the comparator's cosine, so `cp` and `vcs` agree
    result.cosine = metrics.cosine
    if metrics.note:
        result.notes.append(f"cosine: {metrics.note}")
    if metrics.nonfinite_pairs:
        result.notes.append(f"{metrics.nonfinite_pairs} element pairs hold inf or NaN; left out of the cosine")
    result.error_ratio = bad.size / flat_left.size if flat_left.size else 0.0
    result.mismatches = _first_mismatches(flat_left, flat_right, bad[:show], left.shape)
    return result


def _first_mismatches(left: np.ndarray, right: np.ndarray, flat_index: np.ndarray, shape) -> list[Mismatch]:
    if flat_index.size == 0:
        return []
    index = np.unravel_index(flat_index, shape) if len(shape) > 1 else (flat_index,)
    coords = np.stack(index, axis=1).tolist()
    lefts, rights = left[flat_index].tolist(), right[flat_index].tolist()
    with np.errstate(invalid="ignore", over="ignore"):
        diffs = (left[flat_index] - right[flat_index]).tolist()
    return [Mismatch(tuple(c), lv, rv, dv) for c, lv, rv, dv in zip(coords, lefts, rights, diffs)]
