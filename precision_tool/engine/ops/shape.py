"""Data movement: Reshape, Transpose, Concat, Gather, and the explicit Cast.

Movement ops do no arithmetic: their inputs already hold values of the
compute format (the executor converted them), so outputs are returned
without a ``ctx.out`` pass, may be views of their inputs, and never raise
the float status themselves. Only a gradient that sums (Gather with
repeated indices) is rounded.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import CAST, MOVEMENT, register


@register("Reshape", category=MOVEMENT)
class Reshape:
    @staticmethod
    def forward(ctx, x, shape):
        ctx.save(x.shape)
        return x.reshape(tuple(int(n) for n in shape))

    @staticmethod
    def backward(ctx, dy, shape):
        (x_shape,) = ctx.saved
        return (dy.reshape(x_shape),)


@register("Transpose", category=MOVEMENT)
class Transpose:
    """Permute axes: output axis ``i`` is input axis ``perm[i]``."""

    @staticmethod
    def forward(ctx, x, perm):
        return x.transpose(tuple(int(p) for p in perm))

    @staticmethod
    def backward(ctx, dy, perm):
        return (dy.transpose(tuple(np.argsort(perm).tolist())),)


@register("Concat", category=MOVEMENT)
class Concat:
    """Join its inputs along ``axis``."""

    @staticmethod
    def forward(ctx, *values, axis=0):
        axis = int(axis)
        ctx.save([v.shape[axis] for v in values])
        return np.concatenate(values, axis=axis)

    @staticmethod
    def backward(ctx, dy, axis=0):
        (sizes,) = ctx.saved
        return tuple(np.split(dy, np.cumsum(sizes)[:-1].tolist(), axis=int(axis)))


@register("Gather", category=MOVEMENT)
class Gather:
    """``params[indices]``: rows picked by integer indices (an embedding lookup)."""

    @staticmethod
    def forward(ctx, params, indices):
        indices = np.asarray(indices).astype(np.intp, copy=False)
        ctx.save(params.shape, indices)
        return params[indices]

    @staticmethod
    def backward(ctx, dy):
        shape, indices = ctx.saved
        grad = np.zeros(shape, dtype=dy.dtype)
        np.add.at(grad, indices, dy)
        return ctx.out(grad), None


@register("Cast", category=CAST)
class Cast:
    """Round to the ``dtype`` attr (the compute and output format)."""

    @staticmethod
    def forward(ctx, x, dtype):
        # the executor already converted x to the target; this also covers a direct call
        return ctx.out(x)

    @staticmethod
    def backward(ctx, dy, dtype):
        # the executor re-rounds it into the input's format
        return (dy,)
