"""Losses: SoftmaxCrossEntropy and MSELoss, averaged over the batch."""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import BLACK, register


def _log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@register("SoftmaxCrossEntropy", amp=BLACK)
class SoftmaxCrossEntropy:
    """Mean cross-entropy of ``logits`` (N, C) against integer ``labels`` (N,)."""

    @staticmethod
    def forward(ctx, logits, labels):
        logp = _log_softmax(logits)
        n = logits.shape[0]
        labels = labels.astype(np.int64)
        ctx.save(logp, labels)
        return ctx.out(-logp[np.arange(n), labels].mean(dtype=ctx.dtype))

    @staticmethod
    def backward(ctx, dy):
        logp, labels = ctx.saved
        n = logp.shape[0]
        grad = np.exp(logp)
        grad[np.arange(n), labels] -= 1
        return ctx.out(grad * (dy / n)), None
