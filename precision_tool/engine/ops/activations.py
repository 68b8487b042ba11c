"""Activations: Relu, Gelu, Tanh, Sigmoid, Softmax, LogSoftmax and Dropout.

Softmax and LogSoftmax are on the mixed-precision black list; the others
follow their inputs. Tanh, Sigmoid and the softmaxes differentiate from
their rounded output, as the framework gradient ops (TanhGrad, SoftmaxGrad)
do.
"""

from __future__ import annotations

import math

import numpy as np

from precision_tool.engine.ops.base import BLACK, register

_GELU_C = math.sqrt(2 / math.pi)  # a Python float: does not upcast float32 arrays
_GELU_A = 0.044715


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` after subtracting the maximum, unrounded."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Log-softmax along ``axis`` after subtracting the maximum, unrounded."""
    shifted = x - x.max(axis=axis, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return shifted


@register("Relu")
class Relu:
    @staticmethod
    def forward(ctx, x):
        ctx.save(x)
        return ctx.out(np.maximum(x, 0))

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        return (ctx.out(dy * (x > 0)),)


@register("Gelu")
class Gelu:
    """GELU, tanh approximation: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""

    @staticmethod
    def forward(ctx, x):
        t = np.tanh(_GELU_C * (x + _GELU_A * (x * x * x)))
        ctx.save(x, t)
        return ctx.out(0.5 * x * (1 + t))

    @staticmethod
    def backward(ctx, dy):
        x, t = ctx.saved
        inner = _GELU_C * (1 + 3 * _GELU_A * (x * x))
        return (ctx.out(dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * inner)),)


@register("Tanh")
class Tanh:
    @staticmethod
    def forward(ctx, x):
        y = ctx.out(np.tanh(x))
        ctx.save(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        return (ctx.out(dy * (1 - y * y)),)


@register("Sigmoid")
class Sigmoid:
    @staticmethod
    def forward(ctx, x):
        # exp(-x) = inf for very negative x gives 1 / inf = 0: the right limit
        y = ctx.out(1 / (1 + np.exp(-x)))
        ctx.save(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        return (ctx.out(dy * (y * (1 - y))),)


@register("Softmax", amp=BLACK)
class Softmax:
    """Softmax along ``axis``, subtracting the maximum first."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        y = ctx.out(softmax(x, int(axis)))
        ctx.save(y)
        return y

    @staticmethod
    def backward(ctx, dy, axis=-1):
        (y,) = ctx.saved
        dot = (dy * y).sum(axis=int(axis), keepdims=True)
        return (ctx.out((dy - dot) * y),)


@register("LogSoftmax", amp=BLACK)
class LogSoftmax:
    """Log-softmax along ``axis``, subtracting the maximum first."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        y = ctx.out(log_softmax(x, int(axis)))
        ctx.save(y)
        return y

    @staticmethod
    def backward(ctx, dy, axis=-1):
        (y,) = ctx.saved
        total = dy.sum(axis=int(axis), keepdims=True)
        return (ctx.out(dy - np.exp(y) * total),)


@register("Dropout")
class Dropout:
    """Inverted dropout: zero a ``rate`` fraction, scale the rest by ``1 / (1 - rate)``.

    The mask comes from ``ctx.rng()`` (run seed, step, op name) drawn in
    float32 whatever the compute dtype, so every device drops the same
    elements. ``rate >= 1`` drops everything.
    """

    @staticmethod
    def forward(ctx, x, rate):
        rate = float(rate)
        if rate <= 0:
            ctx.save(None, 1.0)
            return ctx.out(x)
        keep = ctx.rng().random(x.shape, dtype=np.float32) >= rate
        scale = 1 / (1 - rate) if rate < 1 else 0.0
        ctx.save(keep, scale)
        return ctx.out(np.where(keep, x * scale, 0).astype(x.dtype, copy=False))

    @staticmethod
    def backward(ctx, dy, rate):
        keep, scale = ctx.saved
        if keep is None:
            return (ctx.out(dy),)
        return (ctx.out(np.where(keep, dy * scale, 0).astype(dy.dtype, copy=False)),)
