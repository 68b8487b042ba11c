"""Comparing two tensors through their statistics alone, for stats-mode dumps.

Without the values there is no cosine. What the statistics do prove:

* ``rel_norm_diff`` = |‖x‖ − ‖y‖| / ‖y‖ is a lower bound of the relative
  Euclidean distance ‖x − y‖ / ‖y‖ (triangle inequality); 0 when both norms
  are 0, inf when only the golden norm is.
* ``max_abs_err_bound`` = max(|Δmax|, |Δmin|, |Δmean|) is a lower bound of
  max|x − y|: if x_i is the target's maximum then x_i − y_i ≥ max x − max y,
  and likewise for the minimum and the mean; ``rel_err_bound`` is the same
  over the golden tensor's largest magnitude max(|min y|, |max y|).

A stats row is flagged when ``rel_norm_diff`` exceeds 1 − c (c the cosine
threshold: 0.02 for ``-c 0.98``), or when the target has more NaN or inf
values than the golden tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from precision_tool.dump.records import TensorStats


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class StatsDelta:
    """How two tensors' statistics differ."""

    abs_mean_diff: float
    abs_std_diff: float
    rel_norm_diff: float
    abs_max_diff: float
    abs_min_diff: float
    golden_magnitude: float = math.nan  # max(|min|, |max|) of the golden tensor

    @property
    def max_abs_err_bound(self) -> float:
        """A proven lower bound of max|x − y| (NaN when the statistics are NaN)."""
        return max(self.abs_max_diff, self.abs_min_diff, self.abs_mean_diff)

    @property
    def rel_err_bound(self) -> float:
        """`max_abs_err_bound` over the golden tensor's largest magnitude: 0 when both are 0, inf when only the
        golden magnitude is 0, NaN when unknown."""
        bound = self.max_abs_err_bound
        if self.golden_magnitude == 0.0:
            return 0.0 if bound == 0.0 else math.inf
        return bound / self.golden_magnitude


def relative_norm_difference(target_norm: float, golden_norm: float) -> float:
    """|‖x‖ − ‖y‖| / ‖y‖: 0 when both norms are 0, inf when only the golden one is."""
    diff = abs(target_norm - golden_norm)
    if golden_norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / golden_norm


def compare_stats(target: TensorStats, golden: TensorStats, loss_scale: float = 1.0) -> StatsDelta:
    """The differences between two tensors' statistics (over their finite values), ``loss_scale`` divided out of
    the target's first (a loss-scaled gradient: each statistic but the count scales with it)."""
    s = loss_scale
    return StatsDelta(
        abs_mean_diff=abs(target.mean / s - golden.mean),
        abs_std_diff=abs(target.std / s - golden.std),
        rel_norm_diff=relative_norm_difference(target.norm / s, golden.norm),
        abs_max_diff=abs(target.max / s - golden.max),
        abs_min_diff=abs(target.min / s - golden.min),
        golden_magnitude=max(abs(golden.min), abs(golden.max)),
    )


def extra_nonfinite(target: TensorStats, golden: TensorStats) -> int:
    """How many more NaN and inf values the target has than the golden tensor (0 or more)."""
    return max(0, target.nan - golden.nan) + max(0, target.inf - golden.inf)


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: see records.py
class ValueCounts:
    """NaN, inf and saturated (|v| == the dtype's max) counts of one side."""

    nan: int = 0
    inf: int = 0
    saturated: int = 0

    @classmethod
    def from_stats(cls, stats: TensorStats) -> "ValueCounts":
        if not (stats.nan or stats.inf or stats.saturated):
            return _NO_COUNTS  # most tensors: one shared instance
        return cls(stats.nan, stats.inf, stats.saturated)


_NO_COUNTS = ValueCounts()
