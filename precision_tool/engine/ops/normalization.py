"""Normalization: training-mode BatchNorm and LayerNorm, both on the black list.

Both use the biased variance and ``(x - mean) / sqrt(var + eps)``; BatchNorm
keeps no running statistics.
"""

from __future__ import annotations

import numpy as np

from precision_tool.engine.ops.base import BLACK, register


def normalize(x: np.ndarray, axes, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` and the inverse deviation (kept dims)."""
    centered = x - x.mean(axis=axes, keepdims=True)
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt(var + float(eps))
    centered *= inv_std
    return centered, inv_std


def normalize_grad(dxhat: np.ndarray, xhat: np.ndarray, inv_std: np.ndarray, axes) -> np.ndarray:
    """The gradient through `normalize` given the gradient of its output."""
    mean_d = dxhat.mean(axis=axes, keepdims=True)
    mean_dx = (dxhat * xhat).mean(axis=axes, keepdims=True)
    return (dxhat - mean_d - xhat * mean_dx) * inv_std


def _batch_axes(ndim: int) -> tuple[int, ...]:
    return (0, *range(2, ndim))


@register("BatchNorm", amp=BLACK)
class BatchNorm:
    """Batch statistics over every axis but the channel axis 1 (N, H, W of NCHW; N of (N, C))."""

    @staticmethod
    def forward(ctx, x, gamma, beta, eps=1e-5):
        axes = _batch_axes(x.ndim)
        channel = (-1,) + (1,) * (x.ndim - 2)
        xhat, inv_std = normalize(x, axes, eps)
        gamma_b = gamma.reshape(channel)
        ctx.save(xhat, inv_std, gamma_b)
        return ctx.out(gamma_b * xhat + beta.reshape(channel))

    @staticmethod
    def backward(ctx, dy, eps=1e-5):
        xhat, inv_std, gamma_b = ctx.saved
        axes = _batch_axes(xhat.ndim)
        dx = normalize_grad(dy * gamma_b, xhat, inv_std, axes)
        return ctx.out(dx), ctx.out((dy * xhat).sum(axis=axes)), ctx.out(dy.sum(axis=axes))


@register("LayerNorm", amp=BLACK)
class LayerNorm:
    """Statistics over the last axis; ``gamma`` and ``beta`` have its length."""

    @staticmethod
    def forward(ctx, x, gamma, beta, eps=1e-5):
        xhat, inv_std = normalize(x, -1, eps)
        ctx.save(xhat, inv_std, gamma)
        return ctx.out(gamma * xhat + beta)

    @staticmethod
    def backward(ctx, dy, eps=1e-5):
        xhat, inv_std, gamma = ctx.saved
        dx = normalize_grad(dy * gamma, xhat, inv_std, -1)
        lead = tuple(range(xhat.ndim - 1))
        return ctx.out(dx), ctx.out((dy * xhat).sum(axis=lead)), ctx.out(dy.sum(axis=lead))
