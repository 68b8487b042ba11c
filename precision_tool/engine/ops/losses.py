"""Losses: SoftmaxCrossEntropy and MSELoss, both means, both on the black list."""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.activations import log_softmax
from precision_tool.engine.ops.base import BLACK, register, unbroadcast


@register("SoftmaxCrossEntropy", amp=BLACK)
class SoftmaxCrossEntropy:
    """Mean cross-entropy of ``logits`` (N, C) against integer ``labels`` (N,).

    Leading axes beyond N are allowed ((N, T, C) logits with (N, T) labels);
    the mean runs over every label.
    """

    @staticmethod
    def forward(ctx, logits, labels):
        logp = log_softmax(logits, -1)
        index = np.asarray(labels).astype(np.intp, copy=False)[..., None]
        ctx.save(logp, index)
        picked = np.take_along_axis(logp, index, axis=-1)
        return ctx.out(-picked.mean(dtype=ctx.dtype))

    @staticmethod
    def backward(ctx, dy):
        logp, index = ctx.saved
        grad = np.exp(logp)
        np.put_along_axis(grad, index, np.take_along_axis(grad, index, axis=-1) - 1, axis=-1)
        grad *= dy / index.size
        return ctx.out(grad), None


@register("MSELoss", amp=BLACK)
class MSELoss:
    """Mean of ``(prediction - target) ** 2`` over all elements."""

    @staticmethod
    def forward(ctx, prediction, target):
        diff = prediction - target
        ctx.save(diff, prediction.shape, target.shape)
        return ctx.out(np.mean(diff * diff, dtype=ctx.dtype))

    @staticmethod
    def backward(ctx, dy):
        diff, p_shape, t_shape = ctx.saved
        grad = diff * (2 * dy / diff.size)
        return ctx.out(unbroadcast(grad, p_shape)), ctx.out(unbroadcast(-grad, t_shape))
