"""A tensor pair's row, however it was scored: one by one (`comparator`) or in a batch (`batch`)."""

from __future__ import annotations

import math

from precision_tool.compare.judged import near_zero, not_data, not_read
from precision_tool.compare.matching import TensorPair
from precision_tool.compare.metrics import FLOAT64_EPS, TensorMetrics
from precision_tool.compare.report import TensorRow
from precision_tool.compare.stats import StatsDelta, ValueCounts, extra_nonfinite


def relative_error_floor(golden_dtype: str) -> float:
    """Golden |y| at or below this is left out of relative errors: float64 eps, or fp16's smallest normal."""
    from precision_tool.engine.formats import FORMATS

    fmt = FORMATS.get(golden_dtype)
    return max(FLOAT64_EPS, fmt.tiny) if fmt is not None else FLOAT64_EPS


def pair_row(pair: TensorPair, loss_scale: float = 1.0, metrics: TensorMetrics | None = None,
             stats: StatsDelta | None = None, problem: str = "") -> TensorRow:
    """A pair's row: with its metrics (values compared), its stats deltas (statistics only) or a problem.

    Built positionally: the batch builds one per pair of a dump (`precision_tool.compare.batch`).
    """
    t, g, op = pair.target, pair.golden, pair.target_op
    skip = not_data(t) or not_data(g)
    extra = 0
    if metrics is not None:
        extra = metrics.target_only_nonfinite
        if not skip and metrics.count:
            skip = near_zero(pair.golden_op, g, metrics.rmse * math.sqrt(metrics.count), t.dtype)
    elif stats is not None:
        extra = extra_nonfinite(t.stats, g.stats)
        skip = skip or not_read(t, g)
        if not skip and math.isfinite(t.stats.norm):  # the error is at most the two norms' sum
            skip = near_zero(pair.golden_op, g, t.stats.norm / loss_scale + g.stats.norm, t.dtype)
    return TensorRow(op.step, op.exec_index, op.name, op.type, op.direction, t.slot, pair.golden_op.name, g.slot,
                     t.dtype, g.dtype, tuple(t.shape), tuple(g.shape), metrics, stats,
                     ValueCounts.from_stats(t.stats), ValueCounts.from_stats(g.stats), extra, op.pass_name, problem,
                     skip, loss_scale)
