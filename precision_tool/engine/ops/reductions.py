"""Reductions: ReduceSum, ReduceMean (black list) and ReduceMax.

Sums accumulate in the container dtype (float32: numpy's pairwise sum) and
round once. ``axis`` is None (everything), an int or a sequence of ints.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import BLACK, register


def _axis(axis):
    """A numpy axis argument from an attr that may have been a list (attrs read back from a dump)."""
    if axis is None or isinstance(axis, (int, np.integer)):
        return None if axis is None else int(axis)
    return tuple(int(a) for a in axis)


def _keep_dims(dy: np.ndarray, axis, keepdims: bool) -> np.ndarray:
    """``dy`` with the reduced axes put back as length-1 axes."""
    if keepdims or axis is None:
        return dy
    return np.expand_dims(dy, axis)


def _spread(dy: np.ndarray, shape: tuple[int, ...], axis, keepdims: bool) -> np.ndarray:
    """A new array of ``shape`` holding ``dy`` broadcast over the reduced axes."""
    grad = np.empty(shape, dtype=dy.dtype)
    grad[...] = _keep_dims(dy, axis, keepdims)
    return grad


@register("ReduceSum", amp=BLACK)
class ReduceSum:
    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axis = _axis(axis)
        ctx.save(x.shape)
        return ctx.out(x.sum(axis=axis, dtype=ctx.dtype, keepdims=bool(keepdims)))

    @staticmethod
    def backward(ctx, dy, axis=None, keepdims=False):
        (shape,) = ctx.saved
        return (ctx.out(_spread(dy, shape, _axis(axis), bool(keepdims))),)


@register("ReduceMean", amp=BLACK)
class ReduceMean:
    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axis = _axis(axis)
        ctx.save(x.shape)
        return ctx.out(x.mean(axis=axis, dtype=ctx.dtype, keepdims=bool(keepdims)))

    @staticmethod
    def backward(ctx, dy, axis=None, keepdims=False):
        (shape,) = ctx.saved
        count = int(np.prod(shape)) // max(dy.size, 1)
        return (ctx.out(_spread(dy / count, shape, _axis(axis), bool(keepdims))),)


@register("ReduceMax")
class ReduceMax:
    """Maximum; the gradient is shared equally among tied maxima."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axis = _axis(axis)
        peak = x.max(axis=axis, keepdims=True)
        ctx.save(x, peak)
        return ctx.out(peak if keepdims else _drop_dims(peak, axis))

    @staticmethod
    def backward(ctx, dy, axis=None, keepdims=False):
        x, peak = ctx.saved
        axis = _axis(axis)
        at_max = x == peak
        ties = at_max.sum(axis=axis, keepdims=True, dtype=x.dtype)
        share = _keep_dims(dy, axis, bool(keepdims)) / ties
        return (ctx.out(np.where(at_max, share, 0).astype(x.dtype, copy=False)),)


def _drop_dims(peak: np.ndarray, axis) -> np.ndarray:
    return peak.reshape(()) if axis is None else np.squeeze(peak, axis=axis)
