"""Statistics of a tensor on an accelerator, reduced where it lies.

On the CPU the C extension reads a tensor's memory in place
(`precision_tool.torch.tensors`). A CUDA tensor's values would otherwise
cross to the host whole, a copy of every activation, gradient and weight of
every op, to be summed there by numpy. Here the device sums them, in
float64 accumulators as the host path does, and four numbers cross:
sum, sum of squares, min and max, in one transfer (one synchronisation) per
tensor. Rarer cases take a second transfer: NaN or Inf among the values
(the statistics are then those of the finite values, with the counts, as
`precision_tool.dump.stats` gives them), a variance lost to cancellation
(taken again from the centred values) and values at the format's largest
finite one (counted as saturated).

The row matches `stats.stats_tuple` of the same values up to the order the
device adds them in: min, max and the counts exactly, the sums to about
1e-15 relative; golden and target are compared at 1e-6 and coarser.
"""

from __future__ import annotations

import math

import torch

from precision_tool.dump.stats import CANCELLATION
from precision_tool.engine.formats import FORMATS

_F64 = torch.float64
_LIMITS = {name: fmt.max for name, fmt in FORMATS.items()}
_EMPTY = (0, math.nan, math.nan, math.nan, math.nan, 0.0, 0, 0, 0)


def device_stats(values: torch.Tensor, dtype: str) -> tuple:
    """`stats.stats_tuple` of ``values`` (any device, any float dtype), computed by torch where they lie."""
    flat = values.detach().reshape(-1)
    count = flat.numel()
    if not count:
        return _EMPTY
    if not flat.is_floating_point():  # integers and booleans, as the host path takes them: float64
        flat = flat.to(_F64)
    low, high = torch.aminmax(flat)
    first = torch.stack([flat.sum(dtype=_F64), torch.linalg.vector_norm(flat, dtype=_F64) ** 2,
                         low.to(_F64), high.to(_F64)])
    total, squares, low, high = first.tolist()
    if not (math.isfinite(total) and math.isfinite(squares)):
        return _nonfinite(flat, count, dtype)
    mean = total / count
    variance = squares / count - mean * mean
    if variance < CANCELLATION * mean * mean:  # E[x^2] - mean^2 lost its digits: the centred values' instead
        variance = float(torch.square(flat.to(_F64) - mean).sum()) / count
    return (count, low, high, mean, math.sqrt(max(variance, 0.0)), math.sqrt(squares), 0, 0,
            _saturated(flat, low, high, dtype))


def _saturated(flat: torch.Tensor, low: float, high: float, dtype: str) -> int:
    limit = _LIMITS.get(dtype)
    if limit is None or not (high >= limit or -low >= limit):
        return 0
    return int(torch.count_nonzero(flat.abs() >= limit))


def _nonfinite(flat: torch.Tensor, count: int, dtype: str) -> tuple:
    """NaN or Inf among the values: the statistics of the finite ones, with the counts of the others."""
    nan = int(torch.isnan(flat).sum())
    inf = int(torch.isinf(flat).sum())
    finite = flat[torch.isfinite(flat)]
    base = device_stats(finite, dtype) if finite.numel() else _EMPTY
    return (count, *base[1:6], nan, inf, base[8])
